"""The C backend: dtypes and intrinsics vs numpy, the build cache, errors, entry calls, speed."""

import math
import platform
import subprocess
import time

import numpy as np
import pytest

from kiln.codegen import build_c, emit_c
from kiln.runtime.cpu import cpu_features
from kiln.targets.target import Target
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import (Allocate, Buffer, Call, LoopModule, PrimFunc, Schedule, View, call, cast, compute, lower,
                        max_, min_, placeholder, reduce_axis, select, seq, sum_, truncdiv, truncmod)

rng = np.random.default_rng(1)
UNARY = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
         "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
         "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
         "atanh": np.arctanh, "abs": np.abs, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil,
         "round": np.round, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "sign": np.sign,
         "isnan": np.isnan, "isinf": np.isinf,
         "erf": np.vectorize(math.erf), "erfc": np.vectorize(math.erfc), "exp_floored": np.exp}


def kernel(fn, ins, out_dtype, name="k"):
    """Compile out[i] = fn(*loads) over 1-D inputs; return a runner."""
    n = ins[0].shape[0]
    ts = [placeholder((n,), DType.from_numpy(a.dtype), f"in{t}") for t, a in enumerate(ins)]
    out = compute((n,), lambda i: fn(*(t[i] for t in ts)), "out")
    assert out.dtype is out_dtype
    lib = build_c(lower(Schedule(out), ts + [out], name))
    res = np.empty(n, out_dtype.np)
    lib[name](*ins, res)
    return res


def all_intrinsics_module(dtype):
    """One module with a kernel per unary intrinsic (compiled once)."""
    n = 64
    funcs, names = [], sorted(UNARY)
    for nm in names:
        X = placeholder((n,), dtype, "X")
        Y = compute((n,), lambda i: call(nm, X[i]), "Y")
        funcs.append(lower(Schedule(Y), [X, Y], nm))
    return build_c(LoopModule(funcs)), names


@pytest.mark.parametrize("dtype, tol", [(DType.float32, 2e-6), (DType.float64, 1e-12), (DType.float16, 2e-3)])
def test_intrinsics_match_numpy(dtype, tol):
    lib, names = all_intrinsics_module(dtype)
    x = rng.uniform(-0.95, 0.95, 64).astype(dtype.np)
    for nm in names:
        arg = np.abs(x) + (1.1 if nm == "acosh" else 0.1) if nm in ("log", "sqrt", "rsqrt", "acosh") else x.copy()
        if nm == "round":
            arg[:4] = [0.5, -0.5, 2.5, -1.5]          # half to even
        out = np.empty(64, bool if nm in ("isnan", "isinf") else dtype.np)
        lib[nm](arg, out)
        np.testing.assert_allclose(out.astype(np.float64), UNARY[nm](arg).astype(np.float64),
                                   rtol=tol, atol=tol, err_msg=nm)


