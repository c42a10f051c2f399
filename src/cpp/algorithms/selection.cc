#include "algorithms/selection.h"

#include <cstring>
#include <string>

#include <ringtree/error.h>

#include "common/env.h"
#include "common/logging.h"

namespace ringtree {

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kHalvingDoubling: return "halving_doubling";
    case Algorithm::kChain: return "chain";
  }
  return "unknown";
}

Algorithm parseAlgorithm(const char* name) {
  for (auto algorithm : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling,
                         Algorithm::kChain}) {
    if (std::strcmp(name, algorithmName(algorithm)) == 0) {
      return algorithm;
    }
  }
  throw InvalidArgument(std::string("unknown algorithm '") + name +
                        "'; expected one of auto, ring, tree, halving_doubling, chain");
}

namespace algorithms {

namespace {

bool implements(Collective collective, Algorithm algorithm) {
  switch (collective) {
    case Collective::kAllreduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kTree || algorithm == Algorithm::kHalvingDoubling;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kChain;
    case Collective::kReduce:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kRing;
    case Collective::kBarrier:
      return false;
  }
  return false;
}

const char* implementedNames(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return "ring, tree, halving_doubling";
    case Collective::kBroadcast: return "tree, chain";
    case Collective::kReduce: return "tree, ring";
    case Collective::kBarrier: return "(none: barrier has one algorithm)";
  }
  return "";
}

Algorithm bySize(Collective collective, size_t bytes, int worldSize) {
  const bool small = bytes <= kSmallMessageBytes;
  switch (collective) {
    case Collective::kAllreduce:
      // Recursive doubling needs log2(n) steps of the whole buffer; the ring needs
      // 2(n-1) steps of 1/n of it, so it wins once bandwidth dominates.
      return small || worldSize == 2 ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    case Collective::kBroadcast:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kChain;
    case Collective::kReduce:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kRing;
    case Collective::kBarrier:
      return Algorithm::kAuto;
  }
  return Algorithm::kAuto;
}

}  // namespace

Algorithm selectAlgorithm(Collective collective, Algorithm requested, size_t bytes, int worldSize) {
  if (collective == Collective::kBarrier) {
    return Algorithm::kAuto;
  }
  if (requested != Algorithm::kAuto) {
    if (!implements(collective, requested)) {
      throw InvalidArgument(std::string("algorithm '") + algorithmName(requested) + "' is not available for " +
                            collectiveName(collective) + "; choose one of " + implementedNames(collective));
    }
    return requested;
  }
  Algorithm chosen = Algorithm::kAuto;
  const std::string fromEnv = env::algorithm();
  if (!fromEnv.empty()) {
    const Algorithm named = parseAlgorithm(fromEnv.c_str());
    if (implements(collective, named)) {
      chosen = named;
    }
  }
  if (chosen == Algorithm::kAuto) {
    chosen = bySize(collective, bytes, worldSize);
  }
  RINGTREE_DEBUG(collectiveName(collective) << " of " << bytes << " bytes on " << worldSize << " ranks: "
                                            << algorithmName(chosen)
                                            << (fromEnv.empty() ? "" : " (RINGTREE_ALGO=" + fromEnv + ")"));
  return chosen;
}

}  // namespace algorithms

}  // namespace ringtree
