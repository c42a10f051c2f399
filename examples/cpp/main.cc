// ringtree from C++: allreduce (float sum) and broadcast over N processes, with the
// results checked exactly. Prints one line per rank; exits non-zero on a wrong value or
// an error.
//
//   allreduce_example --nproc N        forks N ranks that meet through a FileStore in a
//                                      temporary directory
//   ringtree-run --nproc-per-node N --no-python allreduce_example
//                                      one rank of a launched job: RANK, WORLD_SIZE,
//                                      MASTER_ADDR and MASTER_PORT name it and the TcpStore.
//                                      ringtree-run hosts the store itself and sets
//                                      RINGTREE_USE_AGENT_STORE=1; without that variable
//                                      (torchrun --no-python ...) rank 0 hosts it.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/ringtree.h>

namespace {

constexpr size_t kCount = 1000;
constexpr int kRoot = 0;

// Runs the collectives as `rank` of `size` over `store`, through the group's
// ProcessGroup; returns the number of wrong elements. Throws ringtree::Error on a
// communication failure.
size_t runRank(const std::shared_ptr<ringtree::Store>& store, int rank, int size) {
  auto group = ringtree::ProcessGroup::create(std::make_shared<ringtree::PrefixStore>("allreduce_example", store),
                                              rank, size);

  // Small integers are exact in float32, so the sum has one right answer.
  std::vector<float> data(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    data[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
  }
  group->allreduce(ringtree::BufferView(data.data(), data.size()));
  const float rankSum = static_cast<float>(size * (size + 1) / 2);
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) {
    wrong += data[i] != rankSum * static_cast<float>(i % 7) ? 1 : 0;
  }

  std::vector<float> message(kCount, rank == kRoot ? 42.0f : -1.0f);
  ringtree::BroadcastOptions options;
  options.root = kRoot;
  auto work = group->broadcastAsync(ringtree::BufferView(message.data(), message.size()), options);
  work->wait();
  for (float value : message) {
    wrong += value != 42.0f ? 1 : 0;
  }
  group->barrier();

  std::printf("rank %d/%d: allreduce sum data[6] = %g (expected %g), broadcast from %d, %zu wrong\n",
              rank, size, static_cast<double>(data[6]), static_cast<double>(rankSum * 6.0f), kRoot,
              wrong);
  std::fflush(stdout);
  return wrong;
}

// 0 when this rank's values are right, 1 otherwise (the process exit status).
int runRankReportingErrors(const std::shared_ptr<ringtree::Store>& store, int rank, int size) {
  try {
    return runRank(store, rank, size) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}

int runForked(int nproc) {
  char dir[] = "/tmp/ringtree-example-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string path = std::string(dir) + "/store";
  std::vector<pid_t> children;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      break;
    }
    if (pid == 0) {
      int status = 1;
      try {
        // The last of the nproc FileStore objects to go removes the file.
        auto store = std::make_shared<ringtree::FileStore>(path, nproc);
        status = runRankReportingErrors(store, rank, nproc);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(status);
    }
    children.push_back(pid);
  }
  int failures = static_cast<int>(nproc - children.size());
  for (pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  }
  unlink(path.c_str());
  rmdir(dir);
  return failures == 0 ? 0 : 1;
}

int envInt(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw ringtree::InvalidArgument(std::string(name) +
                                    " is not set (run under ringtree-run, or pass --nproc N)");
  }
  return std::atoi(value);
}

int runLaunched() {
  const int rank = envInt("RANK");
  const int size = envInt("WORLD_SIZE");
  const char* addr = std::getenv("MASTER_ADDR");
  const char* agentStore = std::getenv("RINGTREE_USE_AGENT_STORE");
  ringtree::TcpStoreOptions options;
  options.port = static_cast<uint16_t>(envInt("MASTER_PORT"));
  options.isServer = rank == 0 && (agentStore == nullptr || std::strcmp(agentStore, "1") != 0);
  options.numWorkers = size;
  options.waitForWorkers = false;
  auto store = std::make_shared<ringtree::TcpStore>(addr != nullptr ? addr : "127.0.0.1", options);
  return runRankReportingErrors(store, rank, size);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--nproc") == 0) {
    const int nproc = std::atoi(argv[2]);
    if (nproc < 1) {
      std::fprintf(stderr, "--nproc needs a positive number\n");
      return 2;
    }
    return runForked(nproc);
  }
  if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--nproc N]\n", argv[0]);
    return 2;
  }
  try {
    return runLaunched();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
