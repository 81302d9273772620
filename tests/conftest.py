"""Test-wide settings: the graph verifier runs after every pass of every compile in the
suite (conformance at -O3 included), not only in the pass tests that ask for it."""

import os

os.environ.setdefault("KILN_VERIFY", "1")
