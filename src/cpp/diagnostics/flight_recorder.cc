#include "diagnostics/flight_recorder.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <ctime>

#include <ringtree/types.h>

#include "common/cpu.h"
#include "common/process_identity.h"

namespace ringtree {

const char* callStateName(CallState state) {
  switch (state) {
    case CallState::kStarted: return "started";
    case CallState::kCompleted: return "completed";
    case CallState::kFailed: return "failed";
  }
  return "unknown";
}

namespace diagnostics {

namespace {

// Spins on an entry being rewritten before each further try also yields the core (the
// writer may be preempted in the middle of an entry).
constexpr int kSpinTries = 64;

// Seqlock words of an entry for call i: 4i+1 while its start is written, 4i+2 once
// started, 4i+3 while its end is written, 4i+4 once finished. Odd: being written. Every
// value names its call, so a reader also tells an entry that was reused for a later
// call, and the writer never needs to read the word.
constexpr uint64_t startingWord(uint64_t index) { return 4 * index + 1; }
constexpr uint64_t finishingWord(uint64_t index) { return 4 * index + 3; }
constexpr uint64_t indexOfWord(uint64_t word) { return (word - 1) / 4; }

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Seconds since the epoch with microsecond resolution.
std::string epochSeconds(std::chrono::system_clock::time_point time) {
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(time.time_since_epoch()).count();
  char text[40];
  std::snprintf(text, sizeof(text), "%" PRId64 ".%06" PRId64, us / 1000000, us % 1000000);
  return text;
}

std::string microseconds(std::chrono::nanoseconds duration) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.3f", static_cast<double>(duration.count()) / 1e3);
  return text;
}

// "12:00:00.123456" in local time.
std::string timeOfDay(std::chrono::system_clock::time_point time) {
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(time.time_since_epoch()).count();
  const time_t seconds = static_cast<time_t>(us / 1000000);
  tm local{};
  localtime_r(&seconds, &local);
  char text[40];
  std::snprintf(text, sizeof(text), "%02d:%02d:%02d.%06d", local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<int>(us % 1000000));
  return text;
}

std::string hostName() {
  const std::string name = localHostname();
  return name.empty() ? "?" : name;
}

}  // namespace

int64_t wallNsAt(int64_t steadyNs) {
  // Measured once per process, so that every read of a call converts it to the same
  // wall-clock time (a fresh offset per read differs by clock-read jitter).
  static const int64_t kWallMinusSteady =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      steadyNowNs();
  return steadyNs + kWallMinusSteady;
}

// One entry: one cache line. Every field is an atomic so that a reader racing the
// writer reads stale or new values, never undefined ones; the seqlock word tells it
// whether they belong together.
struct alignas(64) FlightRecorder::Slot {
  std::atomic<uint64_t> word;
  // The envelope in four words, as the node arena stores fingerprints: sequence, count,
  // operation | root << 32, dataType | reduceOp << 8 | state << 16.
  std::atomic<uint64_t> envelope[4];
  std::atomic<const CallFormat*> format;
  std::atomic<int64_t> startNs;
  std::atomic<int64_t> endNs;
};
static_assert(sizeof(std::atomic<const CallFormat*>) == 8 && sizeof(std::atomic<uint64_t>) == 8,
              "a slot is one cache line");

// Default-initialised slots (no stores: their pages stay untouched until used). A slot is
// read only once a call was written into it.
FlightRecorder::FlightRecorder(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)), slots_(new Slot[capacity_]) {}

FlightRecorder::~FlightRecorder() = default;

