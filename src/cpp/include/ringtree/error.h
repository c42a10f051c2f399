#pragma once

#include <stdexcept>
#include <string>

#include <ringtree/export.h>

namespace ringtree {

// Base of every error ringtree throws. Messages name what failed (the operation, the
// peer or host:port, the keys, the timeout) so that they can be acted on without a
// debugger. The Python layer maps each class to the ringtree.Dist* exception of the
// same meaning (see docs/errors.md).
class RINGTREE_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something invalid (bad rank, negative timeout, malformed URL...).
// Raised before any side effect. Python: ValueError.
class RINGTREE_API InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A connection could not be made or broke (refused, reset, closed by the peer,
// authentication refused). Python: ringtree.DistNetworkError.
class RINGTREE_API NetworkError : public Error {
 public:
  using Error::Error;
};

// A store operation failed for a reason other than the network: most often a key that
// did not appear within the timeout. Python: ringtree.DistStoreError.
class RINGTREE_API StoreError : public Error {
 public:
  using Error::Error;
};

// An operation (other than a store wait) did not finish within its deadline.
// Python: ringtree.DistTimeoutError.
class RINGTREE_API TimeoutError : public Error {
 public:
  using Error::Error;
};

// Ranks called different collectives, or the same collective with different arguments
// (operation, data type, count, root). The message names both ranks and both calls.
// Python: ringtree.CollectiveMismatchError (also a ValueError).
class RINGTREE_API CollectiveMismatchError : public Error {
 public:
  using Error::Error;
};

}  // namespace ringtree
