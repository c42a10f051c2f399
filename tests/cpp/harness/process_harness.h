#pragma once

// A process harness for tests that need real processes (shared memory between address
// spaces, SIGKILL): forked children meeting through a FileStore in a temporary directory.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/store/file_store.h>

namespace ringtree::test {

using namespace std::chrono_literals;

// A fresh directory under the system's temporary directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ringtree_test.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct ChildResult {
  bool exited = false;  // by exit(), not a signal
  int code = -1;
  int signal = 0;
  std::string message;  // what the child reported: its error, or what fn returned
};

// Forks `size` children meeting through a FileStore in a fresh directory; child r runs
// fn(r, store) and exits 0 reporting fn's result, or 1 reporting the error. afterFork(pids)
// runs in the parent once all are started. Children still running after `timeout` are
// killed. Must be called with no other thread running in this process.
inline std::vector<ChildResult> runProcesses(int size, const std::function<std::string(int, std::shared_ptr<Store>)>& fn,
                                      const std::function<void(const std::vector<pid_t>&)>& afterFork = {},
                                      std::chrono::milliseconds timeout = 30s) {
  TempDir dir;
  const std::string path = (dir.path() / "store").string();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(fds[0]);
      std::string message;
      int code = 0;
      try {
        message = fn(rank, std::make_shared<FileStore>(path, -1, std::chrono::seconds(20)));
      } catch (const std::exception& e) {
        message = e.what();
        code = 1;
      }
      for (size_t done = 0; done < message.size();) {
        const ssize_t n = ::write(fds[1], message.data() + done, message.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::_exit(code);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  if (afterFork) afterFork(pids);
  std::vector<ChildResult> results(static_cast<size_t>(size));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = pids[static_cast<size_t>(rank)];
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) != pid) {
      if (std::chrono::steady_clock::now() > deadline) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(2ms);
    }
    ChildResult& r = results[static_cast<size_t>(rank)];
    r.exited = WIFEXITED(status);
    r.code = r.exited ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    char buffer[4096];
    ssize_t n = 0;
    while ((n = ::read(pipes[static_cast<size_t>(rank)], buffer, sizeof(buffer))) > 0) {
      r.message.append(buffer, static_cast<size_t>(n));
    }
    ::close(pipes[static_cast<size_t>(rank)]);
  }
  return results;
}

}  // namespace ringtree::test
