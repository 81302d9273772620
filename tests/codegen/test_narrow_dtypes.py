"""The C backend's storage dtypes (bfloat16, float8*, float4e2m1, int4/uint4/int2/uint2) vs
ml_dtypes and the reference: every bit pattern loads as ml_dtypes converts it, float32 values
(random bit patterns, ties, overflow, NaN/Inf, subnormals) store as ml_dtypes rounds them,
Cast's saturate/round_mode conversions as the reference, arithmetic rounds per op."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.codegen import build_c, emit_c
from kiln.codegen.c import NARROW
from kiln.dtypes import DType
from kiln.loops import Expr, LoopModule, Schedule, cast, compute, const, exp, lower, placeholder
from kiln.ops.elementwise import _to_e8m0

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/Inf/overflow casts are the point
rng = np.random.default_rng(7)
FLOATS = [DType.bfloat16, DType.float8e4m3fn, DType.float8e4m3fnuz, DType.float8e5m2, DType.float8e5m2fnuz,
          DType.float8e8m0, DType.float4e2m1]
F8 = [DType.float8e4m3fn, DType.float8e4m3fnuz, DType.float8e5m2, DType.float8e5m2fnuz]
INTS = [DType.int4, DType.uint4, DType.int2, DType.uint2]
_LIBS: dict = {}
CHUNK = 4096  # kernels run on fixed-size chunks
OTHER_SOURCES = [DType.float64, DType.float16, DType.int32, DType.int64, DType.uint8, DType.bool]
INT_SOURCES = [DType.float32, DType.float64, DType.float16, DType.int64, DType.int8, DType.uint32, DType.bool,
               DType.bfloat16]
TARGETS = [DType.float32, DType.float64, DType.float16, DType.int32, DType.int8, DType.bool, DType.bfloat16,
           DType.float8e5m2, DType.int4]
E8M0_MODES = [m + s for m in ("up", "down", "nearest") for s in ("", "_sat")]


def _all_casts():
    """Every (src, dst, mode) conversion the tests run: compiled as one module, once."""
    keys = [(dt, DType.float32, None) for dt in FLOATS] + [(dt, DType.int32, None) for dt in INTS]
    keys += [(DType.float32, dt, None) for dt in FLOATS]
    keys += [(src, dt, None) for src in OTHER_SOURCES for dt in FLOATS]
    keys += [(src, dt, None) for src in INT_SOURCES for dt in INTS]
    keys += [(dt, to, None) for dt in FLOATS + INTS for to in TARGETS if dt is not to]
    keys += [(DType.float32, dt, "sat") for dt in F8] + [(DType.float32, DType.float8e8m0, m) for m in E8M0_MODES]
    return list(dict.fromkeys(keys))


def _build(src, dst, fn, mode, name):
    X = placeholder((CHUNK,), src, "X")

    def body(i):
        if fn is not None:
            return fn(X[i])
        return Expr("cast", dst, (X[i],), mode) if mode else cast(dst, X[i])
    Y = compute((CHUNK,), body, "Y")
    assert Y.dtype is dst
    return lower(Schedule(Y), [X, Y], name)


def _kernel(src: DType, dst: DType, fn=None, mode=None):
    """The compiled kernel y[i] = cast(dst, x[i]) (with a conversion mode), or fn(x[i])."""
    key = (src, dst, fn, mode)
    if not _LIBS:
        keys = _all_casts()
        lib = build_c(LoopModule([_build(*k[:2], None, k[2], f"k{j}") for j, k in enumerate(keys)]))
        _LIBS.update({(k[0], k[1], None, k[2]): lib[f"k{j}"] for j, k in enumerate(keys)})
    if key not in _LIBS:
        _LIBS[key] = build_c(_build(src, dst, fn, mode, "k"))["k"]
    return _LIBS[key]


def run(src: DType, dst: DType, x, fn=None, mode=None) -> np.ndarray:
    """The kernel applied to all of x (a 1-D array of src's numpy dtype)."""
    k = _kernel(src, dst, fn, mode)
    x = np.asarray(x, dtype=src.np).ravel()
    xp = np.zeros(-(-x.size // CHUNK) * CHUNK, src.np)
    xp[:x.size] = x
    yp = np.empty(xp.size, dst.np)
    for i in range(0, xp.size, CHUNK):
        k(xp[i:i + CHUNK], yp[i:i + CHUNK])
    return yp[:x.size]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def assert_same_float(got: np.ndarray, want: np.ndarray):
    """Equal bits, except that any NaN matches any NaN."""
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    bad = np.nonzero(~gn & (_bits(got) != _bits(want)))[0]
    assert not len(bad), [(got[i], want[i]) for i in bad[:8]]


@np.errstate(all="ignore")
def float32_probes(dt: DType) -> np.ndarray:
    """Random float32 bit patterns (every range, NaN, Inf, subnormals), special values, and for
    each pair of neighbouring values of dt their midpoint (a tie) and the floats either side."""
    rand = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    fi = ml_dtypes.finfo(dt.np)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, float(fi.max), -float(fi.max),
                        float(fi.max) * 1.0625, float(fi.max) * 2, 1e30, -1e30, float(fi.tiny),
                        float(fi.smallest_subnormal), float(fi.smallest_subnormal) / 2,
                        float(fi.smallest_subnormal) * 0.75, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32)
    codes = np.arange(1 << (8 * dt.itemsize), dtype=f"u{dt.itemsize}").view(dt.np).astype(np.float32)
    vals = np.unique(codes[np.isfinite(codes)])
    mid = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)
    near = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), vals,
                           np.nextafter(vals, np.inf), np.nextafter(vals, -np.inf)])
    if dt is DType.bfloat16:
        near = rng.choice(near, 1 << 16)
    return np.concatenate([rand, special, near, -near])