bool FlightRecorder::read(const Slot& slot, RecordedCall* call) const {
  for (int attempt = 0;; ++attempt) {
    const uint64_t before = slot.word.load(std::memory_order_acquire);
    if (indexOfWord(before) > call->index) return false;  // reused for a later call
    if ((before & 1) == 0) {
      uint64_t words[4];
      for (int i = 0; i < 4; ++i) words[i] = slot.envelope[i].load(std::memory_order_relaxed);
      const CallFormat* format = slot.format.load(std::memory_order_relaxed);
      const int64_t startNs = slot.startNs.load(std::memory_order_relaxed);
      const int64_t endNs = slot.endNs.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.word.load(std::memory_order_relaxed) == before) {
        if (indexOfWord(before) != call->index) return false;
        transport::Envelope& e = call->envelope;
        e = transport::Envelope{};
        e.sequence = words[0];
        e.count = words[1];
        e.operation = static_cast<uint16_t>(words[2]);
        e.root = static_cast<int32_t>(static_cast<uint32_t>(words[2] >> 32));
        e.dataType = static_cast<uint8_t>(words[3]);
        e.reduceOp = static_cast<uint8_t>(words[3] >> 8);
        call->state = static_cast<CallState>(static_cast<uint8_t>(words[3] >> 16));
        call->format = format;
        call->startNs = startNs;
        call->endNs = endNs;
        return true;
      }
    }
    cpuRelax();
    if (attempt >= kSpinTries) sched_yield();
  }
}

