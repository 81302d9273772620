"""RNN / GRU / LSTM with constant weights → one input-projection GEMM + kiln::Recurrent.

The input's share of every gate, x_t @ W^T + biases, does not depend on the state:
for all steps and both directions it is one [steps * batch, I] x [I, nd * G * H]
GEMM, which kiln's packed GEMM runs at full speed, where a loop over steps would
run it as skinny GEMVs. This pass rewrites

    LSTM|GRU|RNN(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?)
      W, R (and B) constants, float32
    →  xw = Add(MatMul(X, Wt), bias)            Wt = [I, nd * G * H], bias = Wb + Rb
       kiln::Recurrent(xw, pack_r(R), rbh?, sequence_lens?, initial_h?, initial_c?, P?)

(kiln.ops.recurrent), leaving the recurrent op only the state's GEMV per step,
with R packed once here. pack_weights then packs Wt and fusion folds the bias
into the GEMM's epilogue. GRU with linear_before_reset keeps its h-gate's
recurrent bias apart (it is added before the reset gate multiplies): `rbh`.
Other dtypes and non-constant weights keep the ONNX op (its own kernel).
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node
from kiln.ops.recurrent import DOMAIN, GATES, pack_r
from kiln.ops.rnn import _DIRS
from kiln.passes.edit import Namer, new_const, new_node
from kiln.passes.registry import PassContext, graph_pass

LANES = 16  # floats per panel row: one 64-byte cache line (two AVX2 or one AVX-512 vector)
_KEEP = ("direction", "layout", "activations", "activation_alpha", "activation_beta", "clip",
         "linear_before_reset", "input_forget")


def _const(node: Node, i: int):
    v = node.inputs[i] if i < len(node.inputs) else None
    return None if v is None else v.const


def _plan(node: Node):
    """(W, R, B, nd, G, H) when `node` can be decomposed, else None."""
    if node.domain or node.op not in GATES or len(node.inputs) < 3 or node.inputs[0] is None:
        return None
    x = node.inputs[0].type
    # the input size static; steps and batch may be symbols (a shape-generic module): the
    # projection is then a 3-D MatMul, [steps, batch, I] x [I, nd * G * H]
    if getattr(x, "dtype", None) != DType.float32 or x.shape is None or len(x.shape) != 3 \
            or not isinstance(x.shape[2], int):
        return None
    w, r, b = _const(node, 1), _const(node, 2), _const(node, 3)
    has_b = len(node.inputs) > 3 and node.inputs[3] is not None
    if w is None or r is None or (has_b and b is None):
        return None
    nd, g = _DIRS.get(node.attrs.get("direction", "forward")), GATES[node.op]
    if nd is None or w.ndim != 3 or r.ndim != 3:
        return None
    hs = int(node.attrs.get("hidden_size", r.shape[-1]))
    if w.shape != (nd, g * hs, x.shape[2]) or r.shape != (nd, g * hs, hs) or hs == 0 \
            or (b is not None and b.shape != (nd, 2 * g * hs)):
        return None
    b = np.zeros((nd, 2 * g * hs), np.float32) if b is None else b
    return w.astype(np.float32), r.astype(np.float32), b.astype(np.float32), nd, g, hs


def decompose(graph: Graph) -> int:
    """Rewrite every decomposable recurrent node in place; the number rewritten."""
    namer, nodes, count = Namer(graph), [], 0
    for node in graph.nodes:
        plan = _plan(node)
        if plan is None:
            nodes.append(node)
            continue
        w, r, b, nd, g, hs = plan
        gh, lbr = g * hs, node.op == "GRU" and bool(node.attrs.get("linear_before_reset", 0))
        wb, rb = b[:, :gh], b[:, gh:].copy()
        rbh = rb[:, 2 * hs:].copy() if lbr else None
        if lbr:
            rb[:, 2 * hs:] = 0
        base = node.name or node.op
        wt = new_const(namer, f"{base}.Wt", np.ascontiguousarray(w.transpose(2, 0, 1).reshape(w.shape[2], nd * gh)))
        shape = node.inputs[0].type.shape
        static = all(isinstance(d, int) for d in shape)
        x2d = node.inputs[0]
        if static:   # (a symbolic steps * batch is no Reshape constant: the MatMul takes 3-D X)
            flat = new_node(graph, "Reshape", [x2d, new_const(namer, f"{base}.rows", np.array(
                [shape[0] * shape[1], shape[2]], np.int64))], namer.fresh(f"{base}/rows"), [namer.fresh(f"{base}.x2d")])
            nodes.append(flat)
            x2d = flat.outputs[0]
        mm = new_node(graph, "MatMul", [x2d, wt], namer.fresh(f"{base}/input_projection"),
                      [namer.fresh(f"{base}.xw_nobias")])
        nodes.append(mm)
        xw = mm.outputs[0]
        bias = (wb + rb).reshape(nd * gh)
        if bias.any():
            add = new_node(graph, "Add", [xw, new_const(namer, f"{base}.bias", bias)],
                           namer.fresh(f"{base}/input_bias"), [namer.fresh(f"{base}.xw")])
            nodes.append(add)
            xw = add.outputs[0]
        if static:
            back = new_node(graph, "Reshape", [xw, new_const(namer, f"{base}.steps", np.array(
                [shape[0], shape[1], nd * gh], np.int64))], namer.fresh(f"{base}/steps"), [namer.fresh(f"{base}.xw3d")])
            nodes.append(back)
            xw = back.outputs[0]
        rest = [node.inputs[i] if i < len(node.inputs) else None for i in range(4, 8)]
        ins = [xw, new_const(namer, f"{base}.Rpacked", pack_r(r, g, LANES)),
               None if rbh is None or not rbh.any() else new_const(namer, f"{base}.rbh", rbh), *rest]
        while ins and ins[-1] is None:
            ins.pop()
        attrs = {k: node.attrs[k] for k in _KEEP if k in node.attrs}
        attrs.update(kind=node.op, hidden_size=hs)
        nodes.append(Node("Recurrent", ins, list(node.outputs), attrs, node.name, DOMAIN))
        count += 1
    graph.nodes = nodes
    if count:
        graph.opsets.setdefault(DOMAIN, 1)
    return count


@graph_pass("decompose_recurrent")
def decompose_recurrent(graph: Graph, ctx: PassContext) -> Graph:
    """Take RNN/GRU/LSTM input projections out of the time loop as one GEMM; pack R."""
    n = decompose(graph)
    if n:
        ctx.tally({"Recurrent": n})
    return graph
