"""``ringtree-bench failure-table``, for the commands that name this file (see docs/benchmarks.md);
the code is ringtree/bench/failure_table.py."""

import sys

from ringtree.bench.cli import main

sys.exit(main(["failure-table", *sys.argv[1:]]))
