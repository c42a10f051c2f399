#include "algorithms/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/batch.h"
#include "algorithms/blocks.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/trees.h"
#include "common/copy.h"
#include "communicator_impl.h"

namespace ringtree::algorithms {

namespace {

// The two member sets of a uniform layout, as seen from this rank.
struct Grid {
  explicit Grid(const Call& call)
      : layout(call.comm.hosts()),
        hosts(layout.hosts),
        local(static_cast<int>(layout.localRanks.size())),
        onHost{layout.localRanks.data(), local, layout.localIndex},
        across{layout.peersAcross.data(), hosts, layout.acrossIndex} {}

  const detail::HostLayout& layout;
  int hosts;
  int local;
  RingMembers onHost;  // the ranks of this host, by local index
  RingMembers across;  // the ranks with this rank's local index, by host
};

// Members `ranks` renumbered to start at position `first` (a chain or tree that begins
// there): ranks[(first + k) % n] is at position k.
std::vector<int> rotated(const int* ranks, int n, int first) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) order[static_cast<size_t>(k)] = ranks[(first + k) % n];
  return order;
}

// Binomial-tree broadcast of `bytes` at `data` over members, rooted at position `root`.
void treeBroadcastOver(Call& call, const RingMembers& members, int root, void* data, size_t bytes) {
  const BinomialTree tree(members.index, members.n, root);
  if (tree.parent() >= 0) recv(call, members.at(tree.parent()), data, bytes);
  for (const int child : tree.childrenFarthestFirst()) send(call, members.at(child), data, bytes);
}

// Binomial-tree reduction of `bytes` at `data` over members into position `root`.
void treeReduceOver(Call& call, const RingMembers& members, int root, void* data, size_t bytes,
                    const transport::Accumulate& acc) {
  const BinomialTree tree(members.index, members.n, root);
  for (const int child : tree.childrenNearestFirst()) recv(call, members.at(child), data, bytes, acc);
  if (tree.parent() >= 0) send(call, members.at(tree.parent()), data, bytes);
}

// Where block r lies in a buffer holding every rank's block in rank order.
std::vector<size_t> blockOffsets(const size_t* counts, int n, size_t es) {
  std::vector<size_t> offsets(static_cast<size_t>(n) + 1, 0);
  for (int r = 0; r < n; ++r) offsets[static_cast<size_t>(r) + 1] = offsets[static_cast<size_t>(r)] + counts[r] * es;
  return offsets;
}

}  // namespace

void hierarchicalAllreduce(Call& call, void* buffer, size_t count, const transport::Accumulate& acc,
                           size_t maxSegmentBytes) {
  const Grid grid(call);
  forEachRingSlice(call, buffer, count, maxSegmentBytes, [&](void* slice, size_t sliceCount) {
    ringReduceScatter(call, grid.onHost, slice, sliceCount, acc);
    const Range part = partition(sliceCount, grid.local, ringOwnedPart(grid.onHost.index, grid.local));
    void* owned = elementAt(slice, part.offset, call.elementSize);
    ringReduceScatter(call, grid.across, owned, part.count, acc);
    ringAllgather(call, grid.across, owned, part.count);
    ringAllgather(call, grid.onHost, slice, sliceCount);
  });
}

void hierarchicalBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t segmentBytes) {
  const Grid grid(call);
  const int rootHost = grid.layout.hostOf[static_cast<size_t>(root)];
  const int rootLocal = grid.layout.localIndexOf(root);
  const int myHost = grid.across.index;
  const int myLocal = grid.onHost.index;
  if (bytes <= kSmallMessageBytes) {
    if (myLocal == rootLocal) treeBroadcastOver(call, grid.across, rootHost, buffer, bytes);
    treeBroadcastOver(call, grid.onHost, rootLocal, buffer, bytes);
    return;
  }
  auto* data = static_cast<char*>(buffer);
  auto part = [&](int c) { return partition(bytes, grid.local, c); };
  // 1. Within the root's host, local rank c gets part c.
  if (myHost == rootHost) {
    if (call.rank() == root) {
      Batch batch(call);
      for (int c = 0; c < grid.local; ++c) {
        if (c != rootLocal) batch.send(grid.onHost.at(c), data + part(c).offset, part(c).count);
      }
      batch.wait();
    } else {
      recv(call, root, data + part(myLocal).offset, part(myLocal).count);
    }
  }
  // 2. Part c down the chain of local index c's ranks, from the root's host on.
  const std::vector<int> chain = rotated(grid.layout.peersAcross.data(), grid.hosts, rootHost);
  const Range mine = part(myLocal);
  chainPass(call, RingMembers{chain.data(), grid.hosts, (myHost - rootHost + grid.hosts) % grid.hosts},
            data + mine.offset, mine.count, segmentBytes);
  // 3. Within every host, each rank's part to the others: in step s local rank i sends
  // part i - s and receives part i - s - 1.
  const int l = grid.local;
  for (int step = 0; step < l - 1; ++step) {
    const Range out = part((myLocal - step + l) % l);
    const Range in = part((myLocal - step - 1 + l) % l);
    sendRecv(call, grid.onHost.right(), data + out.offset, out.count, grid.onHost.left(), data + in.offset,
             in.count);
  }
}

void hierarchicalReduce(Call& call, void* working, size_t count, int root, const transport::Accumulate& acc,
                        size_t segmentBytes) {
  const Grid grid(call);
  const int rootHost = grid.layout.hostOf[static_cast<size_t>(root)];
  const int rootLocal = grid.layout.localIndexOf(root);
  const int myHost = grid.across.index;
  const int myLocal = grid.onHost.index;
  const size_t es = call.elementSize;
  if (count * es <= kSmallMessageBytes) {
    treeReduceOver(call, grid.onHost, rootLocal, working, count * es, acc);
    if (myLocal == rootLocal) treeReduceOver(call, grid.across, rootHost, working, count * es, acc);
    return;
  }
  // 1. Each local rank ends with its host's reduction of its owned part.
  ringReduceScatter(call, grid.onHost, working, count, acc);
  const int l = grid.local;
  auto owned = [&](int c) { return partition(count, l, ringOwnedPart(c, l)); };
  // 2. That part down the chain of this local index's ranks, ending at the root's host.
  const std::vector<int> chain = rotated(grid.layout.peersAcross.data(), grid.hosts, (rootHost + 1) % grid.hosts);
  const Range mine = owned(myLocal);
  const int position = (myHost - rootHost - 1 + 2 * grid.hosts) % grid.hosts;
  chainPass(call, RingMembers{chain.data(), grid.hosts, position}, elementAt(working, mine.offset, es),
            mine.count * es, std::max(es, segmentBytes / es * es), acc);
  // 3. The root gathers the parts from its host's ranks.
  if (myHost != rootHost) return;
  if (call.rank() == root) {
    Batch batch(call);
    for (int c = 0; c < l; ++c) {
      if (c != myLocal) batch.recv(grid.onHost.at(c), elementAt(working, owned(c).offset, es), owned(c).count * es);
    }
    batch.wait();
  } else {
    send(call, root, elementAt(working, mine.offset, es), mine.count * es);
  }
}

void hierarchicalAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts) {
  const Grid grid(call);
  const size_t es = call.elementSize;
  const int me = call.rank();
  auto source = [&](int r) { return static_cast<const char*>(r == me ? input : outputs[r]); };
  // 1. Across hosts among this local index's ranks: step s sends the block of host a - s
  // and receives that of host a - s - 1 (a: this rank's host).
  const int h = grid.hosts;
  const int a = grid.across.index;
  for (int step = 0; step < h - 1; ++step) {
    const int out = grid.across.at((a - step + h) % h);
    const int in = grid.across.at((a - step - 1 + h) % h);
    sendRecv(call, grid.across.right(), source(out), counts[out] * es, grid.across.left(), outputs[in],
             counts[in] * es);
  }
  // 2. Within the host, columns (the blocks of one local index on every host): step s
  // sends column i - s and receives column i - s - 1 (i: this rank's local index).
  const int l = grid.local;
  const int i = grid.onHost.index;
  for (int step = 0; step < l - 1; ++step) {
    const int out = (i - step + l) % l;
    const int in = (i - step - 1 + l) % l;
    Batch batch(call);
    for (int host = 0; host < h; ++host) {
      const int received = grid.layout.rankAt(host, in);
      batch.recv(grid.onHost.left(), outputs[received], counts[received] * es);
    }
    for (int host = 0; host < h; ++host) {
      const int sent = grid.layout.rankAt(host, out);
      batch.send(grid.onHost.right(), source(sent), counts[sent] * es);
    }
    batch.wait();
  }
}

void hierarchicalReduceScatter(Call& call, const void* const* sources, void* output, const size_t* counts,
                               const transport::Accumulate& acc, void* working) {
  const Grid grid(call);
  const size_t es = call.elementSize;
  const int n = call.size();
  const std::vector<size_t> offsets = blockOffsets(counts, n, es);
  auto* base = static_cast<char*>(working);
  for (int r = 0; r < n; ++r) {
    if (counts[r] > 0) copyBytes(base + offsets[static_cast<size_t>(r)], sources[r], counts[r] * es);
  }
  auto block = [&](int r) { return base + offsets[static_cast<size_t>(r)]; };
  // 1. Within the host, columns: in step s local rank i sends its partial of column
  // i - s - 1 and folds the left neighbour's of column i - s - 2 into its copy; the last
  // step's is its own column, then reduced over the whole host.
  const int h = grid.hosts;
  const int l = grid.local;
  const int i = grid.onHost.index;
  for (int step = 0; step < l - 1; ++step) {
    const int out = (i - step - 1 + l) % l;
    const int in = (i - step - 2 + 2 * l) % l;
    Batch batch(call);
    for (int host = 0; host < h; ++host) {
      const int received = grid.layout.rankAt(host, in);
      batch.recv(grid.onHost.left(), block(received), counts[received] * es, acc);
    }
    for (int host = 0; host < h; ++host) {
      const int sent = grid.layout.rankAt(host, out);
      batch.send(grid.onHost.right(), block(sent), counts[sent] * es);
    }
    batch.wait();
  }
  // 2. Across hosts, the same ring over this column's blocks: the last step's is this
  // rank's own block, then reduced over every rank.
  const int a = grid.across.index;
  for (int step = 0; step < h - 1; ++step) {
    const int out = grid.across.at((a - step - 1 + h) % h);
    const int in = grid.across.at((a - step - 2 + 2 * h) % h);
    sendRecv(call, grid.across.right(), block(out), counts[out] * es, grid.across.left(), block(in),
             counts[in] * es, acc);
  }
  const int me = call.rank();
  if (counts[me] > 0) copyBytes(output, block(me), counts[me] * es);
}

void hierarchicalBarrier(Call& call) {
  const Grid grid(call);
  const int leader = grid.onHost.at(0);
  if (call.rank() != leader) {
    send(call, leader, nullptr, 0);
    recv(call, leader, nullptr, 0);
    return;
  }
  Batch arrivals(call);
  for (int c = 1; c < grid.local; ++c) arrivals.recv(grid.onHost.at(c), nullptr, 0);
  arrivals.wait();
  const int h = grid.hosts;
  const int a = grid.across.index;
  for (int distance = 1; distance < h; distance <<= 1) {
    sendRecv(call, grid.layout.rankAt((a + distance) % h, 0), nullptr, 0, grid.layout.rankAt((a - distance + h) % h, 0),
             nullptr, 0);
  }
  Batch release(call);
  for (int c = 1; c < grid.local; ++c) release.send(grid.onHost.at(c), nullptr, 0);
  release.wait();
}

}  // namespace ringtree::algorithms
