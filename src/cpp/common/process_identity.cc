#include "common/process_identity.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <fstream>
#include <iterator>
#include <set>
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

// Seconds since boot (/proc/uptime); negative when unreadable.
double uptimeSeconds() {
  std::ifstream file("/proc/uptime");
  double seconds = -1;
  if (!(file >> seconds)) return -1;
  return seconds;
}

// /proc/PID/cmdline with its NULs as spaces, cut to maxChars; "" when unreadable.
std::string commandLine(int64_t pid, size_t maxChars) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text) {
    if (c == '\0' || c == '\n') c = ' ';
  }
  if (text.size() > maxChars) text = text.substr(0, maxChars - 3) + "...";
  return text;
}

// The socket inodes of /proc/net/<table> listening on port (state 0A).
void listeningInodes(const char* table, uint16_t port, std::set<uint64_t>* inodes) {
  std::ifstream file(std::string("/proc/net/") + table);
  std::string line;
  std::getline(file, line);  // the header
  while (std::getline(file, line)) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    uint64_t inode = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode)) {
      continue;
    }
    const auto colon = local.rfind(':');
    if (colon == std::string::npos || state != "0A") continue;
    if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) == port && inode != 0) inodes->insert(inode);
  }
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

bool sameProcess(const ProcessIdentity& a, const ProcessIdentity& b) {
  return sameHost(a, b) && a.pidNamespace == b.pidNamespace && a.pid == b.pid && a.startTicks == b.startTicks;
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

std::string describeLocalProcess(int64_t pid) {
  std::string details;
  const std::string command = commandLine(pid, 60);
  if (!command.empty()) details = "'" + command + "'";
  char state = '?';
  uint64_t startTicks = 0;
  const double uptime = uptimeSeconds();
  const long ticksPerSecond = ::sysconf(_SC_CLK_TCK);
  if (readStat(pid, &state, &startTicks) && uptime >= 0 && ticksPerSecond > 0) {
    const double age = uptime - static_cast<double>(startTicks) / static_cast<double>(ticksPerSecond);
    details += std::string(details.empty() ? "" : ", ") + "running for " +
               std::to_string(static_cast<int64_t>(age < 0 ? 0 : age)) + " s";
  }
  return "pid " + std::to_string(pid) + (details.empty() ? "" : " (" + details + ")");
}

std::vector<int64_t> processesListeningOn(uint16_t port) {
  std::set<uint64_t> inodes;
  listeningInodes("tcp", port, &inodes);
  listeningInodes("tcp6", port, &inodes);
  std::vector<int64_t> pids;
  if (inodes.empty()) return pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0) continue;
    const std::string fdDir = "/proc/" + std::string(entry->d_name) + "/fd";
    DIR* fds = ::opendir(fdDir.c_str());
    if (fds == nullptr) continue;  // gone meanwhile, or another user's
    bool holds = false;
    while (const dirent* fd = ::readdir(fds)) {
      char target[64] = {0};
      const std::string link = fdDir + "/" + fd->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      uint64_t inode = 0;
      if (n > 0 && std::sscanf(target, "socket:[%" SCNu64 "]", &inode) == 1 && inodes.count(inode) != 0) {
        holds = true;
        break;
      }
    }
    ::closedir(fds);
    if (holds) pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

}  // namespace ringtree
