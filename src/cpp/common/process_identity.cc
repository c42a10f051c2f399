#include "common/process_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <fstream>
#include <sstream>

namespace ringtree {

namespace {

// From /proc/PID/stat: the state (field 3) and the start time (field 22). False when the
// process does not exist or the file cannot be parsed. The command name (field 2) may
// hold spaces and parentheses, so the fields are counted after its last ')'.
bool readStat(int64_t pid, char* state, uint64_t* startTicks) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(file, stat)) return false;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int index = 3; index <= 22; ++index) {
    if (!(fields >> field)) return false;
    if (index == 3) *state = field.empty() ? '?' : field[0];
  }
  try {
    *startTicks = std::stoull(field);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

uint64_t pidNamespaceInode() {
  struct stat info {};
  return ::stat("/proc/self/ns/pid", &info) == 0 ? static_cast<uint64_t>(info.st_ino) : 0;
}

}  // namespace

std::string localHostname() {
  char name[HOST_NAME_MAX + 1] = {0};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

std::string localBootId() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  std::getline(file, bootId);
  return bootId;
}

ProcessIdentity localProcessIdentity() {
  ProcessIdentity identity;
  identity.hostname = localHostname();
  identity.bootId = localBootId();
  identity.pidNamespace = pidNamespaceInode();
  identity.pid = ::getpid();
  char state = '?';
  if (!readStat(identity.pid, &state, &identity.startTicks)) identity.startTicks = 0;
  identity.takenAtMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return identity;
}

// "ringtree-process 1 <bootId> <pidNamespace> <pid> <startTicks> <takenAtMs> <hostname>":
// the host name last, as it is the one field that may hold spaces.
std::string encodeProcessIdentity(const ProcessIdentity& identity) {
  std::ostringstream text;
  text << "ringtree-process 1 " << (identity.bootId.empty() ? "-" : identity.bootId) << ' '
       << identity.pidNamespace << ' ' << identity.pid << ' ' << identity.startTicks << ' '
       << identity.takenAtMs << ' ' << identity.hostname;
  return text.str();
}

bool decodeProcessIdentity(const std::string& text, ProcessIdentity* identity) {
  std::istringstream fields(text);
  std::string tag;
  int version = 0;
  ProcessIdentity decoded;
  if (!(fields >> tag >> version >> decoded.bootId >> decoded.pidNamespace >> decoded.pid >>
        decoded.startTicks >> decoded.takenAtMs) ||
      tag != "ringtree-process" || version != 1) {
    return false;
  }
  if (decoded.bootId == "-") decoded.bootId.clear();
  fields.get();  // the space before the host name
  std::getline(fields, decoded.hostname);
  *identity = decoded;
  return true;
}

bool sameHost(const ProcessIdentity& a, const ProcessIdentity& b) {
  return a.hostname == b.hostname && a.bootId == b.bootId;
}

Liveness livenessOf(const ProcessIdentity& identity) {
  const std::string bootId = localBootId();
  if (identity.bootId.empty() || bootId.empty() || identity.bootId != bootId || identity.pidNamespace == 0 ||
      identity.pidNamespace != pidNamespaceInode() || identity.pid <= 0) {
    return Liveness::kUnknown;
  }
  if (::kill(static_cast<pid_t>(identity.pid), 0) != 0 && errno == ESRCH) return Liveness::kGone;
  char state = '?';
  uint64_t startTicks = 0;
  if (!readStat(identity.pid, &state, &startTicks)) {
    // kill() found the pid but /proc does not show it: reaped meanwhile, or /proc hidden.
    return ::kill(static_cast<pid_t>(identity.pid), 0) != 0 && errno == ESRCH ? Liveness::kGone : Liveness::kUnknown;
  }
  if (identity.startTicks != 0 && startTicks != identity.startTicks) return Liveness::kGone;  // pid reused
  // A zombie (exited, not yet reaped) or a dead task runs no more code.
  return state == 'Z' || state == 'X' ? Liveness::kGone : Liveness::kRunning;
}

std::string describeProcess(const ProcessIdentity& identity) {
  return "host '" + identity.hostname + "', pid " + std::to_string(identity.pid);
}

}  // namespace ringtree
