"""``ringtree-bench startup``, for the commands that name this file (see docs/benchmarks.md);
the code is ringtree/bench/startup.py."""

import sys

from ringtree.bench.cli import main

sys.exit(main(["startup", *sys.argv[1:]]))
