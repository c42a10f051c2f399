#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Who a process is, precisely enough to tell later, from another process, whether it still
// runs: the host (name and kernel boot), the pid namespace, the pid and the pid's start
// time (which tells a reused pid apart). Used to recognise what a job that did not finish
// left behind (FileStore's registrations).
namespace ringtree {

struct ProcessIdentity {
  std::string hostname;
  // /proc/sys/kernel/random/boot_id: differs between hosts that share a name and changes
  // at every boot. Empty when unreadable.
  std::string bootId;
  // The inode of /proc/self/ns/pid: pids mean the same only within one pid namespace.
  // 0 when unreadable.
  uint64_t pidNamespace = 0;
  int64_t pid = 0;
  // Field 22 of /proc/PID/stat, clock ticks after boot. 0 when unreadable.
  uint64_t startTicks = 0;
  // Wall-clock time the identity was taken, ms since the Unix epoch.
  int64_t takenAtMs = 0;
};

// The calling process. Never throws: an unreadable part is left empty.
ProcessIdentity localProcessIdentity();

// This host's name and its kernel's boot id ("" when unreadable).
std::string localHostname();
std::string localBootId();

// One line of text, and back; decode returns false for anything encode did not make.
std::string encodeProcessIdentity(const ProcessIdentity& identity);
bool decodeProcessIdentity(const std::string& text, ProcessIdentity* identity);

enum class Liveness {
  kRunning,  // the process runs (same pid, same start time)
  kGone,     // provably ended: same host and pid namespace, and no such process now
  kUnknown,  // another host or pid namespace, or too little known to tell
};

// Whether a and b run on the same kernel: the same host name and boot id (a host name
// alone is shared by containers on several machines).
bool sameHost(const ProcessIdentity& a, const ProcessIdentity& b);

// Whether a and b name one process (one host, pid namespace, pid and start time).
bool sameProcess(const ProcessIdentity& a, const ProcessIdentity& b);

// Whether the process `identity` names still runs, as seen from the calling process.
Liveness livenessOf(const ProcessIdentity& identity);

// "host 'vm', pid 1234": how messages name the process.
std::string describeProcess(const ProcessIdentity& identity);

// "pid 1234 ('python train.py --lr 0.1', running for 35 s)": a process of this host and
// pid namespace, with what /proc tells of it (its command line, shortened, and how long
// it has run); "pid 1234" alone when /proc does not show it.
std::string describeLocalProcess(int64_t pid);

// The pids of the processes that hold a TCP socket listening on port (IPv4 or IPv6, any
// address), as far as /proc shows them to this process (the calling user's own processes,
// or all for root). Empty when none is visible.
std::vector<int64_t> processesListeningOn(uint16_t port);

}  // namespace ringtree
