"""Resource limits (kiln.limits): sizes and trip counts are checked before the work is done.

Each case is a reproduction from the untrusted-input issue: a 100-byte model asking
for gigabytes at compile, TiB-scale generators, a Loop of 10^12 iterations.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln
from kiln.errors import KilnError
from kiln.limits import KilnResourceError, Limits, parse_size

TARGETS = ["interpreter", "cpu"]


def model(nodes, inits, outputs=("y",), inputs=(), opset=17):
    g = h.make_graph(nodes, "limits", list(inputs), [h.make_tensor_value_info(o, T.FLOAT, None)
                                                     for o in outputs], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def constant_of_shape_sum(n: int) -> onnx.ModelProto:
    """ConstantOfShape of n floats, summed: a model of ~100 bytes asking for 4n bytes."""
    return model([h.make_node("ConstantOfShape", ["s"], ["c"], name="fill",
                              value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
                  h.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                 [h.make_tensor("s", T.INT64, [1], [n])])


def test_folding_estimates_before_computing():
    """The issue's 104-byte model: 2^30 floats must not be allocated by constant folding."""
    m = constant_of_shape_sum(1 << 30)
    assert len(m.SerializeToString()) < 200
    tracemalloc.start()
    try:
        compiled = kiln.compile(m, target="interpreter", opt_level=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"compile allocated {peak} bytes"
    assert compiled.limits.max_memory_bytes > 0
    capped = kiln.compile(m, target="interpreter", limits={"max_memory_bytes": 1 << 30})
    with pytest.raises(KilnResourceError, match="fill"):  # and running it is capped too
        capped.run({})


def test_small_constants_still_fold():
    from kiln.passes import run_passes
    g, _ = run_passes(kiln.load_onnx(constant_of_shape_sum(1000)), 2)
    assert not any(n.op == "ConstantOfShape" for n in g.nodes)


def tib(op: str):
    big = 1 << 40
    if op == "ConstantOfShape":
        return constant_of_shape_sum(big)
    if op == "Expand":  # a 1 MiB x 1 MiB broadcast, kept as a graph output so it must exist
        return model([h.make_node("Expand", ["x", "s"], ["y"], name="grow")],
                     [h.make_tensor("s", T.INT64, [2], [1 << 20, 1 << 20]), h.make_tensor("x", T.FLOAT, [1], [1.0])])
    return model([h.make_node("Range", ["a", "b", "d"], ["y"], name="grow")],
                 [h.make_tensor("a", T.FLOAT, [], [0.0]), h.make_tensor("b", T.FLOAT, [], [float(big)]),
                  h.make_tensor("d", T.FLOAT, [], [1.0])])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Range"])
def test_tib_generators_are_resource_errors(op, target):
    t = time.perf_counter()
    with pytest.raises(KilnResourceError) as e:
        kiln.compile(tib(op), target=target).run({})
    assert "TiB" in str(e.value) and op in str(e.value)
    assert time.perf_counter() - t < 30


def test_run_time_shape_is_checked_before_allocating():
    """The shape arrives as an input: the reference refuses before np.full."""
    m = model([h.make_node("ConstantOfShape", ["s"], ["y"], name="fill",
                           value=h.make_tensor("v", T.FLOAT, [1], [1.0]))], [],
              inputs=[h.make_tensor_value_info("s", T.INT64, [2])])
    c = kiln.compile(m, target="interpreter", limits={"max_memory_bytes": "1M"})
    assert c.run(s=np.array([3, 5]))["y"].shape == (3, 5)
    with pytest.raises(KilnResourceError, match=r"node 'fill'.*\(1024, 1024\)"):
        c.run(s=np.array([1024, 1024]))


@pytest.mark.parametrize("target", TARGETS)
def test_planned_memory_limit_is_per_compile(target):
    """A model that needs 4 MiB: fine by default, refused under a 1 MiB limit, before it runs."""
    m = model([h.make_node("Expand", ["x", "s"], ["y"], name="grow")],
              [h.make_tensor("s", T.INT64, [2], [1024, 1024]), h.make_tensor("x", T.FLOAT, [1], [2.0])])
    out = kiln.compile(m, target=target).run({})["y"]
    assert out.shape == (1024, 1024) and (out == 2.0).all()
    with pytest.raises(KilnResourceError, match="memory limit"):
        kiln.compile(m, target=target, limits=Limits(1 << 20, 1 << 20, 1000)).run({})


def test_constant_cap_refuses_big_initializers():
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    m = model([h.make_node("Add", ["x", "w"], ["y"])], [onnx.numpy_helper.from_array(w, "w")],
              inputs=[h.make_tensor_value_info("x", T.FLOAT, [256, 256])])
    x = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    np.testing.assert_allclose(kiln.compile(m, target="interpreter").run(x=x)["y"], x + w)
    with pytest.raises(KilnResourceError, match="tensor 'w'.*256.0 KiB.*limit on one constant"):
        kiln.compile(m, target="interpreter", limits={"max_constant_bytes": "64K"})


def loop_model(trips: int, with_cond: bool):
    """y = 1 + 1 + ... (one per iteration); with a cond input, the body keeps cond true."""
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", T.FLOAT, [])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("acc_out", T.FLOAT, [])],
        [h.make_tensor("one", T.FLOAT, [], [1.0])])
    inits = [h.make_tensor("M", T.INT64, [], [trips]), h.make_tensor("zero", T.FLOAT, [], [0.0]),
             h.make_tensor("true", T.BOOL, [], [True])]
    node = h.make_node("Loop", ["M", "true" if with_cond else "", "zero"], ["y"], name="spin", body=body)
    return model([node], inits)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("with_cond", [False, True])
