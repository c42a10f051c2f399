"""``ringtree-bench p2p-pingpong``, for the commands that name this file (see docs/benchmarks.md);
the code is ringtree/bench/p2p_pingpong.py."""

import sys

from ringtree.bench.cli import main

sys.exit(main(["p2p-pingpong", *sys.argv[1:]]))
