"""What each operator is for fusion: its pattern kind (TVM's elementwise < broadcast <
injective < reduction < out-elementwise-fusable < opaque), declared as data here, for
ONNX's ops and kiln's own (the NCHWc layout ops, the packed MatMul), never registered
as a side effect of importing a pass. The partitioner (kiln.lower.partition) reads a
kind only through `declared_kind`.
"""

from __future__ import annotations

import enum


class Kind(enum.IntEnum):
    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_FUSABLE = 4
    OPAQUE = 5


ELEMWISE_OPS = """Abs Acos Acosh Asin Asinh Atan Atanh Cast Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu
HardSigmoid HardSwish IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu Round Selu Shrink Sigmoid
Sign Sin Sinh Softplus Softsign Sqrt Swish Tan Tanh ThresholdedRelu BitwiseNot""".split()
BROADCAST_OPS = """Add Sub Mul Div Pow Mod PRelu And Or Xor Equal Less LessOrEqual Greater GreaterOrEqual
Where Max Min Sum Mean BitShift BitwiseAnd BitwiseOr BitwiseXor Clip CastLike""".split()
INJECTIVE_OPS = """Reshape Flatten Squeeze Unsqueeze Transpose Identity Expand Slice Tile Pad Concat
DepthToSpace SpaceToDepth Gather""".split()
REDUCTION_OPS = """ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
ReduceLogSumExp ReduceSumSquare ArgMax ArgMin Softmax LogSoftmax LayerNormalization
RMSNormalization GlobalAveragePool GlobalMaxPool""".split()
OUT_FUSABLE_OPS = "Conv ConvTranspose MatMul Gemm".split()

# (domain, op) -> kind; ONNX ops have domain "", kiln's own "kiln"; an op not listed is opaque
KINDS = {("", o): k for ops, k in ((ELEMWISE_OPS, Kind.ELEMWISE), (BROADCAST_OPS, Kind.BROADCAST),
                                   (INJECTIVE_OPS, Kind.INJECTIVE), (REDUCTION_OPS, Kind.REDUCTION),
                                   (OUT_FUSABLE_OPS, Kind.OUT_FUSABLE)) for o in ops}
KINDS.update({
    ("kiln", "ToNCHWc"): Kind.INJECTIVE,          # kiln.ops.layout
    ("kiln", "FromNCHWc"): Kind.INJECTIVE,
    ("kiln", "ConvNCHWc"): Kind.OUT_FUSABLE,
    ("kiln", "MaxPoolNCHWc"): Kind.OPAQUE,
    ("kiln", "MatMulPacked"): Kind.OUT_FUSABLE,   # kiln.ops.packed
})

# Ops that only remap indices (no arithmetic on values), which may fold into a consumer
PROLOGUE_OPS = {("", o) for o in "Transpose Reshape Flatten Squeeze Unsqueeze Identity Expand Slice".split()}

# ... of which these only reinterpret a contiguous buffer: alone they cost no kernel
# (lowering aliases them), so folding them gains nothing
VIEW_OPS = {("", o) for o in "Reshape Flatten Squeeze Unsqueeze Identity".split()}


def declared_kind(domain: str, op: str) -> Kind:
    """The fusion kind op (`domain`, `op`) declares (opaque when it declares none)."""
    return KINDS.get((domain, op), Kind.OPAQUE)
