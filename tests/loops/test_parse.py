"""The loop IR's printed pseudocode parses back to the same IR (kiln.loops.parse).

Every IR node kind is built by hand here, printed, parsed, and compared structurally
(kiln.loops.structural) and as text (printing the parsed IR gives the same text);
bad text is a KilnError naming line:column and what was expected.
"""

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import stmt as S
from kiln.loops.expr import (INDEX, Expr, binary, call, cast, check, const, exp, isnan, logical_not, max_, min_,
                             reduce, select, truncdiv, truncmod, var)
from kiln.loops.parse import parse_expr, parse_func, parse_module, parse_stmt
from kiln.loops.structural import assert_structural_equal, structural_equal

F32, I32 = DType.float32, DType.int32


def roundtrip(ir, parse=None):
    """Print, parse, compare: the parsed IR equals `ir` and prints the same text."""
    text = str(ir)
    back = (parse or _parser_for(ir))(text)
    assert_structural_equal(ir, back)
    assert str(back) == text
    return back


def _parser_for(ir):
    if isinstance(ir, S.LoopModule):
        return parse_module
    return parse_func


def _func(body, *params, name="f", noalias=True):
    return S.PrimFunc(name, tuple(params), body, noalias)


A = S.Buffer("A", F32, (4, 8))
B = S.Buffer("B", F32, (4, 8))
i, j = var("i"), var("j")


def test_a_printed_kernel_parses_back():
    body = S.For(i, const(0, INDEX), const(4, INDEX), "parallel",
                 S.For(j, const(0, INDEX), const(8, INDEX), "vectorized",
                       S.Store(B, (i, j), max_(A[i, j] * 2.0, 0.0) + exp(A[i, (j + 1) % 8]))))
    back = roundtrip(_func(body, A, B))
    assert back.params[0].shape == (4, 8) and back.body.kind == "parallel"


@pytest.mark.parametrize("kind", S.LOOP_KINDS)
def test_every_loop_kind_and_a_nonzero_start(kind):
    body = S.For(i, const(1, INDEX), const(3, INDEX), kind, S.Store(B, (i, const(0, INDEX)), A[i, i + 1]))
    roundtrip(_func(body, A, B))


def test_loop_and_let_variables_of_another_dtype():
    k = var("k", I32)
    C = S.Buffer("C", I32, (5,))
    x = var("x", DType.float64)
    body = S.For(k, const(0, I32), const(5, I32), "serial",
                 S.Let(x, cast(DType.float64, A[0, k]), S.Store(C, (cast(INDEX, k),), cast(I32, x))))
    text = str(roundtrip(_func(body, A, C)))
    assert "for (int32 k = int32(0); k < int32(5); ++k)" in text


def test_literals_of_every_dtype_keep_their_type_and_value():
    values = {DType.float32: [1.5, -0.0, math.inf, -math.inf, math.nan, 1e-45, 3.4e38],
              DType.float64: [0.1, -2.5e-300, math.inf, math.nan], DType.float16: [1.5, -math.inf],
              DType.bfloat16: [2.0], DType.int64: [-(2 ** 63), 2 ** 63 - 1, 0, -7],
              DType.uint64: [2 ** 64 - 1], DType.int8: [-128], DType.uint8: [255], DType.bool: [0, 1],
              DType.int32: [-5], DType.float8e4m3fn: [0.5], DType.int4: [-3]}
    for dt, vs in values.items():
        for v in vs:
            e = const(v, dt)
            back = parse_expr(str(e))
            assert back is e, (dt, v, str(e))


def test_casts_modes_and_casts_of_literals_differ_from_typed_literals():
    x = var("x", F32)
    env = {"x": x}
    for e in [cast(I32, x), cast(I32, const(5, INDEX)), Expr("cast", DType.float8e4m3fn, (x,), "sat"),
              Expr("cast", DType.float8e8m0, (x,), "up_sat"), const(5, I32), cast(DType.float16, const(1.5, F32)),
              cast(DType.float16, const(1.5, DType.float64))]:
        assert parse_expr(str(e), env) is e, str(e)
    assert str(cast(I32, const(5, INDEX))) == "cast<int32>(5)" and str(const(5, I32)) == "int32(5)"


