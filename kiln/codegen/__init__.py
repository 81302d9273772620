"""Code generation: loop IR -> target source, and building it (compiler, cache, loading)."""

from kiln.codegen.build import CModule, Kernel, build_c, cache_dir, compile_c
from kiln.codegen.c import emit_c, func_symbol

__all__ = ["CModule", "Kernel", "build_c", "cache_dir", "compile_c", "emit_c", "func_symbol"]
