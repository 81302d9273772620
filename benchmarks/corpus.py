"""`python benchmarks/corpus.py [build|run|list] ...`: the corpus benchmark (benchmarks/corpus/).

The same as `python -m benchmarks.corpus`; see benchmarks/corpus/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.corpus.__main__ import main  # noqa: E402  (the package, not this file)

if __name__ == "__main__":
    sys.exit(main())
