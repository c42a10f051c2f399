#pragma once

#include <algorithm>
#include <vector>

namespace ringtree::algorithms {

// The binomial tree over `size` ranks rooted at `root`: in ranks relative to the root
// (v = (rank - root) mod size), v's parent is v with its lowest set bit cleared and its
// children are v + 2^k for every 2^k below v's lowest set bit (all k for the root)
// while v + 2^k < size. Depth ceil(log2 size).
class BinomialTree {
 public:
  BinomialTree(int rank, int size, int root) : size_(size), root_(root) {
    const int v = relative(rank);
    int mask = 1;
    while (mask < size) {
      if ((v & mask) != 0) {
        parent_ = absolute(v - mask);
        break;
      }
      if (v + mask < size) {
        children_.push_back(absolute(v + mask));
      }
      mask <<= 1;
    }
  }

  // The parent's rank, or -1 at the root.
  int parent() const { return parent_; }
  // Children with the smallest subtree first (the order a reduction folds them in).
  const std::vector<int>& childrenNearestFirst() const { return children_; }
  // Children with the largest subtree first (the order a broadcast serves them in).
  std::vector<int> childrenFarthestFirst() const { return {children_.rbegin(), children_.rend()}; }

  // `rank` relative to the root: (rank - root) mod size.
  int relativeRank(int rank) const { return relative(rank); }
  // How many ranks the subtree under `rank` spans: the ranks whose relative numbers run
  // from relativeRank(rank) up (size for the root). A node's own rank comes first, then
  // its children's subtrees, nearest first, each right after the previous one.
  int subtreeSize(int rank) const {
    const int v = relative(rank);
    return v == 0 ? size_ : std::min(v & -v, size_ - v);
  }

 private:
  int relative(int rank) const { return (rank - root_ + size_) % size_; }
  int absolute(int v) const { return (v + root_) % size_; }

  int size_;
  int root_;
  int parent_ = -1;
  std::vector<int> children_;
};

}  // namespace ringtree::algorithms
