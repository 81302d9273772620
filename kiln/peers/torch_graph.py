"""PyTorch eager as a benchmarking peer: an ONNX model run op by op with torch functions.

kiln's ONNX frontend imports the model into a kiln `Graph`; each node (in their
topological order) is bound once to a torch function with its attributes, and
every constant becomes a torch tensor once, up front. Running is eager torch under
`torch.inference_mode()` with `torch.set_num_threads(threads)`, which is what a
PyTorch user deploying the same network gets (no converter such as onnx2torch,
which would pull in torchvision). An op this module does not know is found before
anything runs: one KilnError lists every such node.

This is a peer for `kiln bench` and `benchmarks/run.py`, not part of the compiler
or the runtime; it needs torch (`pip install -e ".[torch]"`).
"""

from __future__ import annotations

import math
import os

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node
from kiln.targets.target import host_cores

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the module imports; TorchGraph says what is missing
    torch = F = None


def need_torch():
    if torch is None:
        raise KilnError('the torch peer needs PyTorch: pip install -e ".[torch]"')
    return torch


# ---------------------------------------------------------------- dtypes

_TORCH_DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
                 "int8": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64",
                 "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool"}


def torch_dtype(dt: DType):
    name = _TORCH_DTYPES.get(dt.name)
    return None if name is None else getattr(torch, name)


def to_torch(x) -> "torch.Tensor":
    x = np.asarray(x)  # (np.ascontiguousarray would make a 0-d array 1-d)
    if not (x.flags.c_contiguous and x.flags.writeable):  # torch tensors are writable: never alias
        x = np.array(x, order="C")                        # read-only memory
    if x.dtype == DType.bfloat16.np:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def to_numpy(t: "torch.Tensor") -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bfloat16.np)
    return t.numpy()


def ints(t) -> list[int]:
    """A shape-like input (int64 tensor) as Python ints."""
    return [int(v) for v in t.reshape(-1).tolist()]


# ---------------------------------------------------------------- ops
#
# Each builder takes (node, opset) and returns fn(*inputs) -> tensor | tuple of tensors,
# its attributes read once. Inputs absent in the node are None.

OPS: dict = {}


def op(*names):
    def register(builder):
        for n in names:
            OPS[n] = builder
        return builder
    return register


def _unary(fn):
    return lambda node, opset: fn


for _name, _fn in {
    "Relu": lambda x: torch.relu(x), "Sigmoid": lambda x: torch.sigmoid(x), "Tanh": lambda x: torch.tanh(x),
    "Exp": lambda x: torch.exp(x), "Log": lambda x: torch.log(x), "Sqrt": lambda x: torch.sqrt(x),
    "Erf": lambda x: torch.erf(x), "Neg": lambda x: torch.neg(x), "Abs": lambda x: torch.abs(x),
    "Reciprocal": lambda x: torch.reciprocal(x), "Floor": lambda x: torch.floor(x),
    "Ceil": lambda x: torch.ceil(x), "Round": lambda x: torch.round(x), "Sin": lambda x: torch.sin(x),
    "Cos": lambda x: torch.cos(x), "Sign": lambda x: torch.sign(x), "Not": lambda x: torch.logical_not(x),
    "Softsign": lambda x: F.softsign(x), "Softplus": lambda x: F.softplus(x),
    "Identity": lambda x: x, "IsNaN": lambda x: torch.isnan(x),
}.items():
    OPS[_name] = _unary(_fn)

for _name, _fn in {
    "Add": lambda a, b: torch.add(a, b), "Sub": lambda a, b: torch.sub(a, b),
    "Mul": lambda a, b: torch.mul(a, b), "MatMul": lambda a, b: torch.matmul(a, b),
    "Equal": lambda a, b: torch.eq(a, b), "Less": lambda a, b: torch.lt(a, b),
    "LessOrEqual": lambda a, b: torch.le(a, b), "Greater": lambda a, b: torch.gt(a, b),
    "GreaterOrEqual": lambda a, b: torch.ge(a, b), "And": lambda a, b: torch.logical_and(a, b),
    "Or": lambda a, b: torch.logical_or(a, b), "Xor": lambda a, b: torch.logical_xor(a, b),
    "Where": lambda c, a, b: torch.where(c, a, b), "PRelu": lambda x, s: torch.where(x < 0, x * s, x),
}.items():
    OPS[_name] = _unary(_fn)


