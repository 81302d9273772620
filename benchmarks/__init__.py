"""kiln's benchmarks. Whatever imports this package times kiln's -O3 builds: a big module is
otherwise returned at a quick tier first (kiln.codegen.tiers), and its first runs would measure
-Og code. benchmarks/compile_time.py measures the default (tiered) cold compile on purpose."""

import os

os.environ.setdefault("KILN_TIER", "full")
