"""``python -m lattice.bench``: see ``lattice.bench`` and docs/benchmarks.md."""
import sys

from . import main

sys.exit(main())
