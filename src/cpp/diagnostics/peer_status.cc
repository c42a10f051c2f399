#include "diagnostics/peer_status.h"

#include <cstdint>
#include <cstdio>
#include <utility>

#include "common/logging.h"
#include "common/text.h"

namespace ringtree::diagnostics {

namespace {

// Why a peer's status is unknown when its key is missing.
constexpr const char* kNoStatus =
    "it has not published its status yet: it has started no collective, has not published since, or cannot reach "
    "the store";

// At most this many ranks are described one by one in each class; the rest are counted.
constexpr size_t kMaxRanksDescribed = 8;

int64_t wallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string secondsText(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", seconds < 0 ? 0.0 : seconds);
  return text;
}

std::string rankList(const std::vector<const PeerProgress*>& peers) {
  std::vector<int> ranks;
  for (const PeerProgress* p : peers) ranks.push_back(p->rank);
  return text::rankList(ranks);
}

// What a peer that did not enter the call was last doing.
std::string whereItIs(const PeerProgress& p) {
  const std::string rank = "rank " + std::to_string(p.rank);
  // A rank publishes its first call at once and later ones at most every kPollInterval:
  // no call yet may only mean that it has not published one yet.
  if (p.startedSequence == 0) {
    return rank + " has not published its status yet (no collective started, or not published since)";
  }
  if (p.finishedSequence == p.startedSequence) {
    std::string text = rank + (p.finishedFailed ? " failed in " : " last completed ") + p.started;
    if (p.finishedSecondsAgo >= 0) text += " " + secondsText(p.finishedSecondsAgo) + " ago";
    return text;
  }
  std::string text = rank + " is still in " + p.started;
  if (p.startedSecondsAgo >= 0) text += ", entered " + secondsText(p.startedSecondsAgo) + " ago";
  return text;
}

// Describes up to kMaxRanksDescribed peers with `describe`, joined by "; ".
template <typename Describe>
std::string each(const std::vector<const PeerProgress*>& peers, Describe describe) {
  std::string text;
  for (size_t i = 0; i < peers.size() && i < kMaxRanksDescribed; ++i) {
    text += (i == 0 ? "" : "; ") + describe(*peers[i]);
  }
  if (peers.size() > kMaxRanksDescribed) text += "; and " + std::to_string(peers.size() - kMaxRanksDescribed) + " more";
  return text;
}

// "key=value" lines; returns the value of key or "".
std::string field(const std::string& text, const std::string& key) {
  const std::string prefix = key + "=";
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, prefix.size(), prefix) == 0) {
      return text.substr(start + prefix.size(), end - start - prefix.size());
    }
    start = end + 1;
  }
  return {};
}

PeerProgress unknownPeer(int rank, const std::string& reason) {
  PeerProgress p;
  p.rank = rank;
  p.unknownReason = reason;
  return p;
}

PeerProgress parseStatus(int rank, const std::string& text, int64_t nowNs) {
  int64_t startedSequence = 0, startedNs = 0, finishedSequence = 0, finishedFailed = 0, finishedNs = 0;
  const auto parse = [&](const char* key, int64_t* value) {
    return text::parseInteger(field(text, key), INT64_MIN, INT64_MAX, value);
  };
  if (!parse("started_seq", &startedSequence) || !parse("started_ns", &startedNs) ||
      !parse("finished_seq", &finishedSequence) || !parse("finished_failed", &finishedFailed) ||
      !parse("finished_ns", &finishedNs)) {
    return unknownPeer(rank, "its published status is malformed");
  }
  PeerProgress p;
  p.rank = rank;
  p.known = true;
  p.startedSequence = static_cast<uint64_t>(startedSequence);
  p.started = field(text, "started");
  p.startedSecondsAgo = startedSequence > 0 ? static_cast<double>(nowNs - startedNs) / 1e9 : -1;
  p.finishedSequence = static_cast<uint64_t>(finishedSequence);
  p.finishedFailed = finishedFailed != 0;
  p.finishedSecondsAgo = finishedSequence > 0 ? static_cast<double>(nowNs - finishedNs) / 1e9 : -1;
  return p;
}

}  // namespace

std::string describeProgress(uint64_t sequence, const std::string& callName, const std::vector<PeerProgress>& peers) {
  std::vector<const PeerProgress*> absent, inside, past, unknown;
  for (const PeerProgress& p : peers) {
    if (!p.known) {
      unknown.push_back(&p);
    } else if (p.startedSequence < sequence) {
      absent.push_back(&p);
    } else if (p.startedSequence == sequence && p.finishedSequence < sequence) {
      inside.push_back(&p);
    } else {
      past.push_back(&p);
    }
  }
  std::vector<std::string> sentences;
  if (!absent.empty()) {
    sentences.push_back(rankList(absent) + " did not enter " + callName + ": " + each(absent, whereItIs));
  } else if (!peers.empty() && unknown.empty()) {
    sentences.push_back("every rank entered " + callName);
  }
  if (!inside.empty()) {
    sentences.push_back(each(inside, [&](const PeerProgress& p) {
      std::string text = "rank " + std::to_string(p.rank) + " entered " + callName;
      if (p.startedSecondsAgo >= 0) text += " " + secondsText(p.startedSecondsAgo) + " ago";
      return text;
    }));
  }
  if (!past.empty()) {
    sentences.push_back(each(past, [&](const PeerProgress& p) {
      if (p.startedSequence == sequence) {
        return "rank " + std::to_string(p.rank) + (p.finishedFailed ? " failed in " : " completed ") + callName;
      }
      return "rank " + std::to_string(p.rank) + " is past " + callName + ", in " + p.started;
    }));
  }
  if (!unknown.empty()) {
    sentences.push_back(each(unknown, [](const PeerProgress& p) {
      return "rank " + std::to_string(p.rank) + ": status unknown (" + p.unknownReason + ")";
    }));
  }
  std::string text;
  for (const std::string& sentence : sentences) text += (text.empty() ? "" : ". ") + sentence;
  return text;
}