void FlightRecorder::started(const transport::Envelope& envelope, const CallFormat* format, int64_t nowNs) {
  const uint64_t index = calls_.load(std::memory_order_relaxed);
  currentIndex_ = index;
  currentSlot_ = index == 0 ? 0 : (currentSlot_ + 1 == capacity_ ? 0 : currentSlot_ + 1);  // index % capacity_
  currentTypeWord_ = uint64_t{envelope.dataType} | uint64_t{envelope.reduceOp} << 8;
  Slot& slot = slots_[currentSlot_];
  const uint64_t busy = startingWord(index);
  slot.word.store(busy, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.envelope[0].store(envelope.sequence, std::memory_order_relaxed);
  slot.envelope[1].store(envelope.count, std::memory_order_relaxed);
  slot.envelope[2].store(uint64_t{envelope.operation} | uint64_t{static_cast<uint32_t>(envelope.root)} << 32,
                         std::memory_order_relaxed);
  slot.envelope[3].store(currentTypeWord_ | uint64_t{static_cast<uint8_t>(CallState::kStarted)} << 16,
                         std::memory_order_relaxed);
  slot.format.store(format, std::memory_order_relaxed);
  slot.startNs.store(nowNs, std::memory_order_relaxed);
  slot.endNs.store(0, std::memory_order_relaxed);
  slot.word.store(busy + 1, std::memory_order_release);
  calls_.store(index + 1, std::memory_order_release);
}

void FlightRecorder::finished(CallState state, int64_t nowNs, const std::string& error) {
  if (state == CallState::kFailed) {
    std::lock_guard<std::mutex> lock(errorsMutex_);
    errors_[currentIndex_] = error;
    // Keep the texts of calls still in the ring only.
    const uint64_t calls = currentIndex_ + 1;
    if (calls > capacity_) errors_.erase(errors_.begin(), errors_.lower_bound(calls - capacity_));
  }
  Slot& slot = slots_[currentSlot_];
  const uint64_t busy = finishingWord(currentIndex_);
  slot.word.store(busy, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.envelope[3].store(currentTypeWord_ | uint64_t{static_cast<uint8_t>(state)} << 16, std::memory_order_relaxed);
  slot.endNs.store(nowNs, std::memory_order_relaxed);
  slot.word.store(busy + 1, std::memory_order_release);
}

uint64_t FlightRecorder::changes() const {
  const uint64_t calls = this->calls();
  // The seqlock word of the latest call moves at its start and at its end.
  return calls == 0 ? 0 : slots_[(calls - 1) % capacity_].word.load(std::memory_order_acquire);
}

std::vector<RecordedCall> FlightRecorder::snapshot(size_t limit) const {
  const uint64_t calls = this->calls();
  const uint64_t kept = std::min<uint64_t>({calls, capacity_, limit});
  std::vector<RecordedCall> result;
  result.reserve(kept);
  for (uint64_t index = calls - kept; index < calls; ++index) {
    RecordedCall call;
    call.index = index;
    if (read(slots_[index % capacity_], &call)) result.push_back(call);
  }
  return result;
}

std::string FlightRecorder::errorOf(uint64_t index) const {
  std::lock_guard<std::mutex> lock(errorsMutex_);
  const auto it = errors_.find(index);
  return it == errors_.end() ? std::string() : it->second;
}

FlightRecord FlightRecorder::toRecord(const RecordedCall& call) const {
  FlightRecord record;
  const transport::Envelope& e = call.envelope;
  record.sequence = e.sequence;
  record.collective = call.format->collective(e);
  record.algorithm = call.format->algorithm(e);
  record.dataType = e.dataType < kNumDataTypes ? dataTypeName(static_cast<DataType>(e.dataType)) : "?";
  record.count = e.count;
  record.root = e.root;
  record.reduceOp = e.reduceOp < kNumReduceOps ? reduceOpName(static_cast<ReduceOp>(e.reduceOp)) : "?";
  record.description = call.format->describe(e);
  record.state = call.state;
  if (call.state == CallState::kFailed) record.error = errorOf(call.index);
  using std::chrono::nanoseconds;
  using std::chrono::system_clock;
  record.startTime = system_clock::time_point(std::chrono::duration_cast<system_clock::duration>(
      nanoseconds(wallNsAt(call.startNs))));
  if (call.state == CallState::kStarted) {
    record.endTime = record.startTime;
  } else {
    record.duration = nanoseconds(call.endNs - call.startNs);
    record.endTime = record.startTime + std::chrono::duration_cast<system_clock::duration>(record.duration);
  }
  return record;
}

std::string flightRecordJson(const FlightRecordHeader& header, const std::vector<FlightRecord>& records) {
  std::string out = "{\"format\": \"ringtree-flight-recorder\", \"version\": 1";
  out += ", \"group\": " + jsonString(header.group);
  out += std::string(", \"world\": ") + (header.world ? "true" : "false");
  out += ", \"rank\": " + std::to_string(header.rank);
  out += ", \"group_rank\": " + std::to_string(header.groupRank);
  out += ", \"group_size\": " + std::to_string(header.groupSize);
  out += ", \"host\": " + jsonString(hostName());
  out += ", \"pid\": " + std::to_string(::getpid());
  out += ", \"reason\": " + jsonString(header.reason);
  out += ", \"written_at\": " + epochSeconds(std::chrono::system_clock::now());
  out += ", \"capacity\": " + std::to_string(header.capacity);
  out += ", \"calls\": " + std::to_string(header.calls);
  out += ", \"entries\": [";
  bool first = true;
  for (const FlightRecord& r : records) {
    out += first ? "\n" : ",\n";
    first = false;
    const bool started = r.state == CallState::kStarted;
    out += "  {\"seq\": " + std::to_string(r.sequence);
    out += ", \"collective\": " + jsonString(r.collective);
    out += ", \"algorithm\": " + jsonString(r.algorithm);
    out += ", \"dtype\": " + jsonString(r.dataType);
    out += ", \"count\": " + std::to_string(r.count);
    out += ", \"root\": " + std::to_string(r.root);
    out += ", \"op\": " + jsonString(r.reduceOp);
    out += ", \"description\": " + jsonString(r.description);
    out += ", \"state\": " + jsonString(callStateName(r.state));
    out += ", \"error\": " + (r.state == CallState::kFailed ? jsonString(r.error) : std::string("null"));
    out += ", \"start_time\": " + epochSeconds(r.startTime);
    out += ", \"end_time\": " + (started ? std::string("null") : epochSeconds(r.endTime));
    out += ", \"duration_us\": " + (started ? std::string("null") : microseconds(r.duration));
    out += "}";
  }
  return out + "]}\n";
}

std::string flightRecordLines(const std::vector<FlightRecord>& records) {
  std::string out;
  for (const FlightRecord& r : records) {
    out += "  " + r.description + " " + callStateName(r.state);
    if (r.state != CallState::kStarted) out += " in " + microseconds(r.duration) + " us";
    out += ", started at " + timeOfDay(r.startTime) + "\n";
  }
  return out;
}

}  // namespace diagnostics

}  // namespace ringtree
