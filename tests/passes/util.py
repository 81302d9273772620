"""Pass tests in the text IR: parse a graph, run one pass (verifying), compare the printed
result with the expected text, and check the interpreter gives the same numbers."""

from __future__ import annotations

import base64
import json

import numpy as np

from kiln.dtypes import DType
from kiln.graph import Graph, TensorType, parse_graph, print_graph
from kiln.graph.text import print_type
from kiln.interpreter import Interpreter
from kiln.passes import run_passes


def lit(a, dtype=np.float32) -> str:
    """The text form of a tensor literal."""
    a = np.asarray(a, dtype=dtype) if not isinstance(a, np.ndarray) else a
    t = _type(a)
    payload = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()
    return f"tensor<{print_type(t)}>({json.dumps(payload)})"


def graph(text: str, **consts) -> Graph:
    """Parse `text` with `consts` (name -> array) declared as constants `%name`."""
    consts = {k: np.asarray(v) for k, v in consts.items()}
    decls = [f"  const %{k}: {print_type(_type(v))} = {lit(v)}" for k, v in consts.items()]
    head, brace, rest = text.partition("\n{\n")
    return parse_graph(head + brace + "".join(d + "\n" for d in decls) + rest)


def _type(a: np.ndarray) -> TensorType:
    return TensorType(DType.from_numpy(a.dtype), tuple(a.shape))


def random_inputs(g: Graph, seed: int = 0) -> list[np.ndarray]:
    """Non-zero random data for every graph input (symbolic dims are 3)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        shape = tuple(d if isinstance(d, int) else 3 for d in v.type.shape)
        dt = v.type.dtype.np
        if dt.kind == "f":
            x = rng.standard_normal(shape).astype(dt)
            x[x == 0] = 0.5
        elif dt.kind == "b":
            x = rng.integers(0, 2, shape).astype(bool)
        else:
            x = rng.integers(1, 6, shape).astype(dt)
        out.append(x)
    return out


def assert_equivalent(before: Graph, after: Graph, rtol: float = 1e-5, atol: float = 1e-6,
                      seeds=(0, 1)) -> None:
    for seed in seeds:
        xs = random_inputs(before, seed)
        for a, b in zip(Interpreter(before).run(xs), Interpreter(after).run(xs)):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def check(pass_name: str, before: str, after: str | None, rtol: float = 1e-5, atol: float = 1e-6,
          **consts):
    """Run `pass_name` on `before` (verifying), compare with `after` (None: unchanged), and
    check equivalence on random inputs. Returns (optimized graph, its PassStats)."""
    g = graph(before, **consts)
    out, stats = run_pass(pass_name, g)
    want = print_graph(g) if after is None else print_graph(graph(after, **consts))
    assert print_graph(out) == want
    assert_equivalent(g, out, rtol, atol)
    return out, stats


def run_pass(pass_name: str, g: Graph):
    """Run one pass with the verifier on; the input graph must come back untouched."""
    text_before = print_graph(g)
    out, stats = run_passes(g, passes=[pass_name], verify=True)
    assert print_graph(g) == text_before, "the pass changed its input graph"
    return out, stats[0]


def prog(signature: str, body: str, opset: int = 17) -> str:
    """A top-level graph text: `prog('(%x: float32[2]) -> (%y)', '%y: ... = Relu(%x) name "r"')`."""
    return f'graph "g" {signature}\n  opsets {{"": {opset}}}\n{{\n{body}\n}}\n'
