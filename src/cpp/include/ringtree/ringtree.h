#pragma once

// Umbrella header for C++ users of ringtree: every public header.
#include <ringtree/before_waiting.h>
#include <ringtree/buffer.h>
#include <ringtree/collectives.h>
#include <ringtree/communicator.h>
#include <ringtree/cuda.h>
#include <ringtree/device_backend.h>
#include <ringtree/error.h>
#include <ringtree/export.h>
#include <ringtree/options.h>
#include <ringtree/p2p.h>
#include <ringtree/process_group.h>
#include <ringtree/reductions.h>
#include <ringtree/store/file_store.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>
#include <ringtree/store/store.h>
#include <ringtree/store/tcp_store.h>
#include <ringtree/types.h>
#include <ringtree/version.h>
#include <ringtree/work.h>