@op("Div")
def _div(node, opset):
    def div(a, b):
        if a.is_floating_point():
            return torch.div(a, b)
        return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates
    return div


@op("Pow")
def _pow(node, opset):
    return lambda a, b: torch.pow(a, b).to(a.dtype)  # the base's dtype, as ONNX says


@op("Mod")
def _mod(node, opset):
    if node.attrs.get("fmod", 0):
        return lambda a, b: torch.fmod(a, b)
    return lambda a, b: torch.remainder(a, b)


@op("Max", "Min", "Sum", "Mean")
def _variadic(node, opset):
    fn = {"Max": torch.maximum, "Min": torch.minimum, "Sum": torch.add, "Mean": torch.add}[node.op]

    def run(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out / len(xs) if node.op == "Mean" else out
    return run


@op("LeakyRelu")
def _leaky(node, opset):
    alpha = node.attrs.get("alpha", 0.01)
    return lambda x: F.leaky_relu(x, alpha)


@op("Elu")
def _elu(node, opset):
    alpha = node.attrs.get("alpha", 1.0)
    return lambda x: F.elu(x, alpha)


@op("HardSigmoid")
def _hard_sigmoid(node, opset):
    a, b = node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)
    return lambda x: torch.clamp(x * a + b, 0, 1)


@op("HardSwish")
def _hard_swish(node, opset):
    return lambda x: F.hardswish(x)


@op("Gelu")
def _gelu(node, opset):
    approximate = node.attrs.get("approximate", "none")
    return lambda x: F.gelu(x, approximate=approximate)


@op("Clip")
def _clip(node, opset):
    if opset < 11:
        lo, hi = node.attrs.get("min", -math.inf), node.attrs.get("max", math.inf)
        return lambda x: torch.clamp(x, lo, hi)
    return lambda x, lo=None, hi=None: torch.clamp(x, lo, hi)


@op("Cast")
def _cast(node, opset):
    dt = torch_dtype(DType.from_onnx(node.attrs["to"]))
    return lambda x: x.to(dt)


@op("CastLike")
def _cast_like(node, opset):
    return lambda x, like: x.to(like.dtype)


@op("Dropout")
def _dropout(node, opset):  # inference: the identity (and an all-true mask if asked)
    return lambda x, *rest: (x, torch.ones(x.shape, dtype=torch.bool)) if len(node.outputs) > 1 else x


