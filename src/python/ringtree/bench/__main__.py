"""``python -m ringtree.bench``: see :mod:`ringtree.bench`."""

import sys

from . import main

sys.exit(main())
