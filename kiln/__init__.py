"""kiln: a deep-learning compiler. ONNX in, native code out.

`import kiln` is cheap: the compiler (`compile`, `load_onnx`, `save`) is
imported on first use, so `kiln.load` of a saved artifact pulls in the
runtime alone (numpy and ctypes), as a deployment needs.
"""

from kiln.errors import DTypeMismatchError, KilnError, UnsupportedOpsError  # noqa: F401

__version__ = "0.1.0"

# public name -> module that defines it, imported on first access
_LAZY = {
    "compile": "kiln.compiler",
    "load_onnx": "kiln.frontends.onnx",
    "save": "kiln.export",
    "load": "kiln.runtime.artifact",
    "CompiledModel": "kiln.runtime.model",
    "TensorSpec": "kiln.runtime.model",
    "Target": "kiln.targets.target",
    "Decoder": "kiln.decode",
}

__all__ = ["DTypeMismatchError", "KilnError", "UnsupportedOpsError", "__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