def test_loop_trip_count_is_bounded(target, with_cond):
    """The issue's Loop of 10^12 iterations: a clear error, at once (no cond) or at the limit."""
    t = time.perf_counter()
    with pytest.raises(KilnResourceError, match=r"Loop node 'spin'.*above the limit of 50"):
        kiln.compile(loop_model(10 ** 12, with_cond), target=target, limits={"max_trip_count": 50}).run({})
    assert time.perf_counter() - t < 60
    # within the limit it runs to the right answer
    y = kiln.compile(loop_model(40, with_cond), target=target, limits={"max_trip_count": 50}).run({})["y"]
    assert float(y) == 40.0


def test_default_trip_count_refuses_1e12_at_once():
    t = time.perf_counter()
    with pytest.raises(KilnResourceError, match="1,000,000,000,000 iterations"):
        kiln.compile(loop_model(10 ** 12, False), target="interpreter").run({})
    assert time.perf_counter() - t < 10


def test_scan_length_is_bounded():
    body = h.make_graph([h.make_node("Add", ["s_in", "x"], ["s_out"])], "body",
                        [h.make_tensor_value_info("s_in", T.FLOAT, []), h.make_tensor_value_info("x", T.FLOAT, [])],
                        [h.make_tensor_value_info("s_out", T.FLOAT, [])])
    m = model([h.make_node("Scan", ["init", "xs"], ["y"], name="scan", num_scan_inputs=1, body=body)],
              [h.make_tensor("init", T.FLOAT, [], [0.0])], inputs=[h.make_tensor_value_info("xs", T.FLOAT, ["n"])])
    c = kiln.compile(m, target="interpreter", limits={"max_trip_count": 10})
    assert float(c.run(xs=np.arange(10, dtype=np.float32))["y"]) == 45.0
    with pytest.raises(KilnResourceError, match="Scan node 'scan'.*11 iterations"):
        c.run(xs=np.arange(11, dtype=np.float32))


def test_memory_error_never_escapes(monkeypatch):
    """Wherever numpy gives up, compile() and run() raise KilnResourceError, not MemoryError."""
    import kiln.passes.pipeline as pipeline

    def oom(*a, **k):
        raise MemoryError("Unable to allocate 9 TiB")
    monkeypatch.setattr(pipeline, "get_pass", oom)
    with pytest.raises(KilnResourceError, match="out of memory"):
        kiln.compile(constant_of_shape_sum(4), target="interpreter")


def test_limits_from_environment(monkeypatch):
    monkeypatch.setenv("KILN_MAX_MEMORY", "3M")
    monkeypatch.setenv("KILN_MAX_TRIP_COUNT", "7")
    lim = Limits.default()
    assert lim.max_memory_bytes == 3 << 20 and lim.max_trip_count == 7
    assert lim.max_constant_bytes > 0
    monkeypatch.setenv("KILN_MAX_MEMORY", "lots")
    with pytest.raises(KilnError, match="KILN_MAX_MEMORY.*not a size"):
        Limits.default()


def test_parse_size_and_bad_options():
    assert parse_size("8G") == 8 << 30 and parse_size("512MiB") == 512 << 20 and parse_size(12) == 12
    for bad in ("-1", "0", "1.5G", ""):
        with pytest.raises(KilnError):
            parse_size(bad)
    with pytest.raises(KilnError, match="unknown limit"):
        kiln.compile(constant_of_shape_sum(4), target="interpreter", limits={"max_ram": 5})


def test_cli_flag_sets_the_limit(tmp_path, capsys):
    from kiln import limits
    from kiln.cli import main
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(10 ** 12, True), path)
    try:
        with pytest.raises(SystemExit) as e:
            main(["--max-trip-count", "20", "run", str(path), "-t", "interpreter"])
    finally:
        limits.set_default(None)
    assert e.value.code == 1
    assert "above the limit of 20" in capsys.readouterr().err