def _pads(node, rank: int, shape, kernel, strides, dilations) -> list[int]:
    """ONNX pads [b1.., e1..] for the spatial dims, auto_pad resolved against `shape`."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        return list(node.attrs.get("pads", [0] * 2 * rank)) if auto == "NOTSET" else [0] * 2 * rank
    begin, end = [], []
    for i in range(rank):
        out = -(-shape[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - shape[i])
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def _padded(x, pads: list[int], value: float = 0.0):
    """x with ONNX-ordered spatial pads applied when they are not symmetric; returns
    (x, symmetric per-dim padding for the torch op)."""
    rank = len(pads) // 2
    if pads[:rank] == pads[rank:]:
        return x, pads[:rank]
    torch_pads = []
    for i in reversed(range(rank)):  # F.pad wants the last dim first
        torch_pads += [pads[i], pads[i + rank]]
    return F.pad(x, torch_pads, value=value), [0] * rank


_CONV = {1: "conv1d", 2: "conv2d", 3: "conv3d"}


@op("Conv")
def _conv(node, opset):
    group = node.attrs.get("group", 1)

    def conv(x, w, b=None):
        rank = x.dim() - 2
        kernel = list(w.shape[2:])
        strides = node.attrs.get("strides", [1] * rank)
        dilations = node.attrs.get("dilations", [1] * rank)
        pads = _pads(node, rank, x.shape[2:], kernel, strides, dilations)
        x, padding = _padded(x, pads)
        return getattr(F, _CONV[rank])(x, w, b, strides, padding, dilations, group)
    return conv


@op("ConvTranspose")
def _conv_transpose(node, opset):
    group = node.attrs.get("group", 1)

    def conv_t(x, w, b=None):
        rank = x.dim() - 2
        strides = node.attrs.get("strides", [1] * rank)
        dilations = node.attrs.get("dilations", [1] * rank)
        pads = node.attrs.get("pads", [0] * 2 * rank)
        if pads[:rank] != pads[rank:] or "output_shape" in node.attrs or \
                node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            raise KilnError("ConvTranspose with asymmetric pads, auto_pad or output_shape is not "
                            "supported by the torch peer", node=node.name, op=node.op)
        fn = getattr(F, f"conv_transpose{rank}d")
        return fn(x, w, b, strides, pads[:rank], node.attrs.get("output_padding", [0] * rank), group,
                  dilations)
    return conv_t


@op("MaxPool", "AveragePool")
def _pool(node, opset):
    kernel = node.attrs["kernel_shape"]
    rank = len(kernel)
    strides = node.attrs.get("strides", [1] * rank)
    dilations = node.attrs.get("dilations", [1] * rank)
    ceil = bool(node.attrs.get("ceil_mode", 0))
    include_pad = bool(node.attrs.get("count_include_pad", 0))

    def pool(x):
        pads = _pads(node, rank, x.shape[2:], kernel, strides, dilations)
        if node.op == "MaxPool":
            x, padding = _padded(x, pads, -math.inf)
            return getattr(F, f"max_pool{rank}d")(x, kernel, strides, padding, dilations, ceil)
        if pads[:rank] != pads[rank:] and include_pad:
            x, padding = _padded(x, pads)
        elif pads[:rank] != pads[rank:]:
            raise KilnError("AveragePool with asymmetric pads that exclude the padding is not "
                            "supported by the torch peer", node=node.name, op=node.op)
        else:
            padding = pads[:rank]
        return getattr(F, f"avg_pool{rank}d")(x, kernel, strides, padding, ceil, include_pad)
    return pool


@op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node, opset):
    if node.op == "GlobalAveragePool":
        return lambda x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True)
    return lambda x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op("BatchNormalization")
def _batch_norm(node, opset):
    eps = node.attrs.get("epsilon", 1e-5)
    return lambda x, scale, bias, mean, var: F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)


@op("InstanceNormalization")
def _instance_norm(node, opset):
    eps = node.attrs.get("epsilon", 1e-5)
    return lambda x, scale, bias: F.instance_norm(x, weight=scale, bias=bias, eps=eps)


@op("LayerNormalization")
def _layer_norm(node, opset):
    axis, eps = node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5)

    def layer_norm(x, scale, bias=None):
        shape = x.shape[axis % x.dim():]
        scale, bias = scale.expand(shape), None if bias is None else bias.expand(shape)
        return F.layer_norm(x, shape, scale, bias, eps)
    return layer_norm


@op("Gemm")
def _gemm(node, opset):
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    def gemm(a, b, c=None):
        a, b = (a.t() if ta else a), (b.t() if tb else b)
        if c is None:
            return torch.mm(a, b) * alpha if alpha != 1 else torch.mm(a, b)
        return torch.addmm(c, a, b, beta=beta, alpha=alpha)
    return gemm


@op("Einsum")
def _einsum(node, opset):
    eq = node.attrs["equation"]
    return lambda *xs: torch.einsum(eq, *xs)


@op("Softmax", "LogSoftmax")
def _softmax(node, opset):
    fn = torch.softmax if node.op == "Softmax" else torch.log_softmax
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)
    if opset >= 13:
        return lambda x: fn(x, axis)

    def coerced(x):  # before opset 13: over all dims from `axis` on, as one
        a = axis % x.dim()
        return fn(x.reshape(math.prod(x.shape[:a]), -1), 1).reshape(x.shape)
    return coerced


def _axes_attr_or_input(node, opset: int, since: int):
    """Reduce-style axes: the attribute before opset `since`, the second input from it on."""
    if opset < since:
        axes = node.attrs.get("axes")
        return lambda x, *_: axes
    return lambda x, axes=None: None if axes is None else ints(axes)


@op("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare")
def _reduce(node, opset):
    keep = bool(node.attrs.get("keepdims", 1))
    noop = bool(node.attrs.get("noop_with_empty_axes", 0))
    axes_of = _axes_attr_or_input(node, opset, 13 if node.op == "ReduceSum" else 18)
    reduce = {"ReduceMean": lambda x, d: x.mean(d, keepdim=keep),
              "ReduceSum": lambda x, d: x.sum(d, keepdim=keep),
              "ReduceMax": lambda x, d: x.amax(d, keepdim=keep),
              "ReduceMin": lambda x, d: x.amin(d, keepdim=keep),
              "ReduceSumSquare": lambda x, d: (x * x).sum(d, keepdim=keep),
              "ReduceL2": lambda x, d: torch.sqrt((x * x).sum(d, keepdim=keep)),
              "ReduceProd": _prod(keep)}[node.op]

    def run(x, *rest):
        axes = axes_of(x, *rest)
        if not axes:
            if noop:
                return x
            axes = list(range(x.dim()))
        return reduce(x, tuple(a % x.dim() for a in axes) if x.dim() else ())
    return run


def _prod(keep):
    def prod(x, dims):
        for d in sorted(dims, reverse=True):
            x = x.prod(d, keepdim=keep)
        return x
    return prod


@op("ArgMax", "ArgMin")
def _arg(node, opset):
    axis, keep = node.attrs.get("axis", 0), bool(node.attrs.get("keepdims", 1))
    fn = torch.argmax if node.op == "ArgMax" else torch.argmin
    if node.attrs.get("select_last_index", 0):
        return lambda x: (x.shape[axis] - 1 - fn(x.flip(axis), axis, keep))
    return lambda x: fn(x, axis, keep)


@op("Flatten")
def _flatten(node, opset):
    axis = node.attrs.get("axis", 1)
    return lambda x: x.reshape(math.prod(x.shape[:axis + x.dim() if axis < 0 else axis]), -1)


@op("Reshape")
def _reshape(node, opset):
    allowzero = node.attrs.get("allowzero", 0)

    def reshape(x, shape):
        s = ints(shape)
        if not allowzero:
            s = [x.shape[i] if d == 0 else d for i, d in enumerate(s)]
        return x.reshape(s)
    return reshape


@op("Transpose")
def _transpose(node, opset):
    perm = node.attrs.get("perm")
    return lambda x: x.permute(perm if perm is not None else list(reversed(range(x.dim()))))


@op("Squeeze", "Unsqueeze")
def _squeeze(node, opset):
    axes_of = _axes_attr_or_input(node, opset, 13)
    if node.op == "Squeeze":
        def squeeze(x, *rest):
            axes = axes_of(x, *rest)
            if axes is None:
                return x.squeeze()
            return x.squeeze(tuple(a % x.dim() for a in axes)) if axes else x
        return squeeze

    def unsqueeze(x, *rest):
        axes = axes_of(x, *rest)
        rank = x.dim() + len(axes)
        for a in sorted(a % rank for a in axes):
            x = x.unsqueeze(a)
        return x
    return unsqueeze


@op("Concat")
def _concat(node, opset):
    axis = node.attrs["axis"]
    return lambda *xs: torch.cat(xs, axis)


@op("Split")
def _split(node, opset):
    axis, n = node.attrs.get("axis", 0), len(node.outputs)

    def split(x, sizes=None):
        if sizes is not None:
            parts = ints(sizes)
        elif "split" in node.attrs:
            parts = node.attrs["split"]
        else:  # equal parts, the last one smaller (opset 18's num_outputs)
            size = x.shape[axis]
            parts = -(-size // n)
        return tuple(torch.split(x, parts, axis))
    return split


@op("Slice")
def _slice(node, opset):
    def slice_(x, starts, ends, axes=None, steps=None):
        starts, ends = ints(starts), ints(ends)
        axes = ints(axes) if axes is not None else list(range(len(starts)))
        steps = ints(steps) if steps is not None else [1] * len(starts)
        return _slice_tensor(x, starts, ends, axes, steps)
    if opset < 10:
        starts, ends, axes = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes")
        return lambda x: _slice_tensor(x, starts, ends, axes or list(range(len(starts))), [1] * len(starts))
    return slice_


def _slice_tensor(x, starts, ends, axes, steps):
    index = [slice(None)] * x.dim()
    flips = []
    for s, e, a, k in zip(starts, ends, axes, steps):
        a %= x.dim()
        n = x.shape[a]
        if k > 0:
            s = min(max(s + n if s < 0 else s, 0), n)
            e = min(max(e + n if e < 0 else e, 0), n)
            index[a] = slice(s, max(s, e), k)
        else:  # torch has no negative steps: flip, then slice forwards
            s = min(max(s + n if s < 0 else s, -1), n - 1)
            e = min(max(e + n if e < 0 else e, -1), n - 1)
            flips.append(a)
            index[a] = slice(n - 1 - s, max(n - 1 - s, n - 1 - e), -k)
    if flips:
        x = x.flip(flips)
    return x[tuple(index)]


@op("Gather")
def _gather(node, opset):
    axis = node.attrs.get("axis", 0)

    def gather(x, idx):
        a = axis % x.dim()
        idx = torch.where(idx < 0, idx + x.shape[a], idx)
        out = x.index_select(a, idx.reshape(-1))
        return out.reshape(x.shape[:a] + idx.shape + x.shape[a + 1:])
    return gather


@op("GatherElements")
def _gather_elements(node, opset):
    axis = node.attrs.get("axis", 0)
    return lambda x, idx: torch.gather(x, axis, torch.where(idx < 0, idx + x.shape[axis], idx))


@op("Shape")
def _shape(node, opset):
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return lambda x: torch.tensor(x.shape[start:end], dtype=torch.int64)


@op("Size")
def _size(node, opset):
    return lambda x: torch.tensor(x.numel(), dtype=torch.int64)


@op("Expand")
def _expand(node, opset):
    return lambda x, shape: x.expand(torch.broadcast_shapes(x.shape, tuple(ints(shape))))


@op("Tile")
def _tile(node, opset):
    return lambda x, reps: x.repeat(ints(reps))


@op("ConstantOfShape")
def _constant_of_shape(node, opset):
    value = node.attrs.get("value")
    fill = to_torch(np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(1))
    return lambda shape: fill.expand(ints(shape)).clone()


@op("Range")
def _range(node, opset):
    return lambda start, limit, delta: torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


@op("Pad")
def _pad(node, opset):
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[node.attrs.get("mode", "constant")]

    def pad(x, pads=None, value=None, axes=None):
        p = node.attrs["pads"] if opset < 11 else ints(pads)
        v = node.attrs.get("value", 0.0) if opset < 11 else (0 if value is None else value.item())
        rank = len(p) // 2
        dims = ints(axes) if axes is not None else list(range(rank))
        full = [0] * (2 * x.dim())
        for j, a in enumerate(dims):
            a %= x.dim()
            full[2 * (x.dim() - 1 - a)] = p[j]
            full[2 * (x.dim() - 1 - a) + 1] = p[j + rank]
        while len(full) > 2 and full[-2:] == [0, 0] and mode != "constant":
            full = full[:-2]  # torch pads only trailing dims in reflect/replicate mode
        return F.pad(x, full, mode=mode, value=v) if mode == "constant" else F.pad(x, full, mode=mode)
    return pad


def _check(node: Node, opset: int) -> str | None:
    """Why the peer cannot run `node` (None if it can)."""
    if node.domain:
        return f"{node.domain}::{node.op} (no torch mapping)"
    if node.op == "Constant":
        return None if _constant_of(node) is not None else "Constant with a non-tensor value"
    if node.op not in OPS:
        return f"{node.op} (no torch mapping)"
    if node.op == "Cast" and torch_dtype(DType.from_onnx(node.attrs["to"])) is None:
        return f"Cast to {DType.from_onnx(node.attrs['to']).name} (torch has no such dtype)"
    if node.op in ("LayerNormalization", "BatchNormalization") and \
            any(v is not None for v in node.outputs[1:]):
        return f"{node.op} with its training outputs"
    if node.op == "Pad" and node.attrs.get("mode", "constant") not in ("constant", "reflect", "edge"):
        return f"Pad mode {node.attrs['mode']}"
    return None


def _constant_of(node: Node):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            v = node.attrs[key]
            if key.startswith("value_float"):
                return np.asarray(v, np.float32)
            if key.startswith("value_int"):
                return np.asarray(v, np.int64)
            return np.asarray(v) if isinstance(v, np.ndarray) else None
    return None


# ---------------------------------------------------------------- the executor

class TorchGraph:
    """A kiln Graph (or ONNX model: path, bytes, ModelProto) run by eager torch.

    `peer(feeds) -> {output name: numpy array}`; feeds are numpy arrays by input name.
    """

    def __init__(self, model, threads: int | None = None):
        need_torch()
        if not isinstance(model, Graph):
            from kiln.frontends.onnx import load_onnx
            model = load_onnx(model, infer=False)  # torch needs no types: any op torch maps runs
        self.graph = model
        opset = model.opset("")
        bad = [(n, why) for n in model.nodes if (why := _check(n, opset)) is not None]
        if bad:
            listed = ", ".join(f"{why} at node {n.name!r}" for n, why in bad)
            raise KilnError(f"the torch peer cannot run {len(bad)} node(s): {listed}")
        self.threads = threads or host_cores()
        torch.set_num_threads(self.threads)
        self.env0 = {v.id: to_torch(v.const) for v in model.constants()}  # weights, once
        self.steps = []
        for n in model.nodes:
            if n.op == "Constant":
                self.env0[n.outputs[0].id] = to_torch(_constant_of(n))
                continue
            ins = [None if v is None else v.id for v in n.inputs]
            while ins and ins[-1] is None:
                ins.pop()  # trailing optional inputs: the builders' defaults
            outs = [None if v is None else v.id for v in n.outputs]
            self.steps.append((OPS[n.op](n, opset), ins, outs, n))
        self.inputs = [(v.name, v.id) for v in model.inputs]
        self.outputs = [(v.name, v.id) for v in model.outputs]

    def __call__(self, feeds: dict) -> dict:
        env = dict(self.env0)
        missing = [name for name, _ in self.inputs if name not in feeds]
        if missing:
            raise KilnError(f"torch peer: missing input(s) {missing}")
        for name, vid in self.inputs:
            env[vid] = to_torch(feeds[name])
        with torch.inference_mode():
            for fn, ins, outs, node in self.steps:
                try:
                    res = fn(*[None if i is None else env[i] for i in ins])
                except KilnError:
                    raise
                except Exception as e:  # torch's own complaint, with the node that caused it
                    raise KilnError(f"torch peer: {type(e).__name__}: {str(e).splitlines()[0]}",
                                    node=node.name, op=node.op) from None
                if len(outs) == 1:
                    env[outs[0]] = res
                else:
                    for vid, r in zip(outs, res):
                        if vid is not None:
                            env[vid] = r
        return {name: to_numpy(env[vid]) for name, vid in self.outputs}
