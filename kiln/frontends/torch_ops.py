"""Core ATen ops as kiln (ONNX-semantics) nodes: one handler per op overload.

A handler gets the translator, the FX node and the node's arguments with every
FX node replaced by its kiln value (a `Value`, a `SymInt` for sizes read at run
time, or a python number), and returns the op's result in torch's structure
(a value, or a tuple for ops with several outputs). Dtypes follow the FX
node's metadata, so torch's type promotion is reproduced by explicit Casts.

The handlers live by family: `torch_ops_math` (plumbing, elementwise, comparisons, matrix
products), `torch_ops_nn` (layers, reductions), `torch_ops_shape` (views, indexing,
creation, symbolic sizes); each registers into the table of `torch_ops_common` as it is
imported, and this module imports them all, so its `TABLE` is complete.
"""

from kiln.frontends import torch_ops_math, torch_ops_nn, torch_ops_shape  # noqa: F401  (register their handlers)
from kiln.frontends.torch_ops_common import TABLE  # noqa: F401