std::string statusKey(int rank) { return "rt/status/" + std::to_string(rank); }

StatusPublisher::StatusPublisher(std::shared_ptr<Store> store, int rank, int size, const FlightRecorder& recorder)
    : store_(std::move(store)), rank_(rank), size_(size), recorder_(recorder) {
  store_->setTimeout(kStoreTimeout);
  thread_ = std::thread([this] { run(); });
}

StatusPublisher::~StatusPublisher() { stop(); }

void StatusPublisher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  done_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  store_.reset();
}

std::vector<PeerProgress> StatusPublisher::readPeers(std::chrono::milliseconds budget) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::string failure;
  if (stopping_) {
    failure = "this rank no longer reads the store";
  } else {
    const uint64_t ticket = ++readsRequested_;
    wake_.notify_all();
    if (done_.wait_for(lock, budget, [&] { return readsDone_ >= ticket || stopping_; }) && readsDone_ >= ticket) {
      return lastRead_;
    }
    failure = "the store did not answer within " + std::to_string(budget.count()) + " ms";
  }
  std::vector<PeerProgress> peers;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) peers.push_back(unknownPeer(peer, failure));
  }
  return peers;
}

void StatusPublisher::run() {
  bool havePublished = false;
  uint64_t published = 0;  // recorder_.changes() at the last write
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (readsRequested_ != readsDone_) {
      const uint64_t ticket = readsRequested_;
      lock.unlock();
      std::vector<PeerProgress> peers = read();
      lock.lock();
      lastRead_ = std::move(peers);
      readsDone_ = ticket;
      done_.notify_all();
      continue;
    }
    const uint64_t changes = recorder_.changes();
    if (!havePublished || changes != published) {
      lock.unlock();
      try {
        publish();
      } catch (const std::exception& e) {
        // The store may be gone (its host exited); peers then learn nothing from it.
        RINGTREE_DEBUG("rank " << rank_ << ": cannot publish its status to the store: " << e.what());
      }
      lock.lock();
      havePublished = true;
      published = changes;
    }
    wake_.wait_for(lock, kPollInterval, [&] { return stopping_ || readsRequested_ != readsDone_; });
  }
}

void StatusPublisher::publish() {
  const std::vector<RecordedCall> latest = recorder_.snapshot(2);
  const RecordedCall* started = latest.empty() ? nullptr : &latest.back();
  const RecordedCall* finished = nullptr;
  if (started != nullptr && started->state != CallState::kStarted) {
    finished = started;
  } else if (latest.size() == 2) {
    finished = &latest.front();
  }
  std::string text;
  text += "started_seq=" + std::to_string(started ? started->envelope.sequence : 0) + "\n";
  text += "started_ns=" + std::to_string(started ? wallNsAt(started->startNs) : 0) + "\n";
  text += "started=" + (started ? recorder_.toRecord(*started).description : std::string()) + "\n";
  text += "finished_seq=" + std::to_string(finished ? finished->envelope.sequence : 0) + "\n";
  text += std::string("finished_failed=") + (finished && finished->state == CallState::kFailed ? "1" : "0") + "\n";
  text += "finished_ns=" + std::to_string(finished ? wallNsAt(finished->endNs) : 0) + "\n";
  store_->set(statusKey(rank_), toBytes(text));
}

std::vector<PeerProgress> StatusPublisher::read() {
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    keys.push_back(statusKey(peer));
    ranks.push_back(peer);
  }
  std::vector<PeerProgress> peers;
  try {
    std::vector<Bytes> values;
    if (store_->check(keys)) {
      values = store_->multiGet(keys);
    } else {
      for (const std::string& key : keys) values.push_back(store_->check({key}) ? store_->get(key) : Bytes());
    }
    const int64_t now = wallNowNs();
    for (size_t i = 0; i < ranks.size(); ++i) {
      peers.push_back(values[i].empty() ? unknownPeer(ranks[i], kNoStatus)
                                        : parseStatus(ranks[i], toString(values[i]), now));
    }
  } catch (const std::exception& e) {
    peers.clear();
    for (const int peer : ranks) peers.push_back(unknownPeer(peer, std::string("the store failed: ") + e.what()));
  }
  return peers;
}

}  // namespace ringtree::diagnostics
