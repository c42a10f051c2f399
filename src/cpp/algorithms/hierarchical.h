#pragma once

#include <cstddef>

#include "algorithms/call.h"
#include "transport/pair.h"

// The topology-aware collectives ("hierarchical") for jobs over H >= 2 hosts with the same
// number L >= 2 of ranks on each (CommunicatorImpl::hosts().uniform; the layout comes from
// the rendezvous records). Each runs in phases over two kinds of member sets: the L ranks
// of one host (shared memory between them on real hosts), and the H ranks with the same
// local index, one per host (the ones whose messages cross the network). Every phase that
// crosses hosts is split over all L local ranks, so each host's link carries the least any
// algorithm of that collective can move (each host receives the other hosts' data once),
// and small messages cross the network in the fewest rounds (ceil(log2 H) trees, H - 1
// ring steps). Every element's final value is computed on one rank, by steps that depend
// only on the layout, and then copied: results are the same bits on every rank and in
// every run.
//
// Same contract as the flat algorithms of each collective (the caller validated the
// arguments, runCall handles failures); each needs call.comm.hosts().uniform.
namespace ringtree::algorithms {

// In place. A ring reduce-scatter among the ranks of each host leaves each rank the host's
// reduction of one part (1/L of the buffer); the H ranks owning the same part ring-allreduce
// it across hosts; a ring allgather within each host spreads the parts. Each host's link
// carries 2(H-1)/H of the buffer per direction, split over its L ranks. maxSegmentBytes
// slices the buffer as the flat ring does.
void hierarchicalAllreduce(Call& call, void* buffer, size_t count, const transport::Accumulate& acc,
                           size_t maxSegmentBytes);

// Small (up to kSmallMessageBytes): a binomial tree across hosts among the ranks with the
// root's local index, then one within each host from that rank. Large: the root hands
// part c (1/L) of the buffer to local rank c of its host, each of those sends its part down
// a pipelined chain of its peers across the hosts (segmentBytes), and a ring allgather
// within each host joins the parts: each host receives the buffer once, over L streams.
void hierarchicalBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t segmentBytes);

// `working` is the buffer this rank reduces into (the root's result buffer, a premultiplied
// scratch copy elsewhere: the caller's). Small: a binomial tree within each host to the
// rank with the root's local index, then one across hosts to the root. Large: a ring
// reduce-scatter within each host, each part reduced down a pipelined chain across hosts
// that ends at the root's host (segmentBytes, a multiple of the element size), and the
// root gathers the parts from its host's ranks.
void hierarchicalReduce(Call& call, void* working, size_t count, int root, const transport::Accumulate& acc,
                        size_t segmentBytes);

// Blocks of any sizes (counts[r] elements of rank r; outputs[r] receives it; this rank's
// own block is read from input, which may be outputs[rank]: the caller copies it last).
// A ring across hosts among the ranks with this rank's local index gathers their blocks
// (the only bytes that cross hosts: H - 1 blocks per rank), then a ring within each host
// exchanges those columns.
void hierarchicalAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts);

// sources[r]: this rank's contribution to rank r's block (counts[r] elements). working:
// scratch for a copy of every block (the sum of counts, in elements). A ring
// reduce-scatter within each host leaves local rank c the host's reduction of the blocks
// of every rank with local index c; a ring reduce-scatter across hosts among those ranks
// finishes each one's own block, which is copied to output.
void hierarchicalReduceScatter(Call& call, const void* const* sources, void* output, const size_t* counts,
                               const transport::Accumulate& acc, void* working);

// Every rank of a host reports to the host's first rank, those run a dissemination barrier
// across hosts (ceil(log2 H) rounds over the network), then release their hosts.
void hierarchicalBarrier(Call& call);

}  // namespace ringtree::algorithms
