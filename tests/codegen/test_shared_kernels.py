"""Shared kernels (kiln.codegen.csource.c_shared): a kernel whose sizes are arguments is a
translation unit of its own, the same text in every module that uses it, and its object is
compiled once per machine (counted in C compiler processes), whatever the layers, models or
threads that need it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.codegen.build import compiler_runs
from kiln.codegen.c import is_shared_unit, single_unit
from kiln.codegen.csource import SHARED_BEGIN, SHARED_END, c_shared, c_source
from kiln.compiler import run_stages
from kiln.errors import KilnError
from tests.lower.test_winograd import WINO, WINOGRAD_ERROR_BOUND, conv_model, direct, rel_error


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(d))
    return d


MACROS = {"KILN_WG_FN": "kiln_winograd_test", "KILN_WG_L": "8", "KILN_WG_TR": "4", "KILN_WG_OV": "3"}


def test_c_shared_declares_before_the_shared_block_and_defines_inside_it():
    text = c_shared("winograd.c", MACROS, "KILN_WG_TEST")
    decl, block = text.split(SHARED_BEGIN)
    assert block.endswith(SHARED_END) and block.count(SHARED_END) == 1
    assert "kiln_par_for(" not in decl and "kiln_par_for(" in block  # the definition only in the block
    assert "int32_t KILN_WG_FN(" in decl and "#define KILN_WG_FN kiln_winograd_test" in decl
    assert c_source("winograd.c") in block
    with pytest.raises(KilnError, match="not a shared kernel"):
        c_shared("topk.c", {}, "KILN_TOPK_X")


# every Winograd conv F(4x4): one kernel per register tile (which output tile each shape gets is
# kiln.lower.conv_algo.winograd_m's, tested in tests/lower/test_winograd.py)
F4 = {**WINO, "conv.winograd_m": 4}


def winograd_model(c, h, w, convs=1, seed=0):
    """`convs` 3x3 convs of 32 output channels (one register tile whatever c, h, w), chained."""
    model, wt, bv = conv_model(1, c, 32, h, w, [1, 1, 1, 1], True, seed=seed)
    if convs == 2:   # a second conv of another shape after the first
        import onnx
        from onnx import helper, numpy_helper
        rng = np.random.default_rng(seed + 1)
        w2 = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
        g = model.graph
        g.initializer.append(numpy_helper.from_array(w2, "w2"))
        g.node[-1].output[0] = "mid"
        g.node.append(helper.make_node("Conv", ["mid", "w2"], ["y"], name="conv3b", pads=[0, 0, 0, 0]))
        del g.output[:]
        g.output.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 32, h - 2, w - 2]))
        return model, (wt, bv, w2)
    return model, (wt, bv)


def units_of(model):
    return run_stages(model, "c", decisions=F4).source.units


def shared_of(units) -> int:
    """The shared units (the kernel's, and kiln's pool's where it runs the loops)."""
    return sum(map(is_shared_unit, units))


def test_one_shared_unit_the_same_in_every_module():
    a = units_of(winograd_model(16, 12, 12, convs=2)[0])        # two convs, two shapes: one kernel
    b = units_of(winograd_model(24, 9, 14)[0])
    shared_a, shared_b = [u for u in a if is_shared_unit(u)], [u for u in b if is_shared_unit(u)]
    assert len([u for u in shared_a if "kiln_winograd" in u]) == 1 and shared_a == shared_b
    assert all(SHARED_BEGIN not in u for u in a + b if not is_shared_unit(u))
    # one text (an artifact's model.c) still holds each definition once
    assert single_unit("".join(a)).count(SHARED_BEGIN) == len(shared_a)


def run_checked(model, weights, c, h, w, seed):
    x = np.random.default_rng(seed).standard_normal((1, c, h, w)).astype(np.float32)
    got = kiln.compile(model, decisions=F4).run(x=x)["y"]
    want = direct(x, weights[0], [1, 1, 1, 1], weights[1])
    if len(weights) == 3:
        want = direct(want.astype(np.float32), weights[2], [0, 0, 0, 0])
    assert rel_error(got, want) < 2 * WINOGRAD_ERROR_BOUND


def test_two_models_sharing_a_kernel_compile_it_once(cache):
    (ma, wa), (mb, wb) = winograd_model(16, 12, 12, convs=2), winograd_model(24, 9, 14, seed=3)
    before = compiler_runs()
    run_checked(ma, wa, 16, 12, 12, seed=1)
    first = compiler_runs() - before
    assert first == len(units_of(ma)) + 1                      # every unit, then the link
    objects = sorted((cache / "o").glob("*.o"))
    assert len(objects) == shared_of(units_of(ma))
    before = compiler_runs()
    run_checked(mb, wb, 24, 9, 14, seed=2)
    units = units_of(mb)
    assert compiler_runs() - before == len(units) - shared_of(units) + 1   # its own units and the link
    assert sorted((cache / "o").glob("*.o")) == objects


def test_a_build_compiles_the_shared_kernel_as_lowering_meets_it_and_emitting_c_compiles_nothing(cache):
    """A cold build starts the shared unit's compile while the module is still being lowered
    (kiln.codegen.build.prebuild_shared), and waits for that object rather than compiling it
    again; `kiln compile --emit c` (run_stages) builds nothing."""
    m, weights = winograd_model(16, 12, 12)
    before = compiler_runs()
    units = units_of(m)
    assert compiler_runs() == before and not list((cache / "o").glob("*.o"))
    run_checked(m, weights, 16, 12, 12, seed=4)
    assert compiler_runs() - before == len(units) + 1        # each unit once, then the link
    assert len(list((cache / "o").glob("*.o"))) == shared_of(units)


def test_threads_compiling_models_that_share_a_kernel_compile_it_once():
    models = [(winograd_model(16, 12, 12, seed=k), 16, 12, 12) if k % 2 else
              (winograd_model(24, 9, 14, seed=k), 24, 9, 14) for k in range(2)]
    own = sum(len(units_of(m)) - shared_of(units_of(m)) + 1 for (m, _), *_ in models)   # units, link
    shared = shared_of(units_of(models[0][0][0]))
    start, errors = threading.Barrier(len(models)), []

    def call(k):
        (m, weights), c, h, w = models[k]
        start.wait()
        try:
            run_checked(m, weights, c, h, w, seed=k)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    before = compiler_runs()
    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert compiler_runs() - before == own + shared             # the shared units once


def test_a_damaged_shared_object_is_compiled_again(cache):
    (ma, wa), (mb, wb) = winograd_model(16, 12, 12), winograd_model(24, 9, 14, seed=3)
    run_checked(ma, wa, 16, 12, 12, seed=1)
    (obj,) = [o for o in (cache / "o").glob("*.o") if "kiln_winograd" in o.with_suffix(".c").read_text()]
    obj.write_bytes(obj.read_bytes()[:100])                    # cut short: not the recorded bytes
    before = compiler_runs()
    run_checked(mb, wb, 24, 9, 14, seed=2)
    units = units_of(mb)
    assert compiler_runs() - before == len(units) - shared_of(units) + 2   # the kernel again, its own, link
    assert obj.stat().st_size > 100


def test_kilns_pool_is_a_shared_unit_compiled_once_per_machine(cache):
    """In a pool module kiln's pool (kiln_pool.h) is a shared unit of its own (kiln.codegen.c
    pool_block), which the module's units declare (kiln_pool_decl.h): compiled once per machine
    (a second model compiles its own unit and links), and one text (an artifact's model.c)
    still defines it, once."""
    import shutil
    import subprocess

    from onnx import TensorProto, helper

    from kiln.codegen.build import compile_c
    from kiln.codegen.c import pool_block
    from kiln.targets.target import Target

    def model(n):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, n])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])],
                              "g", [x], [y])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if Target.host().threads_impl != "pool":
        pytest.skip("KILN_THREADS_IMPL=omp: no pool")
    units = run_stages(model(1000), "c").source.units
    shared = [u for u in units if is_shared_unit(u)]
    assert len(shared) == 1 and pool_block() in shared[0]
    assert all("KILN_POOL_DECL_H" in u and "kiln_pool_worker" not in u for u in units if not is_shared_unit(u))
    before = compiler_runs()
    x = np.random.default_rng(0).standard_normal((64, 1000)).astype(np.float32)
    np.testing.assert_allclose(kiln.compile(model(1000)).run(x=x)["y"], 1 / (1 + np.exp(-np.maximum(x, 0))),
                               rtol=1e-5, atol=1e-6)
    assert compiler_runs() - before == len(units) + 1 and len(list((cache / "o").glob("*.o"))) == 1
    before = compiler_runs()
    kiln.compile(model(999))
    assert compiler_runs() - before == 2                        # its own unit and the link
    one = single_unit("".join(units))
    assert one.count(SHARED_BEGIN) == 1
    lib = compile_c(one, Target.host())
    if shutil.which("nm"):
        assert " kiln_pool_for" in subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