def test_every_expression_kind():
    n = var("n")
    x, y = var("x", F32), var("y", F32)
    flag = var("flag", DType.bool)
    env = {"n": n, "x": x, "y": y, "flag": flag, "A": A}
    exprs = [n + 1 - 2 * n, n // 3, n % 3, truncdiv(n, 3), truncmod(n - 9, 4), min_(n, 2), max_(n, 2),
             (n < 3) & (n >= 1) | logical_not(flag), n.eq(4) ^ flag, n.ne(4), n <= 2, n > 1,
             (n & 6) | (n ^ 3) | (n << 2) | (n >> 1), x / y, select(x > y, x, y), call("pow", x, y),
             call("atan2", x, y), call("exp_floored", x), isnan(x), call("abs", n), call("sign", n),
             check(A[n, 0], n < 4, n, "index {value} is out of range \"[0, 4)\""),
             ~n, -x, x.astype(DType.float64), A[n % 4, min_(n, 7)]]
    for e in exprs:
        assert parse_expr(str(e), env) is e, str(e)


def test_reductions_parse_with_their_axes():
    k = var("k", dom=(0, 8), kind="reduce")
    r = var("r", dom=(0, 4), kind="reduce")
    for comb in ("sum", "prod", "max", "min"):
        e = reduce(comb, A[r, k] * 2.0, [r, k])
        assert parse_expr(str(e), {"A": A, "k": k, "r": r}) is e


def test_blocks_sequences_and_lets_keep_their_shape():
    v, w = var("v", F32), var("w", F32)
    st = S.Store(B, (i, j), A[i, j])
    st2 = S.Store(B, (j, i), A[j, i])
    shapes = [
        S.Seq((st, st2)),
        S.Seq((S.Seq((st, st2)), st)),                      # a nested Seq is a braced block
        S.Seq((st,)),                                       # a Seq of one
        S.Seq(()),                                          # and of none
        S.Let(v, A[i, j], S.Seq((S.Store(B, (i, j), v), st2))),
        S.Seq((S.Let(v, A[i, j], S.Store(B, (i, j), v)), st2)),  # a let followed by more: braced body
        S.Seq((st, S.Let(v, A[i, j], S.Let(w, v * v, S.Store(B, (i, j), w))))),
        S.Let(v, A[i, j], S.Seq(())),
        S.IfThenElse(i < 2, st, None),
        S.IfThenElse(i < 2, st, st2),
        S.IfThenElse(i < 2, S.Seq(()), S.Seq((st,))),
        S.Evaluate(check(A[i, j], i < 4, i, "bad")),
    ]
    for s in shapes:
        body = S.For(i, const(0, INDEX), const(4, INDEX), "serial",
                     S.For(j, const(0, INDEX), const(4, INDEX), "serial", s))
        roundtrip(_func(body, A, B))
        back = parse_stmt(str(s), {"A": A, "B": B, "i": i, "j": j})
        assert structural_equal(s, back), str(s)


def test_allocations_scopes_and_a_buffer_shared_by_two_allocations():
    L = S.Buffer("acc", F32, (8,), scope="local")
    fill = S.For(j, const(0, INDEX), const(8, INDEX), "vectorized", S.Store(L, (j,), A[0, j]))
    body = S.Seq((S.Allocate(L, fill, "stack"), S.Allocate(L, fill, "heap"),
                  S.Allocate(S.Buffer("t", F32, (2, 2)), S.Seq(()), "auto")))
    back = roundtrip(_func(body, A, B))
    assert back.body.stmts[0].buffer is back.body.stmts[1].buffer and back.body.stmts[0].buffer.scope == "local"


