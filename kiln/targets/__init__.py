"""Targets: what `kiln.compile(..., target=...)` returns a model for."""
