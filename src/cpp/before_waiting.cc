#include <ringtree/before_waiting.h>

namespace ringtree {

namespace {

struct Installed {
  BeforeWaiting::Hook hook = nullptr;
  void* context = nullptr;
};

thread_local Installed installed;

}  // namespace

BeforeWaiting::BeforeWaiting(Hook hook, void* context)
    : previousHook_(installed.hook), previousContext_(installed.context) {
  installed.hook = hook;
  installed.context = context;
}

BeforeWaiting::~BeforeWaiting() {
  installed.hook = previousHook_;
  installed.context = previousContext_;
}

void BeforeWaiting::notify() {
  Installed& current = installed;
  if (current.hook != nullptr && current.hook(current.context)) current.hook = nullptr;
}

}  // namespace ringtree
