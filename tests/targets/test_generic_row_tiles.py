"""A GEMM over a symbolic row count (batch x seq) in a shape-generic module is also built
with other register tiles, one picked per call by the run-time rows (kiln.lower.row_tiles):
the pick is exactly the cheapest tile, and every row count (1, primes, tile boundaries, past
the variants' range, large) matches the reference from the one module, from two threads at
once too, with no C compiler run."""

import threading

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper as nh

import kiln
from kiln.dtypes import DType
from kiln.loops.expr import Expr
from kiln.loops.symbols import symbol
from kiln.lower.gemm import choose_tile, tile_budget
from kiln.lower.row_tiles import ROW_TILE_ROWS, best_tile, plan_row_tiles, tile_cost
from kiln.targets.target import Target
from tests.targets.test_generic_shapes import _check_runs, _generic, compiler_runs  # noqa: F401 (fixture)

F = onnx.TensorProto.FLOAT

_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
        "and": lambda a, b: a and b}


def _value(e, env):
    """A bool / index Expr over symbol vars at the values `env` (what the entry computes in C)."""
    if not isinstance(e, Expr):
        return e
    if e.op == "const":
        return e.arg
    if e.op == "var":
        return env[e]
    if e.op == "cast":
        return _value(e.args[0], env)
    return _OPS[e.op](*(_value(a, env) for a in e.args))


@pytest.mark.parametrize("nvec", [4, 2])
def test_the_run_time_pick_is_the_cheapest_tile(nvec):
    """For every row count up to ROW_TILE_ROWS exactly one variant's condition holds, the
    tile of least cost among those built (ties to the larger, as choose_tile); past it none
    (the kernel tiled for the hint runs)."""
    target = Target.named("znver4")      # 32 registers of 16 floats
    spill = tile_budget(nvec, target.vector_registers)
    mr = choose_tile(4096, 1024, DType.float32, target, nvec=nvec, exact_rows=False)[0]
    n = symbol("sym_rows_test")
    plan = plan_row_tiles(n * 1, mr, spill, lambda r: choose_tile(r, 1024, DType.float32, target, nvec=nvec)[0])
    assert plan is not None and plan.mr == mr and plan.choice[0] == mr and len(plan.tiles) >= 2, plan
    assert {m for m, _ in plan.tiles} <= set(plan.choice)
    for rows in [*range(1, ROW_TILE_ROWS + 1), ROW_TILE_ROWS + 1, 1031]:
        holds = [m for m, _ in plan.tiles if _value(plan.condition(m), {n: rows})]
        if rows > ROW_TILE_ROWS:
            assert holds == [], rows
            continue
        best = best_tile(rows, plan.choice, spill)
        assert holds == ([best] if best in dict(plan.tiles) else []), (rows, holds, best)
        assert all(tile_cost(rows, best, spill) <= tile_cost(rows, m, spill) for m in plan.choice)
    # each variant is lowered for the most rows it serves
    for m, lowered_for in plan.tiles:
        assert best_tile(lowered_for, plan.choice, spill) == m
        assert all(best_tile(r, plan.choice, spill) != m for r in range(lowered_for + 1, ROW_TILE_ROWS + 1))


def _mlp(rng):
    """[batch, seq, 64] -> MatMul 64x80 + bias, Relu -> MatMul 80x33: two GEMMs over
    batch x seq rows, the second with a column count that is no multiple of a vector."""
    def w(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", "seq", 64])],
                          [helper.make_tensor_value_info("y", F, None)], [w("w1", 64, 80), w("b1", 80), w("w2", 80, 33)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# rows = batch x seq: 1, primes, each side of the tiles (5..8) and their multiples, the variants'
# last row count (ROW_TILE_ROWS) and past it, large
PAIRS = [(1, 1), (1, 2), (3, 1), (1, 5), (1, 7), (2, 4), (1, 13), (4, 4), (1, 17), (3, 7), (31, 1), (2, 16),
         (1, 37), (6, 8), (1, 97), (4, 32), (1, 251), (2, 128), (1, 257), (3, 101), (7, 149)]


def test_row_tile_variants_match_at_many_row_counts(compiler_runs):  # noqa: F811
    rng = np.random.default_rng(11)
    m = _generic(_mlp(rng))
    tiles = m.module.info["row_tiles"]
    assert tiles and all(len(ms) >= 2 for ms in tiles.values()), tiles
    assert "also built with register tiles of" in str(m.report), m.report
    feeds = [{"x": rng.standard_normal((b, s, 64)).astype(np.float32)} for b, s in PAIRS]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-5)


def test_two_threads_run_new_row_counts_at_once(compiler_runs):  # noqa: F811
    """Two threads run the one module at new shapes at the same time (each call picks its own
    tiles from its own dims): every result matches the reference, nothing compiles."""
    rng = np.random.default_rng(12)
    model = _mlp(rng)
    m = _generic(model)
    ref = kiln.compile(model, target="interpreter", opt_level=0)
    before = len(compiler_runs)
    work = [[{"x": rng.standard_normal((b, s, 64)).astype(np.float32)} for b, s in PAIRS[k::2]] for k in range(2)]
    want = [[ref.run(f)["y"] for f in fs] for fs in work]
    got: list = [[None] * len(fs) for fs in work]
    errors: list = []

    def call(k):
        try:
            for _ in range(3):
                for j, f in enumerate(work[k]):
                    got[k][j] = m.run(f)["y"]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in range(2):
        for g, w in zip(got[k], want[k]):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert compiler_runs[before:] == []