# ---------------------------------------------------------------- loads


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_every_bit_pattern_loads_as_ml_dtypes(dt):
    codes = np.arange(1 << (8 * dt.itemsize), dtype=f"u{dt.itemsize}")
    if dt is DType.float4e2m1:
        codes = codes[:16]
    x = codes.view(dt.np)
    assert_same_float(run(dt, DType.float32, x), x.astype(np.float32))


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_sub_byte_ints_load_as_ml_dtypes(dt):
    x = np.arange(256, dtype=np.uint8).view(dt.np)  # high bits are ignored, as ml_dtypes does
    np.testing.assert_array_equal(run(dt, DType.int32, x), x.astype(np.int32))


# ---------------------------------------------------------------- stores (plain casts: ml_dtypes' astype)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_float32_stores_round_as_ml_dtypes(dt):
    x = float32_probes(dt)
    with np.errstate(all="ignore"):
        want = x.astype(dt.np)
    np.testing.assert_array_equal(_bits(run(DType.float32, dt, x)), _bits(want))


@pytest.mark.parametrize("src", OTHER_SOURCES, ids=str)
@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_other_sources_convert_as_ml_dtypes(src, dt):
    """float64 and integers convert to float32 first, as ml_dtypes does (so do ties)."""
    if src.is_float:
        x = np.concatenate([float32_probes(dt)[:4000].astype(np.float64), rng.standard_normal(2000) * 1e3,
                            1 + np.array([2.0**-8 + 2.0**-40, 2.0**-4 + 2.0**-40, 2.0**-2 + 2.0**-40])])
    elif src is DType.bool:
        x = np.array([0, 1] * 8)
    else:
        info = np.iinfo(src.np)
        x = np.concatenate([rng.integers(info.min, info.max, 3000, dtype=src.np, endpoint=True),
                            rng.integers(-300, 300, 3000).clip(info.min, info.max),
                            [2**24 + 2**16 + 1, 2**24 + 1]]).clip(info.min, info.max)
    with np.errstate(all="ignore"):
        x = np.asarray(x).astype(src.np)
        want = x.astype(dt.np)
    assert_same_float(run(src, dt, x), want)


