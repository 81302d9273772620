"""Operator semantics: one definition per operator, grouped by family.

Importing this package registers every family. See `registry.py` for the
shape of an op definition.
"""

from kiln.ops import (  # noqa: F401
    elementwise,
    tensor,
    indexing,
    nn,
    image,
    reduce,
    linalg,
    attention,
    fused_attention,
    rotary,
    quant,
    loss,
    control,
    sequence,
    rnn,
    recurrent,
    strings,
    signal,
    random,
    detection,
    ml_common,
    ml,
    ml_trees,
    ml_linear,
    ml_svm,
    ml_preprocess,
    training,
    layout,
    inverted_residual,
    packed,
    winograd,
    winograd1d,
)
from kiln.ops.registry import REGISTRY, OpDef, lookup  # noqa: F401
