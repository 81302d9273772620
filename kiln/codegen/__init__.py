"""Code generation: loop IR -> target source, and building it (compiler, cache, loading)."""

from kiln.codegen.build import CModule, Kernel, build_c, cache_dir, compile_c
from kiln.codegen.c import emit_c, func_symbol
from kiln.codegen.cpu import cpu_features, vector_bytes, vector_lanes

__all__ = ["CModule", "Kernel", "build_c", "cache_dir", "compile_c", "emit_c", "func_symbol",
           "cpu_features", "vector_bytes", "vector_lanes"]