@pytest.mark.parametrize("src", INT_SOURCES, ids=str)
@pytest.mark.parametrize("dt", INTS, ids=str)
def test_sub_byte_int_casts_as_ml_dtypes(src, dt):
    """Integers wrap; floats truncate, 0 outside the int32 range (and NaN/Inf), then wrap."""
    if src.is_float:
        x = np.concatenate([rng.uniform(-40, 40, 2000), np.arange(-20, 20) + 0.5, [np.nan, np.inf, -np.inf]])
        if src in (DType.float32, DType.float64):
            x = np.concatenate([x, [2**31 - 1, 2**31 - 0.5, 2**31 - 1.5, -2**31, -2**31 - 0.5, 2**31, 2**32 + 3,
                                    1e20, -1e20, 2**31 - 128]])
        if src is DType.float32:
            x = np.concatenate([x, rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
                                .astype(np.float64)])
    elif src is DType.bool:
        x = np.array([0, 1] * 4)
    else:
        info = np.iinfo(src.np)
        x = np.concatenate([rng.integers(info.min, info.max, 3000, dtype=src.np, endpoint=True), [info.min, info.max]])
    with np.errstate(all="ignore"):
        x = np.asarray(x).astype(src.np)
        want = (x.astype(np.float32) if src is DType.bfloat16 else x).astype(dt.np)
    np.testing.assert_array_equal(run(src, dt, x).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dt", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("to", TARGETS, ids=str)
def test_casts_from_storage_dtypes_as_the_reference(dt, to):
    """The reference widens to float32 (floats) and converts that with numpy/ml_dtypes."""
    if dt is to:
        return
    codes = np.arange(16 if dt is DType.float4e2m1 else 256, dtype=np.uint8)
    x = codes.view(dt.np) if dt.itemsize == 1 else rng.integers(0, 2**16, 4096, dtype=np.uint16).view(dt.np)
    if dt.is_int:
        x = np.arange(256, dtype=np.uint8).view(dt.np).astype(np.int32).astype(dt.np)  # canonical bytes
    if to.is_int and to.c is not None:  # C's float -> int of NaN/Inf/huge is not numpy's: finite, in range
        wide = x.astype(np.float32)
        x = x[np.isfinite(wide) & (np.abs(wide) < 100)]
    with np.errstate(all="ignore"):  # (ml_dtypes casts between its integer types through int32)
        want = (x.astype(np.float32) if dt.is_float else x.astype(np.int32)).astype(to.np)
    got = run(dt, to, x)
    if to.is_float:
        assert_same_float(got, want)
    else:
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------- Cast's modes (the reference is kiln.ops)


@pytest.mark.parametrize("dt", F8, ids=str)
def test_saturating_float8_casts_clip_as_the_reference(dt):
    x = float32_probes(dt)
    fi = ml_dtypes.finfo(dt.np)
    with np.errstate(all="ignore"):
        want = np.clip(x, float(fi.min), float(fi.max)).astype(dt.np)
    got = run(DType.float32, dt, x, mode="sat")
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert not np.isinf(got[np.isinf(x)].astype(np.float32)).any()


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [False, True])
def test_e8m0_round_modes_as_the_reference(mode, saturate):
    x = np.concatenate([float32_probes(DType.float8e8m0),
                        np.array([0x7F400000, 0x7F400001, 0x7F7FFFFF, 0x00400000, 0x00400001, 0x00600000, 0x00C00000,
                                  0x00C00001, 0x3FC00000, 0x3FC00001, 0x80000000, 0xBFC00000],
                                 np.uint32).view(np.float32)])
    got = run(DType.float32, DType.float8e8m0, x, mode=mode + "_sat" * saturate)
    np.testing.assert_array_equal(_bits(got), _bits(_to_e8m0(x, saturate, mode)))


