"""``ringtree-bench call-overhead``, for the commands that name this file (see docs/benchmarks.md);
the code is ringtree/bench/call_overhead.py."""

import sys

from ringtree.bench.cli import main

sys.exit(main(["call-overhead", *sys.argv[1:]]))
