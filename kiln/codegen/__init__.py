"""Code generation: loop IR -> target source, and building it (compiler, cache, loading).

Its names are imported on first use: the cache keys need kiln.codegen.toolchain alone,
and a warm compile should not pay for importing the C emitter."""

# public name -> module that defines it
_LAZY = {"CModule": "kiln.codegen.build", "Kernel": "kiln.codegen.build", "build_c": "kiln.codegen.build",
         "cache_dir": "kiln.codegen.build", "compile_c": "kiln.codegen.build",
         "emit_c": "kiln.codegen.c", "func_symbol": "kiln.codegen.c"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln.codegen' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