def _cast_model(src, to, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=to.onnx, **attrs)
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", src.onnx, [64])],
                          [helper.make_tensor_value_info("y", to.onnx, [64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])


@pytest.mark.parametrize("to, attrs", [(DType.float8e4m3fn, {}), (DType.float8e5m2, {"saturate": 0}),
                                       (DType.float8e5m2fnuz, {}), (DType.float8e8m0, {"round_mode": "nearest"}),
                                       (DType.float8e8m0, {"saturate": 0, "round_mode": "down"}),
                                       (DType.int4, {}), (DType.bfloat16, {})], ids=str)
@pytest.mark.parametrize("src", [DType.float32, DType.float16], ids=str)
def test_cast_node_on_cpu_matches_the_interpreter(src, to, attrs):
    model = _cast_model(src, to, **attrs)
    x = np.concatenate([rng.standard_normal(48) * 300, [np.inf, -np.inf, np.nan, 1e9, -1e9, 0.5, 1.5, -2.5, 3.5,
                                                          240, 448, 464, 57344, 61440, 1e-6, 0]]).astype(src.np)
    got = kiln.compile(model, target="cpu").run({"x": x})["y"]
    want = kiln.compile(model, target="interpreter").run({"x": x})["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(_bits(got), _bits(want))


# ---------------------------------------------------------------- arithmetic, constants, copies, modules


def test_bfloat16_arithmetic_rounds_each_op_as_the_reference():
    n = 4096
    a, b, c = (rng.standard_normal(n).astype(ml_dtypes.bfloat16) for _ in range(3))
    A, B, C = (placeholder((n,), DType.bfloat16, s) for s in "ABC")
    Y = compute((n,), lambda i: A[i] * B[i] + C[i] / const(3.0, DType.bfloat16) - const(0.1, DType.bfloat16), "Y")
    lib = build_c(lower(Schedule(Y), [A, B, C, Y], "k"))
    y = np.empty(n, ml_dtypes.bfloat16)
    lib["k"](a, b, c, y)
    bf = ml_dtypes.bfloat16  # ml_dtypes computes each bfloat16 op in float32 and rounds
    want = (a * b).astype(bf) + (c / bf(3.0)).astype(bf) - bf(0.1)
    np.testing.assert_array_equal(_bits(y), _bits(want.astype(bf)))


def test_bfloat16_math_calls_compute_in_float32():
    x = rng.uniform(-5, 5, 512).astype(ml_dtypes.bfloat16)
    got = run(DType.bfloat16, DType.bfloat16, x, fn=exp).astype(np.float32)
    want = np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2**-8)  # expf and numpy may differ at a tie
    assert (got == want).mean() > 0.99


def test_sub_byte_int_arithmetic_wraps():
    a = np.arange(256, dtype=np.uint8).view(ml_dtypes.int4).astype(np.int32).astype(ml_dtypes.int4)
    got = run(DType.int4, DType.int4, a, fn=lambda v: v * const(3, DType.int4) + const(5, DType.int4))
    want = ((a.astype(np.int32) * 3 + 5 + 8) % 16 - 8).astype(ml_dtypes.int4)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    u = np.arange(4, dtype=np.uint8).view(ml_dtypes.uint2)
    got = run(DType.uint2, DType.uint2, u, fn=lambda v: v - const(1, DType.uint2))
    np.testing.assert_array_equal(got.view(np.uint8), (np.arange(4) - 1) % 4)


def test_copies_keep_the_bytes():
    """A store of a load of the same storage dtype copies bits (NaN payloads survive)."""
    x = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(run(DType.float8e5m2, DType.float8e5m2, x, fn=lambda v: v).view(np.uint8),
                                  np.arange(256))
    X = placeholder((4,), DType.bfloat16, "X")
    Y = compute((4,), lambda i: X[i], "Y")
    src = emit_c(LoopModule([lower(Schedule(Y), [X, Y], "c")]))
    assert "kiln_bf16_to_f32" not in src


def test_table_covers_the_storage_dtypes():
    assert set(NARROW) == {d for d in DType if d.is_narrow}
    for d, nt in NARROW.items():
        assert nt.storage == d.c_storage and np.dtype(nt.storage.replace("_t", "")).itemsize == d.itemsize


def test_model_with_bfloat16_constants_and_math_matches_the_interpreter():
    """Weights of a storage dtype go into the blob; a bf16 Mul/Add chain against the interpreter."""
    w = numpy_helper_from(rng.standard_normal(32).astype(ml_dtypes.bfloat16), "w")
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=DType.bfloat16.onnx),
             helper.make_node("Mul", ["xb", "w"], ["m"]),
             helper.make_node("Add", ["m", "xb"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 32])],
                          [helper.make_tensor_value_info("y", DType.bfloat16.onnx, [4, 32])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.standard_normal((4, 32)).astype(np.float32) * 4
    got = kiln.compile(model, target="cpu").run({"x": x})["y"]
    want = kiln.compile(model, target="interpreter").run({"x": x})["y"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2**-7)
    assert (got.view(np.uint16) == want.view(np.uint16)).mean() > 0.95


def numpy_helper_from(a, name):
    from onnx import numpy_helper
    return numpy_helper.from_array(a, name)
