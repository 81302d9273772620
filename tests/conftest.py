"""Test-wide settings: the graph verifier runs after every pass of every compile in the
suite (conformance at -O3 included), not only in the pass tests that ask for it; fork decisions
take the table's fork cost and stream rate, not this machine's measured ones
(kiln.codegen.fork_cost, kiln.codegen.stream_cost), so the code a test compiles does not depend
on the load when the machine was measured. Compiles build at -O3 at once (KILN_TIER=full): a
quick tier's background build would outlive its test, and its compiler runs and cache writes
would land in the next one's (tests/targets/test_tiered_build.py asks for tier="auto")."""

import os

os.environ.setdefault("KILN_VERIFY", "1")
os.environ.setdefault("KILN_FORK_US", "table")
os.environ.setdefault("KILN_STREAM_RATE", "table")
os.environ.setdefault("KILN_TIER", "full")
