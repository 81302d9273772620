"""In-place execution: which kernel outputs may be written over one of the kernel's inputs.

An elementwise kernel that reads its input `x` only at the index it writes
(`y[i] = f(x[i], ...)`) can store `y` in `x`'s bytes when `x` dies at that
kernel: each element is read before its own slot is overwritten, and no other
element's write touches it. That turns a chain of elementwise kernels (and a
residual Add fused into a Conv epilogue) from two live buffers into one, which
lowers the arena's peak (kiln.lower.memory).

The rule is decided on the graph, where "reads only at the same index" is
evident: the input is read by elementwise/broadcast members only, each of whose
outputs has the input's shape, and every member from there to the kernel's
output is elementwise/broadcast of that shape too. Anchors (Conv, MatMul) read
their own operands at many indices, so those operands never qualify; an
epilogue operand (the residual of `Conv + Add`) does.
"""

from __future__ import annotations

from kiln.graph.ir import Node, Value
from kiln.graph.types import TensorType
from kiln.lower.partition import Kind, kind_of


def _shape(v: Value | None):
    t = None if v is None else v.type
    return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _itemsize(v: Value) -> int:
    return v.type.dtype.itemsize


def inplace_candidates(nodes: list[Node], inputs: list[Value], outputs: list[Value | None]
                       ) -> list[tuple[Value, Value]]:
    """(input, output) pairs of one kernel where the output may take the input's bytes.

    Whether the input actually dies at this kernel is the memory planner's call.
    """
    outs = [v for v in outputs if v is not None]
    if len(outs) != 1:
        return []
    out = outs[0]
    shape = _shape(out)
    if shape is None:
        return []
    # members whose value flows to the output through same-shape elementwise steps only
    same_index = {id(n) for n in nodes
                  if kind_of(n) <= Kind.BROADCAST and all(_shape(o) == shape for o in n.outputs)}
    produced_by = {o.id: n for n in nodes for o in n.outputs if o is not None}
    consumers: dict[int, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None:
                consumers.setdefault(v.id, []).append(n)

    def reaches_out_same_index(n: Node) -> bool:
        # follow n's output down to the kernel's output through same-index members
        seen = set()
        while True:
            if id(n) in seen or id(n) not in same_index:
                return False
            seen.add(id(n))
            if any(o is out for o in n.outputs):
                return True
            nxt = [c for o in n.outputs if o is not None for c in consumers.get(o.id, [])]
            if len(nxt) != 1:
                return False
            n = nxt[0]

    pairs = []
    for v in inputs:
        if v.id in produced_by or v.const is not None or _shape(v) is None:
            continue
        if _itemsize(v) != _itemsize(out) or _shape(v) != shape:
            continue
        readers = consumers.get(v.id, [])
        if readers and all(reaches_out_same_index(r) for r in readers):
            pairs.append((v, out))
    return pairs