def test_integer_division_and_bits():
    a = rng.integers(-50, 50, 32).astype(np.int32)
    b = rng.integers(1, 7, 32).astype(np.int32) * rng.choice([-1, 1], 32).astype(np.int32)
    np.testing.assert_array_equal(kernel(lambda x, y: x // y, [a, b], DType.int32), a // b)
    np.testing.assert_array_equal(kernel(lambda x, y: x % y, [a, b], DType.int32), a % b)
    np.testing.assert_array_equal(kernel(truncdiv, [a, b], DType.int32), np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(kernel(truncmod, [a, b], DType.int32), np.fmod(a, b))
    np.testing.assert_array_equal(kernel(lambda x, y: (x & y) ^ (x | 3) << 2, [a, b], DType.int32),
                                  (a & b) ^ (a | 3) << 2)
    np.testing.assert_array_equal(kernel(lambda x, y: x < y, [a, b], DType.bool), a < b)
    np.testing.assert_array_equal(kernel(lambda x, y: select(x < y, x, y * 2), [a, b], DType.int32),
                                  np.where(a < b, a, b * 2))
    np.testing.assert_array_equal(kernel(lambda x, y: cast(DType.float32, x) / 4.0, [a, b], DType.float32),
                                  a.astype(np.float32) / 4)


def test_min_max_propagate_nan_like_numpy():
    x = np.array([1, np.nan, 3, -np.inf], np.float32)
    y = np.array([np.nan, 2, 1, 0], np.float32)
    np.testing.assert_array_equal(kernel(max_, [x, y], DType.float32), np.maximum(x, y))
    np.testing.assert_array_equal(kernel(min_, [x, y], DType.float32), np.minimum(x, y))


def test_cache_is_content_addressed(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    X = placeholder((4,), DType.float32, "X")
    Y = compute((4,), lambda i: X[i] * 3.0, "Y")
    f = lower(Schedule(Y), [X, Y], "triple")
    a, b = build_c(f), build_c(f)
    assert a.path == b.path and a.path.parent == tmp_path / "c"
    assert sorted(p.suffix for p in a.path.parent.iterdir()) == [".c", ".sha256", ".so"]   # no temp files left
    c = build_c(f, cflags="-O1")
    assert c.path != a.path
    out = np.empty(4, np.float32)
    c["triple"](np.arange(4, dtype=np.float32), out)
    np.testing.assert_array_equal(out, [0, 3, 6, 9])


def test_compiler_failure_names_the_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    X = placeholder((4,), DType.float32, "X")
    Y = compute((4,), lambda i: X[i], "Y")
    with pytest.raises(KilnError, match="C compiler failed.*no-such-flag"):
        build_c(lower(Schedule(Y), [X, Y], "f"), cflags="-fno-such-flag-kiln")


def test_user_names_cannot_inject_code():
    evil = 'A[0]; system("echo pwned"); /* */ //\n#include <x>'
    X = placeholder((4,), DType.float32, evil)
    Y = compute((4,), lambda i: X[i] + 1.0, evil + "y")
    f = lower(Schedule(Y), [X, Y], "f")
    src = emit_c(LoopModule([f]))
    assert '"' not in src and "system(" not in src and "#include <x>" not in src   # names are sanitized
    out = np.empty(4, np.float32)
    build_c(f)["f"](np.zeros(4, np.float32), out)
    np.testing.assert_array_equal(out, 1)


def test_argument_checks():
    X = placeholder((4,), DType.float32, "X")
    Y = compute((4,), lambda i: X[i], "Y")
    lib = build_c(lower(Schedule(Y), [X, Y], "copy"))
    with pytest.raises(KilnError, match="argument 'X'.*float32\\[4\\].*float64\\[4\\]"):
        lib["copy"](np.zeros(4), np.zeros(4, np.float32))
    with pytest.raises(KilnError, match="takes 2 arrays"):
        lib["copy"](np.zeros(4, np.float32))
    Z = placeholder((4,), DType.complex64, "Z")  # bfloat16 & co. are storage dtypes now
    W = compute((4,), lambda i: Z[i], "W")
    with pytest.raises(KilnError, match="dtype complex64"):
        emit_c(LoopModule([lower(Schedule(W), [Z, W], "g")]))


def test_entry_function_calls_kernels_on_arena_views():
    n = 16
    X = placeholder((n,), DType.float32, "X")
    T = compute((n,), lambda i: X[i] * 2.0, "T")
    k1 = lower(Schedule(T), [X, T], "double")
    T2 = placeholder((n,), DType.float32, "T2")
    Y = compute((n,), lambda i: T2[i] + 1.0, "Y")
    k2 = lower(Schedule(Y), [T2, Y], "inc")
    x_in, y_out = Buffer("x", DType.float32, (n,)), Buffer("y", DType.float32, (n,))
    arena = Buffer("arena", DType.uint8, (4096,))
    body = Allocate(arena, seq(Call("double", (x_in, View(arena, 128))), Call("inc", (View(arena, 128), y_out))),
                    "heap")
    entry = PrimFunc("main", (x_in, y_out), body, noalias=False)
    lib = build_c(LoopModule([k1, k2, entry], entry="main"))
    x, y = rng.random(n, np.float32), np.empty(n, np.float32)
    lib(x, y)
    np.testing.assert_allclose(y, x * 2 + 1)
    assert "call double(x, arena + 128B);" in str(entry)


def test_cpu_features_never_assume_avx512():
    f = cpu_features()
    assert isinstance(f, frozenset)
    def width(features):
        return Target("t", "x86_64", frozenset(features), "x86-64", 1, 1, 1, 1).vector_bytes
    assert width(()) == 16
    assert width({"avx2", "fma"}) == 32
    assert width({"avx512f"}) == 64
    assert Target.host().vector_bytes in (16, 32, 64)


def test_matmul_256_tiled_vectorized_parallel():
    M = N = K = 256
    A = placeholder((M, K), DType.float32, "A")
    B = placeholder((K, N), DType.float32, "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    s = Schedule(C)
    CL = s.cache_write(C)
    io, jo, ii, ji = s[C].tile(C.axis[0], C.axis[1], 8, 64)
    s[C].parallel(io)
    s[CL].compute_at(s[C], jo)
    i, j = s[CL].axis
    ko, ki = s[CL].split(k, 4)
    s[CL].reorder(ko, ki, i, j)
    s[CL].unroll(ki)
    s[CL].vectorize(j)
    s[C].vectorize(ji)
    lib = build_c(lower(s, [A, B, C], "matmul"))
    a, b = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    c = np.empty((M, N), np.float32)
    lib["matmul"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)
    reps, t0 = 20, time.perf_counter()
    for _ in range(reps):
        lib["matmul"](a, b, c)
    dt = (time.perf_counter() - t0) / reps
    print(f"\nmatmul 256^3: {2 * M * N * K / dt / 1e9:.1f} GFLOP/s ({dt * 1e3:.2f} ms, "
          f"{Target.host().cores} cpus, vector {Target.host().vector_bytes} B)")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="vector register names are x86's")
def test_default_flags_emit_the_vector_width_tiles_are_planned_for(tmp_path, monkeypatch):
    """-march=native's tuning may prefer narrower vectors than the CPU has (znver1 on an
    AVX2 EPYC VM: 128-bit); register tiles are sized from Target.vector_bytes, so the default
    flags must make the compiler use that width."""
    from kiln.codegen.build import _cc, _flags
    from kiln.targets.target import Target
    monkeypatch.delenv("KILN_CFLAGS", raising=False)
    src = tmp_path / "v.c"
    src.write_text("void f(float* restrict a, const float* restrict b) {\n#pragma omp simd\n"
                   "  for (int i = 0; i < 1024; ++i) a[i] = a[i] * b[i] + 1.0f;\n}\n")
    flags = [f for f in _flags(None, Target.host()) if f not in ("-shared", "-fPIC")]
    r = subprocess.run([*_cc(None), *flags, "-S", "-o", str(tmp_path / "v.s"), str(src)],
                                     capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    asm = (tmp_path / "v.s").read_text()
    want = {16: "%xmm", 32: "%ymm", 64: "%zmm"}[Target.host().vector_bytes]
    assert want in asm, f"expected {want} registers with {flags}"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or Target.host().vector_bytes < 32,
                    reason="maxps / minps are x86's (AVX's three-operand forms)")
def test_max_and_min_against_constants_are_one_instruction(tmp_path, monkeypatch):
    """Relu's max(x, 0) and a clamp to [0, 1] (HardSwish's gate) vectorize to one maxps / minps
    each, with no compare: GCC turns `0 > a ? 0 : a` with a literal 0 into a compare and a
    zero-masked move (AVX-512) or an and-not (AVX2), and a literal 1 into a compare and a blend;
    the emitter passes the constant as a variable it cannot fold. The values keep NaNs."""
    from kiln.codegen.build import _cc, _flags
    monkeypatch.delenv("KILN_CFLAGS", raising=False)
    x = rng.standard_normal(1024).astype(np.float32)
    x[:5] = [np.nan, -np.inf, np.inf, -0.0, 2.0]
    fns = {"relu": lambda v: max_(v, 0.0), "gate": lambda v: min_(max_(v, 0.0), 1.0) * v}
    with np.errstate(invalid="ignore"):
        want = {"relu": np.maximum(x, 0), "gate": np.minimum(np.maximum(x, 0), 1) * x}
    funcs = []
    for name, fn in fns.items():
        np.testing.assert_array_equal(kernel(fn, [x], DType.float32, name), want[name])
        t = placeholder((1024,), DType.float32, "in0")
        funcs.append(lower(Schedule(out := compute((1024,), lambda i: fn(t[i]), "out")), [t, out], name))
    src = tmp_path / "k.c"
    src.write_text(emit_c(LoopModule(funcs)))
    flags = [f for f in _flags(None, Target.host()) if f not in ("-shared", "-fPIC")]
    r = subprocess.run([*_cc(None), *flags, "-S", "-o", str(tmp_path / "k.s"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    asm = (tmp_path / "k.s").read_text()
    for name, ops in (("relu", ("maxps",)), ("gate", ("maxps", "minps"))):
        body = asm.split(f"\nkiln_{name}:")[1].split(".size")[0]
        vector = [ln for ln in body.splitlines() if "ps\t" in ln and "%" in ln and "mm" in ln]
        assert all(any(op in ln for ln in vector) for op in ops), f"{name}: no {ops} in\n" + "\n".join(vector)
        assert not [ln for ln in vector if "cmp" in ln or "blend" in ln or "andn" in ln], \
            f"{name}: a compare, blend or and-not where one max / min does:\n" + "\n".join(vector)


@pytest.mark.parametrize("dtype, floor", [(DType.float32, -87.0), (DType.float64, -708.0)])
def test_exp_floored_keeps_underflow_out_of_vector_exp(dtype, floor):
    """exp(max(x, floor)): arguments that would underflow (masked scores) give exp(floor),
    a tiny normal number, never NaN or a denormal; the rest are exp(x)."""
    x = np.array([0.0, -1.0, -20.0, floor + 1, floor, floor - 1, -1e9, -np.inf, np.nan] * 4, dtype.np)
    got = kernel(lambda v: call("exp_floored", v), [x], dtype)
    want = np.exp(np.maximum(x, floor))
    want[np.isnan(x)] = np.nan
    np.testing.assert_allclose(got, want, rtol=4e-7 if dtype is DType.float32 else 1e-15, atol=0)
    assert (got[~np.isnan(x)] >= np.finfo(dtype.np).tiny).all()


@pytest.mark.parametrize("n", [2, 7, 30, 63])
def test_double_float_double_round_trip_keeps_rounding(n):
    """(double)(float)x rounds x to float precision in every lane. GCC 12's vectorizer dropped
    the rounding in a loop's SLP-vectorized tail (elements 24..29 of 30 came back as x); the
    emitter guards the pattern (found by the differential fuzzer)."""
    x = rng.standard_normal(n)
    got = kernel(lambda a: cast(DType.float64, cast(DType.float32, a)), [x], DType.float64, f"rt{n}")
    np.testing.assert_array_equal(got, x.astype(np.float32).astype(np.float64))


def test_units_are_balanced_by_compile_cost_not_text_length():
    """Two kernels with unrolled loops of loads (slow to compile) go to different units,
    though one long plain kernel outweighs both in text (kiln.codegen.c.compile_cost)."""
    from kiln.codegen.c import compile_cost, emit_c_units
    n = 64

    def chain(x, terms):   # one load, `terms` multiply-adds: long text, few memory references
        for t in range(terms):
            x = x * float(t + 2) + float(t)
        return x

    def kern(name, unrolled, terms):
        X = placeholder((n, 16), DType.float32, "X")
        Y = compute((n, 16), lambda i, j: chain(X[i, j], terms) + X[(i + 1) % n, j], "Y")
        s = Schedule(Y)
        if unrolled:
            s[Y].unroll(s[Y].axis[1])
        return lower(s, [X, Y], name)

    heavy = [kern("heavy_a", True, 2), kern("heavy_b", True, 2)]
    light = kern("light", False, 60)
    module = LoopModule([light, *heavy])
    units = emit_c_units(module, 2)
    bodies = {f.name: [k for k, u in enumerate(units) if f"kiln_{f.name}(" in u.split("kiln: functions")[1]]
              for f in module.funcs}
    assert len(str(light)) > 2 * len(str(heavy[0]))
    assert bodies["heavy_a"] != bodies["heavy_b"], bodies
    assert compile_cost("#pragma GCC unroll 8\nfor (;;) {\n a[i] = b[i];\n}\n") > \
        compile_cost("for (;;) {\n a[i] = b[i];\n}\n" * 4)


def test_a_hand_written_kernel_is_balanced_by_its_preamble():
    """An extern kernel whose body only calls the function its preamble defines (flash
    attention's) costs what that function costs: it gets a unit to itself, not the cheap
    kernels' (kiln.codegen.c.emit_c_units)."""
    from kiln.codegen.c import emit_c_units
    from kiln.loops.stmt import ExternFunc
    n = 64
    lines = "".join(f"      acc[{i}] += x[i * 8 + {i}];\n" for i in range(8))
    preamble = ("static inline int32_t big(const float* x, float* y) {\n  float acc[8] = {0};\n"
                "  #pragma GCC unroll 16\n  for (int r = 0; r < 16; ++r) {\n    #pragma GCC unroll 8\n"
                "    for (int i = 0; i < 8; ++i) {\n" + lines + "    }\n  }\n"
                "  for (int i = 0; i < 8; ++i) y[i] = acc[i];\n  return 0;\n}\n")
    X, Y = Buffer("in0", DType.float32, (n,)), Buffer("out0", DType.float32, (8,))
    ext = ExternFunc("ext", (X, Y), "  return big(in0, out0);", preamble=preamble)

    def cheap(name):
        A = placeholder((n,), DType.float32, "A")
        B = compute((n,), lambda i: A[i] * 2.0 + A[(i + 1) % n], "B")
        return lower(Schedule(B), [A, B], name)
    module = LoopModule([cheap("c0"), ext, cheap("c1"), cheap("c2")])
    units = emit_c_units(module, 2)
    where = {f.name: [k for k, u in enumerate(units) if f"kiln_{f.name}(" in u.split("kiln: functions")[1]]
             for f in module.funcs}
    assert where["c0"] == where["c1"] == where["c2"] != where["ext"], where
    lib = build_c(module)
    x, y = rng.standard_normal(n).astype(np.float32), np.zeros(8, np.float32)
    lib["ext"](x, y)
    np.testing.assert_allclose(y, 16 * x.reshape(8, 8).sum(0), rtol=1e-5, atol=1e-5)


def test_one_unit_of_a_library_defines_the_runtime():
    """kiln's runtime definitions (kiln_runtime_defs.h: the string arena, the error value) are
    compiled into one unit of a module, not each (10-14 ms of CPU a unit), and into no shared
    kernel's unit; a kernel in another unit still reports its bad value through them, and a
    string kernel there still makes strings in their arena."""
    from kiln.codegen.c import PRELUDE, UNIT_PRELUDE, emit_c, emit_c_units, is_shared_unit
    from kiln.loops.stmt import ExternFunc
    n = 64

    def cheap(name):
        A = placeholder((n,), DType.float32, "A")
        B = compute((n,), lambda i: A[i] * 2.0 + A[(i + 1) % n], "B")
        return lower(Schedule(B), [A, B], name)
    X, Y = Buffer("in0", DType.float32, (n,)), Buffer("out0", DType.float32, (n,))
    body = ("  for (int i = 0; i < 64; ++i) {\n    if (in0[i] < 0) KILN_FAIL(3, i);\n"
            "    char* s = kiln_str_alloc(8);\n    if (!s) return -1;\n    s[0] = 1;\n    out0[i] = in0[i] + s[0];\n  }\n"
            "  kiln_str_free_all();\n  return 0;")
    heavy = "".join(f"      acc[{i}] += x[i * 8 + {i}];\n" for i in range(8))
    ext = ExternFunc("checked", (X, Y), body, errors=((3, "element {value} is negative"),))
    big = ExternFunc("big", (X, Y), "  for (int r = 0; r < 64; ++r) out0[r] = in0[r];\n" + "".join(
        f"  #pragma GCC unroll 16\n  for (int r = 0; r < 16; ++r) {{ float acc[8] = {{0}};\n"
        f"    #pragma GCC unroll 8\n    for (int i = 0; i < 8; ++i) {{\n{heavy.replace('x[', 'in0[')}    }}\n"
        f"    out0[r] += acc[0] * {k}; }}\n" for k in range(4)) + "  return 0;")
    module = LoopModule([big, cheap("c0"), ext, cheap("c1"), cheap("c2")])
    units = emit_c_units(module, 2)
    own = [u for u in units if not is_shared_unit(u)]
    assert len(own) == 2 and [u.startswith(PRELUDE) for u in own] == [True, False]
    assert all(u.startswith(UNIT_PRELUDE) and not u.startswith(PRELUDE) for u in units if is_shared_unit(u))
    assert "kiln_checked(" not in own[0].split("kiln: functions")[1]   # (the check is in the other unit)
    assert emit_c(module).startswith(PRELUDE)
    lib = build_c(module)
    x, y = np.abs(rng.standard_normal(n)).astype(np.float32), np.zeros(n, np.float32)
    lib["checked"](x, y)
    np.testing.assert_array_equal(y, x + 1)
    x[37] = -1
    with pytest.raises(KilnError, match="element 37 is negative"):
        lib["checked"](x, y)
