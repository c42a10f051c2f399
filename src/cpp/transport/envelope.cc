#include <atomic>
#include <sstream>
#include <string>

#include "transport/pair.h"

namespace ringtree::transport {

namespace {
std::atomic<EnvelopeDescriber> installedDescriber{nullptr};
}  // namespace

void setEnvelopeDescriber(EnvelopeDescriber describer) {
  installedDescriber.store(describer, std::memory_order_release);
}

std::string envelopeText(const Envelope& e, size_t bytes) {
  if (EnvelopeDescriber describer = installedDescriber.load(std::memory_order_acquire)) {
    std::string call = describer(e);
    if (!call.empty()) {
      return std::to_string(bytes) + " bytes of " + call;
    }
  }
  std::ostringstream out;
  out << bytes << " bytes (sequence " << e.sequence << ", operation " << e.operation << ", data type "
      << static_cast<int>(e.dataType) << ", reduce op " << static_cast<int>(e.reduceOp) << ", count " << e.count
      << ", root " << e.root << ", tag " << e.tag;
  if (e.noticeKind != 0) out << ", notice kind " << static_cast<int>(e.noticeKind);
  out << ")";
  return out.str();
}

}  // namespace ringtree::transport
