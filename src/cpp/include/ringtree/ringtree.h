#pragma once

// Umbrella header for C++ users of ringtree.
#include <ringtree/error.h>
#include <ringtree/export.h>
#include <ringtree/store/file_store.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>
#include <ringtree/store/store.h>
#include <ringtree/store/tcp_store.h>
#include <ringtree/version.h>
