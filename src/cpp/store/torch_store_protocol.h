#pragma once

// The wire protocol of torch's TCPStore client (torch.distributed.TCPStore, is_master=False),
// as ringtree's TCPStore server speaks it, so that a torch program can use a store ringtree
// hosts (ringtree-run's, or rank 0's). Verified against torch 2.13's client.
//
// A byte stream of commands with no framing: each command is a u8 query type followed by its
// fields; every integer little-endian. Fields:
//   u8, u32, u64, i64   fixed size
//   string / value      u64 length, then that many bytes
//   key list            u64 count, then count x string
// The client sends kValidate first, then kPing. Keys arrive with the "/" the client puts
// before every key; the server drops it, so a key means the same to both protocols.
//
// Query        fields                          reply
//   kValidate    u32 kValidationMagic            (none)
//   kSet         key, value                      (none)
//   kCompareSet  key, expected, desired          value stored afterwards (or the current one)
//   kGet         key                             value (empty when missing: the client waits first)
//   kAdd         key, i64 delta                  i64 new value
//   kCheck       key list                        u8 kReady / kNotReady
//   kWait        key list                        u8 kStopWaiting once every key exists
//   kGetNumKeys                                  i64
//   kDeleteKey   key                             i64 number of keys deleted
//   kAppend      key, value                      (none)
//   kMultiGet    key list                        count x value
//   kMultiSet    u64 count, count x (key, value) (none)
//   kCancelWait                                  u8 kWaitCanceled (after kStopWaiting when the
//                                                wait was answered already)
//   kPing        u32 nonce                       u32 nonce
// Not served (the connection is closed): torch's queue commands.
//
// Commands may follow each other without waiting for replies (kSet has none); while a
// kWait is unanswered the client can only send kCancelWait, and a command that has a reply
// may only come once the previous reply has been read (the server closes a connection that
// breaks either rule). A kMultiGet reply is bounded at 4 GiB.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ringtree/store/store.h>

namespace ringtree::torch_store_protocol {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
};

constexpr uint8_t kReady = 0;          // kCheck: every key exists
constexpr uint8_t kNotReady = 1;       // kCheck: a key is missing
constexpr uint8_t kStopWaiting = 0;    // kWait answered
constexpr uint8_t kWaitCanceled = 1;   // kCancelWait answered

// One parsed command. keys and values are filled as the query has them (kMultiSet: the
// i-th value belongs to the i-th key; kCompareSet: values = {expected, desired}); number
// is kAdd's delta, kPing's nonce or kValidate's magic.
struct Command {
  Query query = Query::kValidate;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t number = 0;
};

enum class ParseResult { kComplete, kIncomplete, kMalformed };

struct Limits {
  uint64_t maxFieldBytes;  // longest key or value
  uint64_t maxKeys;        // longest key list
};

// Parses the command at the start of data[0, size). kComplete: *command is filled and
// *consumed is its length. kIncomplete: more bytes are needed (nothing is allocated for a
// field before all its bytes are there). kMalformed: *error says why (an unknown query,
// a length or count over the limits). Keys come back without their leading "/".
ParseResult parseCommand(const uint8_t* data, size_t size, const Limits& limits, Command* command,
                         size_t* consumed, std::string* error);

// Reply encoding: each appends to out.
void appendU8(Bytes& out, uint8_t v);
void appendU32(Bytes& out, uint32_t v);
void appendI64(Bytes& out, int64_t v);
void appendValue(Bytes& out, const Bytes& value);

// The query's name for logs ("WAIT"), or "unknown query".
const char* queryName(uint8_t code);

}  // namespace ringtree::torch_store_protocol
