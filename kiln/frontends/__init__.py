"""Frontends: framework models in, kiln `Graph` out."""
