"""Targets: what `kiln.compile(..., target=...)` returns a model for (`cpu`: native code,
kiln.targets.cpu), and the CPU that code is generated for (`Target`, kiln.targets.target)."""

from kiln.targets.target import Target

__all__ = ["Target"]
