"""kiln: a deep-learning compiler. ONNX in, native code out."""

from kiln.errors import KilnError, UnsupportedOpsError  # noqa: F401
from kiln.compiler import compile  # noqa: F401,A004
from kiln.frontends.onnx import load_onnx  # noqa: F401
from kiln.runtime.model import CompiledModel, TensorSpec  # noqa: F401

__version__ = "0.1.0"
