"""The bridge from a partitioned graph to one loop-level module (arena plan, call sequence)."""
