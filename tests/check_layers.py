#!/usr/bin/env python3
"""Checks that the C++ core's includes keep its layering (docs/architecture.md, "Layers").

Every file under src/cpp belongs to the folder of LAYERS that holds it most closely. A
quoted include ("folder/file.h", relative to src/cpp) must name a file of the same
folder, or of a folder or a single file that the folder's row allows. Angle includes
are public headers (<ringtree/...>) and standard or system headers, which every file may
include, except that public headers (include/ringtree) include public and standard
headers only, and that no file of the core includes a CUDA header.

Usage: tests/check_layers.py [SOURCE_ROOT]   (default: src/cpp of this checkout)
Prints one line per violation (file:line: the include, and the rule it breaks) and exits
with status 1 when there is one; ctest runs it as the test check_layers.
"""

import os
import re
import sys

# folder -> (what its files may include besides their own folder's files, public and
# standard headers; the rule, as a violation names it). An entry is a folder of this
# table (its own files, and those of its subfolders that have no row of their own) or
# one file. "." is the files directly in src/cpp (the communicator). A subfolder without
# a row follows its parent's; a new top-level folder has no rules until it gets a row,
# and its files fail the check: it is placed in the layering when it is created.
LAYERS = {
    "include/ringtree": ((), "public headers include only public headers (<ringtree/...>) and standard headers"),
    "common": ((), "common/ is the bottom layer: it includes nothing else of the core"),
    "store": (("common",), "the stores see common/ only"),
    "transport": (("common",), "the transport interfaces see common/ only"),
    "transport/mux": (("common", "transport"), "mux/ sees the transport interfaces and common/, never a concrete transport"),
    "transport/tcp": (("common", "transport"), "tcp/ sees the transport interfaces and common/; tcp/ and shm/ never include each other"),
    "transport/shm": (("common", "transport"), "shm/ sees the transport interfaces and common/; tcp/ and shm/ never include each other"),
    "arena": (("common", "transport", "transport/shm/segment.h"),
              "the node arena sees the envelope, the shared-memory segment it lives in and common/, no pair"),
    "diagnostics": (("common", "transport", "arena"), "diagnostics see the transport interfaces, the node arena and common/"),
    "rendezvous": (("common", "transport", "transport/tcp", "transport/shm", "transport/mux", "arena"),
                   "rendezvous/ is the one place where store and transports meet"),
    ".": (("common", "transport", "transport/mux", "diagnostics", "rendezvous"),
          "the communicator sees the transport interfaces, diagnostics and rendezvous/, never a concrete transport"),
    "algorithms": (("common", "transport/pair.h", "communicator_impl.h", "diagnostics"),
                   "algorithms see transport interfaces only, never a concrete transport (nor the node arena: only "
                   "algorithms/shm_direct/ does)"),
    "algorithms/shm_direct": (("algorithms", "common", "transport/pair.h", "communicator_impl.h", "diagnostics", "arena"),
                              "the shm_direct collectives see what algorithms/ sees, and the node arena they run over"),
    "p2p": (("common", "transport/pair.h", "communicator_impl.h"),
            "point-to-point sees transport interfaces only, never a concrete transport"),
    "backends/cuda": (("common",), "the CUDA backend sees common/ only: it drives the GPU through the tables of "
                      "gpu_api.h and nccl_api.h, never a CUDA header"),
    "backends": ((".", "common", "algorithms", "p2p", "backends/cuda"),
                 "backends (ProcessGroup and the CPU engine) see the algorithms, point-to-point and the communicator, "
                 "never a transport"),
}

SOURCE_SUFFIXES = (".h", ".cc", ".cpp", ".hpp", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# CUDA toolkit and NCCL headers (the core is CPU only; the CUDA library plugs in at run
# time, see DESIGN.md).
CUDA_HEADER = re.compile(r"^(cuda\w*\.h|cu(blas|rand|fft|sparse|solver)\w*\.h|nccl\w*\.h|nvrtc\w*\.h|nvml\w*\.h|"
                         r"(cub|thrust|cuda|cooperative_groups)/.*|.*\.cuh)$")


def folder_of(path):
    """The LAYERS folder of `path` (relative to src/cpp): its own folder's row, else the
    nearest enclosing folder's ("." only for files directly in src/cpp); None when no
    folder on the way has a row."""
    directory = os.path.dirname(path)
    if not directory:
        return "."
    while directory:
        if directory in LAYERS:
            return directory
        directory = os.path.dirname(directory)
    return None


def allowed(including_folder, included):
    """Whether a file of including_folder may include `included` (a quoted path)."""
    target = folder_of(included)
    if target == including_folder:
        return True
    entries = LAYERS[including_folder][0]
    return target in entries or included in entries


def violations(root):
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown_root = os.path.relpath(os.path.abspath(root), repository)
    if shown_root.startswith(".."):
        shown_root = os.path.abspath(root)
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.relpath(os.path.join(directory, name), root)
            shown = os.path.join(shown_root, path)
            folder = folder_of(path)
            if folder is None:
                found.append(f"{shown}:1: its folder has no row in the layering table (LAYERS in tests/check_layers.py)")
                continue
            with open(os.path.join(root, path), encoding="utf-8") as source:
                for number, line in enumerate(source, 1):
                    match = INCLUDE.match(line)
                    if not match:
                        continue
                    quoted, included = match.group(1) == '"', match.group(2)
                    text = f'"{included}"' if quoted else f"<{included}>"
                    if CUDA_HEADER.match(included):
                        found.append(f"{shown}:{number}: includes {text}: the core never includes CUDA headers")
                    elif folder == "include/ringtree" and (quoted or ("/" in included and
                                                                       not included.startswith("ringtree/"))):
                        found.append(f"{shown}:{number}: includes {text}: {LAYERS[folder][1]}")
                    elif quoted and folder_of(included) is None:
                        found.append(f"{shown}:{number}: includes {text}, which is in no folder of the layering table")
                    elif quoted and not allowed(folder, included):
                        found.append(f"{shown}:{number}: includes {text}: {LAYERS[folder][1]}")
    return found


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "src", "cpp")
    if not os.path.isdir(root):
        print(f"check_layers: no source folder {root}", file=sys.stderr)
        return 2
    found = violations(root)
    for line in found:
        print(line)
    if found:
        print(f"check_layers: {len(found)} violation(s) of the layering (docs/architecture.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
