#pragma once

// RINGTREE_API marks the public C++ API. The library is compiled with hidden visibility,
// so a shared libringtree exports only what carries this macro. A static libringtree
// (the default, and what the Python extension links) keeps everything hidden inside the
// binary that links it.
#if defined(RINGTREE_STATIC_DEFINE)
#define RINGTREE_API
#else
#define RINGTREE_API __attribute__((visibility("default")))
#endif
