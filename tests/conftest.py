"""Test-wide settings: the graph verifier runs after every pass of every compile in the
suite (conformance at -O3 included), not only in the pass tests that ask for it; fork decisions
take the table's fork cost and stream rate, not this machine's measured ones
(kiln.codegen.fork_cost, kiln.codegen.stream_cost), so the code a test compiles does not depend
on the load when the machine was measured."""

import os

os.environ.setdefault("KILN_VERIFY", "1")
os.environ.setdefault("KILN_FORK_US", "table")
os.environ.setdefault("KILN_STREAM_RATE", "table")