def test_symbolic_dims_names_that_need_quoting_and_may_alias():
    n = var("n")
    X = S.Buffer("x in", F32, (n, 4))
    Y = S.Buffer("for", F32, (n, 4))
    body = S.For(i, const(0, INDEX), n, "serial", S.Store(Y, (i, const(1, INDEX)), X[i, const(0, INDEX)]))
    back = roundtrip(_func(body, X, Y, name="my kernel", noalias=False))
    assert back.params[0].shape[0] is back.params[1].shape[0] is back.body.extent
    assert back.params[0].name == "x in" and not back.noalias


def test_same_names_get_suffixes_and_parse_to_distinct_objects():
    i2 = var("i")
    A2 = S.Buffer("A", F32, (4, 8))
    body = S.Seq((S.For(i, const(0, INDEX), const(4, INDEX), "serial", S.Store(A2, (i, i), A[i, i])),
                  S.For(i2, const(0, INDEX), const(4, INDEX), "serial", S.Store(A2, (i2, i2), A[i2, i2])),
                  S.For(i, const(0, INDEX), const(4, INDEX), "serial", S.Store(A, (i, i), A2[i, i]))))
    f = _func(body, A, A2)
    text = str(f)
    assert "A_1[" in text and "i_1 = 0" in text
    back = roundtrip(f)
    loops = back.body.stmts
    assert loops[0].var is loops[2].var and loops[0].var is not loops[1].var   # sharing kept
    bad = _func(S.Seq((body.stmts[0], body.stmts[0])), A, A2)
    assert not structural_equal(bad, back)


def test_a_module_with_an_extern_kernel_calls_views_entry_and_interface():
    X = S.Buffer("in0", F32, (4,))
    Y = S.Buffer("out0", INDEX, (2,))
    c_body = "  if (in0[0] != in0[0]) {\n    return 1;\n  }\n}\n\n  out0[0] = 1;\nreturn 0;"
    ext = S.ExternFunc("k0_Unique", (X, Y), c_body, dynamic=True,
                       preamble="#include <math.h>\nstatic int f(int x) {\n  return x;\n}",
                       libs=(("z", "zlib.h", "zlib1g-dev"),), errors=((1, "NaN {value} in input"),))
    arena = S.Buffer("arena", DType.uint8, (64,))
    main = _func(S.Seq((S.Call("k0_Unique", (S.View(arena, 0), S.View(arena, 16))),
                        S.Call("k1", (X, X)))), arena, X, name="main")
    k1 = _func(S.Store(X, (const(0, INDEX),), X[const(1, INDEX)] + 1.0), X, S.Buffer("y", F32, (4,)), name="k1")
    m = S.LoopModule([ext, k1, main], entry="main", interface='{"inputs": [["float32", [4]]]}')
    back = roundtrip(m)
    assert back.funcs[0].c_body == c_body and back.funcs[0].libs == ext.libs and back.entry == "main"
    roundtrip(S.ExternFunc("e", (X,), ""))


@pytest.mark.parametrize("text, where, expected", [
    ("func f(float32 A[4]) {\n  A[0] = 1.0f\n}", "3:1", "expected ';' after a store"),
    ("func f(float32 A[4]) {\n  for (i = 0; j < 4; ++i) {\n  }\n}", "2:15", "loop variable 'i'"),
    ("func f(float32 A[4]) {\n  A[0] = B[0];\n}", "2:10", "unknown name 'B'"),
    ("func f(float32 A[4]) {\n  A[0, 1] = 1.0f;\n}", "2:3", "rank 1, stored with 2"),
    ("func f(float32 A[4]) {\n  A[0] = 1.0f + 2;\n}", "2:15", "dtype mismatch"),
    ("func f(float32 A[4]) {\n  A[0] = foo(1.0f);\n}", "2:10", "unknown function 'foo'"),
    ("func f(float33 A[4]) {\n}", "1:8", "expected a dtype"),
    ("func f(float32 A[4]) {\n  A[0] = 1.0f;\n", "3:1", "expected '}' closing the block"),
    ("func f(float32 A[4]) {\n  A[0] = 1.0f $ 2;\n}", "2:15", "unexpected character '$'"),
    ("fun f(float32 A[4]) {\n}", "1:1", "expected 'func'"),
    ("func f(float32 A[4]) {\n  A[0] = exp(1.0f, 2.0f);\n}", "2:10", "takes 1 argument"),
])
def test_parse_errors_name_line_column_and_what_was_expected(text, where, expected):
    with pytest.raises(KilnError) as info:
        parse_func(text)
    msg = str(info.value)
    assert f"loop IR text {where}:" in msg and expected in msg, msg


