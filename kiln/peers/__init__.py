"""Peers that `kiln bench` and benchmarks/run.py time kiln against (not part of the compiler)."""