def test_hand_written_text_uses_c_precedence():
    n = var("n")
    assert parse_expr("n + 2 * n < 3 && n >= 0 || n == 7", {"n": n}) is \
        ((n + 2 * n < 3) & (n >= 0)) | n.eq(7)
    assert parse_expr("n - 1 - 2", {"n": n}) is (n - 1) - 2


# -- random expressions: every op, dtype and literal the printer can meet ------------------

_DT = [DType.int64, DType.int32, DType.uint8, DType.float32, DType.float64, DType.float16, DType.bool]
_VARS = {dt: var(f"v_{dt.name}", dt) for dt in _DT}
_BUF = {dt: S.Buffer(f"buf_{dt.name}", dt, (3, 5)) for dt in _DT}
_ENV = {**{v.arg.name: v for v in _VARS.values()}, **{b.name: b for b in _BUF.values()}}
_INT_OPS = ["add", "sub", "mul", "floordiv", "floormod", "truncdiv", "truncmod", "min", "max", "bitand", "bitor",
            "bitxor", "shl", "shr"]
_FLOAT_OPS = ["add", "sub", "mul", "div", "min", "max"]


def _literal(draw, dt):
    if dt is DType.bool:
        return const(draw(st.booleans()), dt)
    if dt.is_float:
        return const(draw(st.floats(width=16 if dt is DType.float16 else 32 if dt is DType.float32 else 64)), dt)
    lo, hi = (-(2 ** 63), 2 ** 63 - 1) if dt is DType.int64 else (-(2 ** 31), 2 ** 31 - 1) if dt is I32 else (0, 255)
    return const(draw(st.integers(lo, hi)), dt)


def _expr(draw, dt, depth):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([_VARS[dt], _literal(draw, dt)]))
    sub = lambda d=dt: _expr(draw, d, depth - 1)  # noqa: E731
    kind = draw(st.sampled_from(["binary", "cast", "select", "load", "special"]))
    if kind == "binary" and dt is DType.bool:
        if draw(st.booleans()):
            return binary(draw(st.sampled_from(["and", "or", "ne"])), sub(), sub())
        other = draw(st.sampled_from([DType.int64, DType.float32, I32]))
        return binary(draw(st.sampled_from(["lt", "le", "gt", "ge", "eq", "ne"])), sub(other), sub(other))
    if kind == "binary":
        return binary(draw(st.sampled_from(_FLOAT_OPS if dt.is_float else _INT_OPS)), sub(), sub())
    if kind == "cast":
        src = draw(st.sampled_from(_DT))
        return Expr("cast", dt, (sub(src),), draw(st.sampled_from([None, None, "sat"]))) if src is not dt else sub()
    if kind == "select":
        return select(sub(DType.bool), sub(), sub())
    if kind == "load":
        return _BUF[dt][sub(DType.int64), sub(I32)]
    if dt is DType.bool:
        return logical_not(sub()) if draw(st.booleans()) else isnan(sub(DType.float32))
    if dt.is_float:
        name = draw(st.sampled_from(["exp", "sqrt", "pow", "atan2", "sigmoid", "fabs", "exp_floored"]))
        return call(name, *[sub() for _ in range(2 if name in ("pow", "atan2") else 1)])
    return check(sub(), sub(DType.bool), sub(DType.int64), draw(st.text(max_size=8)))


@settings(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(_DT))
def test_random_expressions_print_and_parse_to_the_same_node(data, dt):
    e = _expr(data.draw, dt, 4)
    assert parse_expr(str(e), _ENV) is e, str(e)
