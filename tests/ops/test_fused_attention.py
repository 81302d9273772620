"""kiln::FusedAttention's native kernel (online softmax over K/V blocks) against its NumPy
reference, on fresh random inputs: random shapes, head groupings, layouts, masks, causal
offsets, odd and tiny sequence lengths, and rows with every key masked."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.interpreter import Interpreter
from kiln.ops.infer import Inferencer

PERMS = [(0, 1, 2, 3), (0, 2, 1, 3)]   # (b, h, s, d) stored as is, or as (b, s, h, d)


def _phys(shape, perm):
    """The stored shape whose numpy.transpose by `perm` has the logical `shape`."""
    inv = [perm.index(i) for i in range(4)]
    return tuple(shape[i] for i in inv)


def fused_node(k, b, hq, hkv, sq, sk, d, dv, *, perms=None, out_perm=(0, 1, 2, 3), mask=None,
               dtype=DType.float32, **attrs):
    """FusedAttention node `k` (inputs q{k}, k{k}, v{k}, mask{k}) and its inputs; `mask` =
    (shape, DType) of a mask input, or None."""
    qp, kp, vp = perms or ((0, 1, 2, 3),) * 3
    ins = [Value(f"q{k}", TensorType(dtype, _phys((b, hq, sq, d), qp))),
           Value(f"k{k}", TensorType(dtype, _phys((b, hkv, sk, d), kp))),
           Value(f"v{k}", TensorType(dtype, _phys((b, hkv, sk, dv), vp)))]
    if mask is not None:
        ins.append(Value(f"mask{k}", TensorType(mask[1], tuple(mask[0]))))
    attrs = dict(q_perm=list(qp), k_perm=list(kp), v_perm=list(vp), out_perm=list(out_perm), **attrs)
    node = Node("FusedAttention", list(ins), [Value(f"y{k}", None)], attrs, f"fa{k}", "kiln")
    Inferencer(OPSETS).infer_node(node)
    return node, ins


OPSETS = {"": 17, "kiln": 1}


def fused_graph(*args, **kw):
    """A graph of one FusedAttention node (fused_node's arguments)."""
    return many([fused_node(0, *args, **kw)])


def many(made):
    """One graph (one native module to build) of several (node, inputs)."""
    nodes = [n for n, _ in made]
    return Graph("g", [v for _, ins in made for v in ins], [n.outputs[0] for n in nodes], nodes, OPSETS)


def feeds_for(g: Graph, rng, mask_fn=None):
    """Random inputs; masks from `mask_fn` (a function of the shape, or {input name: function})."""
    out = []
    for v in g.inputs:
        shape, dt = tuple(v.type.shape), v.type.dtype.np
        fn = mask_fn.get(v.name) if isinstance(mask_fn, dict) else mask_fn
        if v.name.startswith("mask"):
            out.append(fn(shape) if fn else rng.standard_normal(shape).astype(dt))
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            x[x == 0] = 0.5
            out.append(x.astype(dt))
    return out


def check(g: Graph, xs, rtol=1e-4, atol=1e-5):
    wants = Interpreter(g).run(xs)
    gots = kiln.compile(g, opt_level=0)(*xs)
    gots = gots if isinstance(gots, tuple) else (gots,)
    for got, want in zip(gots, wants):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=atol)
    return gots[0], wants[0]


CASE = st.fixed_dictionaries(dict(
    b=st.integers(1, 2), hkv=st.integers(1, 3), group=st.sampled_from([1, 2, 4]), sq=st.integers(1, 70),
    sk=st.integers(1, 150), d=st.sampled_from([8, 16, 24, 64]), dv=st.sampled_from([8, 16, 40, 64]),
    perm=st.sampled_from(PERMS), mask=st.sampled_from([None, "add", "add_row", "bool", "bool_not"]),
    causal=st.sampled_from([-1, 0, 3])))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(CASE, min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_random_shapes_masks_and_head_groups(cases, seed):
    """Four random attentions per example, built as one module (a build per node would be slow)."""
    rng = np.random.default_rng(seed)
    made, fns = [], {}
    for k, c in enumerate(cases):
        b, hq, hkv, sq, sk, d, dv = c["b"], c["hkv"] * c["group"], c["hkv"], c["sq"], c["sk"], c["d"], c["dv"]
        mask, perm = c["mask"], c["perm"]
        attrs = dict(scale=1 / math.sqrt(d), causal=c["causal"])
        mspec = None
        if mask == "add":
            mspec = ((b, 1, sq, sk), DType.float32)
        elif mask == "add_row":   # a padding mask: one row per batch, broadcast over heads and queries
            mspec = ((b, 1, 1, sk), DType.float32)
            fns[f"mask{k}"] = lambda s: np.where(rng.random(s) < 0.3, np.float32(-1e4), np.float32(0))
        elif mask in ("bool", "bool_not"):
            mspec = ((sq, sk), DType.bool)
            fns[f"mask{k}"] = lambda s, m=mask: (rng.random(s) < 0.7) == (m == "bool")
            attrs.update(fill=float(np.finfo(np.float32).min))
        if mask is not None:
            attrs["mask_kind"] = mask if mask.startswith("bool") else "add"
        made.append(fused_node(k, b, hq, hkv, sq, sk, d, dv, perms=(perm, perm, perm), out_perm=perm, mask=mspec,
                               **attrs))
    g = many(made)
    check(g, feeds_for(g, rng, fns))


def test_odd_and_tiny_lengths():
    """Query and key counts of 1, 2, and either side of the 64-key block and 24-row tile."""
    rng = np.random.default_rng(7)
    sizes = [(1, 1), (1, 2), (2, 1), (23, 25), (63, 65), (65, 63), (129, 127)]
    g = many([fused_node(k, 1, 4, 2, sq, sk, 32, 32, scale=0.2, causal=max(0, sk - sq))
              for k, (sq, sk) in enumerate(sizes)])
    check(g, feeds_for(g, rng))


@pytest.mark.parametrize("mask", [None, "row", "causal"])
def test_kv_lens_read_the_filled_rows_of_a_cache_buffer(mask):
    """K/V buffers of 80 rows of which kv_lens are filled (a KV cache read in place): rows past
    the lengths hold 1e6 and are never seen; with a mask of the filled width (a padding row
    shared by heads and queries, or a causal [B, 1, S, n] one), the keys stop at its width.
    Lengths 0 (nothing visible: NaN), 1, and across a key block."""
    rng = np.random.default_rng(11)
    b, hq, hkv, sq, cap, d = 3, 4, 2, 2 if mask == "causal" else 1, 80, 16
    n = 70   # the mask's width: the rows the graph sliced off
    mspec = None if mask is None else (((b, 1, 1, n) if mask == "row" else (b, 1, sq, n)), DType.float32)
    node, ins = fused_node(0, b, hq, hkv, sq, cap, d, d, mask=mspec, scale=0.25,
                           **({} if mask is None else {"mask_kind": "add"}))
    if mask is None:
        node.inputs.append(None)
    lens = Value("lens0", TensorType(DType.int64, (b,)))
    node.inputs.append(lens)
    g = many([(node, ins + [lens])])
    q, k, v = (rng.standard_normal(x.type.shape).astype(np.float32) for x in ins[:3])
    filled = np.array([0, 1, 66]) if mask is None else np.array([1, 5, 70])
    for x in (k, v):
        for i, f in enumerate(filled):
            x[i, :, f:] = 1e6
    xs = [q, k, v]
    if mask is not None:
        m = np.where(rng.random(mspec[0]) < 0.2, np.float32(-1e4), np.float32(0))
        if mask == "causal":
            m[:, :, 0, -1] = -np.inf   # the first query does not see the last key
        xs.append(m)
    xs.append(filled.astype(np.int64))
    got, want = check(g, xs)
    assert np.isnan(got[0]).all() == (filled[0] == 0)
    assert np.isfinite(got[1:]).all()


def test_gpt2_layout_causal_additive_mask():
    """GPT-2's form: Q/K/V read as (b, s, h, d), a [B, 1, S, S] additive causal mask of
    float32's min (blocks above the diagonal all dead: skipped), the output written (b, s, h, d)."""
    rng = np.random.default_rng(0)
    s = 200
    tri = np.where(np.tril(np.ones((s, s), bool)), np.float32(0), np.finfo(np.float32).min)
    g = fused_graph(2, 4, 4, s, s, 64, 64, perms=((0, 2, 1, 3),) * 3, out_perm=(0, 2, 1, 3),
                    mask=((2, 1, s, s), DType.float32), scale=0.125, mask_kind="add")
    check(g, feeds_for(g, rng, lambda shape: np.broadcast_to(tri, shape).copy()))


@pytest.mark.parametrize("d", [32, 64])
def test_rows_in_place_and_keys_transposed_by_blocks(d):
    """Head sizes of whole vectors: V's rows read in place by P·V and K transposed 16 keys at a
    time (AVX-512), with key counts either side of 16-key chunks and 64-key blocks, grouped
    heads, a padding mask, causal; beside layouts that still pack (K stored [b, h, d, s], V
    [b, h, dv, s]: strided along the head dim)."""
    rng = np.random.default_rng(11)
    made, fns = [], {}
    for k, (sq, sk) in enumerate([(3, 1), (17, 15), (16, 16), (20, 17), (40, 63), (33, 65), (70, 130)]):
        perm = PERMS[k % 2]
        made.append(fused_node(k, 2, 4, 2, sq, sk, d, d, perms=(perm, perm, perm), out_perm=perm,
                               mask=((2, 1, 1, sk), DType.float32), mask_kind="add", scale=0.125,
                               causal=max(0, sk - sq) if k % 3 == 0 else -1))
        fns[f"mask{k}"] = lambda s: np.where(rng.random(s) < 0.2, np.float32(-1e4), np.float32(0))
    for k, perms in enumerate([((0, 1, 2, 3), (0, 1, 3, 2), (0, 1, 2, 3)), ((0, 2, 1, 3), (0, 2, 1, 3), (0, 1, 3, 2))],
                              start=len(made)):
        made.append(fused_node(k, 1, 4, 4, 21, 37, d, d, perms=perms, scale=0.125, causal=16))
    g = many(made)
    check(g, feeds_for(g, rng, fns))


def test_fully_masked_rows_nan_or_zero():
    """A row whose every key is -inf: NaN as the decomposed softmax (0/0), or zeros
    (ONNX Attention's rule); a row masked with float32's min instead averages V uniformly."""
    rng = np.random.default_rng(1)
    sq, sk = 5, 70
    m = rng.standard_normal((1, 1, sq, sk)).astype(np.float32)
    m[0, 0, 1] = -np.inf
    m[0, 0, 3] = np.finfo(np.float32).min
    g = many([fused_node(k, 1, 2, 1, sq, sk, 16, 16, mask=((1, 1, sq, sk), DType.float32), mask_kind="add",
                         empty=empty, scale=0.25) for k, empty in enumerate(("nan", "zero"))])
    xs = feeds_for(g, rng, lambda shape: m)
    wants = Interpreter(g).run(xs)
    gots = kiln.compile(g, opt_level=0)(*xs)
    for k, (got, want) in enumerate(zip(gots, wants)):
        v = xs[4 * k + 2]
        assert np.isnan(want[0, :, 1]).all() == (k == 0)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        if k == 1:
            assert not got[0, :, 1].any()
        np.testing.assert_allclose(got[0, :, 3], v[0, 0].mean(axis=0)[None].repeat(2, 0), rtol=1e-4, atol=1e-5)
        keep = ~np.isnan(want)
        np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-5)


def test_bool_mask_with_minus_inf_fill_and_dead_blocks():
    """Where(mask, scores, -inf) with whole 64-key blocks masked for some rows, all keys for one."""
    rng = np.random.default_rng(2)
    sq, sk = 30, 200
    m = rng.random((1, 1, sq, sk)) < 0.9
    m[:, :, :10, :128] = False
    m[:, :, 12] = False
    g = fused_graph(1, 3, 3, sq, sk, 16, 8, mask=((1, 1, sq, sk), DType.bool), mask_kind="bool",
                    fill=-math.inf, scale=0.3)
    xs = feeds_for(g, rng, lambda shape: m)
    want = Interpreter(g).run(xs)[0]
    got = kiln.compile(g, opt_level=0)(*xs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-5)


def test_half_inputs():
    """float16 and bfloat16 q, k, v (computed in float32, stored back in their dtype)."""
    rng = np.random.default_rng(3)
    g = many([fused_node(k, 1, 4, 2, 33, 77, 32, 32, dtype=dt, scale=0.18, causal=0)
              for k, dt in enumerate((DType.float16, DType.bfloat16))])
    check(g, feeds_for(g, rng), rtol=2e-2, atol=2e-2)


def test_bad_layout_and_heads_are_clear_errors():
    x = [Value(n, TensorType(DType.float32, (1, 2, 4, 8))) for n in "qkv"]
    node = Node("FusedAttention", x, [Value("y", None)], {"q_perm": [0, 1, 2, 2]}, "fa", "kiln")
    with pytest.raises(kiln.KilnError, match="q_perm must be a permutation"):
        Inferencer({"": 17, "kiln": 1}).infer_node(node)
    with pytest.raises(kiln.KilnError, match="do not fit"):
        fused_graph(1, 3, 2, 4, 4, 8, 8)


def test_forks_only_where_the_threads_save_more_than_the_fork():
    """The kernel's fork decision is the cost model's (kiln.lower.nnutil.parallel_worth, the
    "attention" rate, the Target's fork cost), not a bare work floor: 4 heads x 32 keys (~20 us
    on one AVX-512 core) stay serial where threads sleep between kernels, 8 heads x 256 keys fork."""
    from kiln.compiler import run_stages
    from kiln.targets.target import Target
    sleep = Target.named("x86-64-v4", omp_wait_policy="PASSIVE", omp_spincount="", threads_impl="omp")

    def fork_arg(*dims, **decisions):
        src = run_stages(fused_graph(*dims), "c", cpu=sleep, opt_level=0, decisions=decisions or None).source.text
        call = next(line for line in src.splitlines() if "return kiln_flash_attention" in line)
        return call.rstrip(");").split(", ")[-1]
    assert fork_arg(1, 4, 4, 32, 32, 64, 64) == "INT64_MAX"
    assert fork_arg(1, 8, 8, 256, 256, 64, 64) == "0"
    assert fork_arg(1, 4, 4, 32, 32, 64, 64, fork_gain=0, parallel_min_work=0) == "0"   # a tuner's override


@settings(max_examples=6, deadline=None)
@given(mr=st.integers(1, 8), q_tiles=st.integers(1, 6), blocks=st.integers(1, 4), sq=st.integers(1, 40),
       sk=st.integers(1, 90), causal=st.sampled_from([-1, 0]))
def test_tile_decisions_replay_against_the_reference(mr, q_tiles, blocks, sq, sk, causal):
    """The tuner's knobs (attention.mr, .q_tiles, .bk: kiln.lower.fused_attention) give the
    reference's result whatever their values; keys per block in whole micro-tiles of keys."""
    from kiln.lower.fused_attention import flash_tile
    from kiln.targets.target import Target
    step = flash_tile(Target.host(), 32, sk).nk * Target.host().vector_lanes(4)
    g = fused_graph(2, 4, 2, sq, sk, 32, 32, scale=0.2, causal=causal if causal < 0 else max(0, sk - sq))
    xs = feeds_for(g, np.random.default_rng(sq * 100 + sk))
    want = Interpreter(g).run(xs)[0]
    got = kiln.compile(g, opt_level=0, decisions={"attention.mr": mr, "attention.q_tiles": q_tiles,
                                                  "attention.bk": step * blocks})(*xs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_keys_per_block_outside_whole_micro_tiles_is_an_error():
    from kiln.errors import KilnError
    g = fused_graph(1, 2, 2, 8, 40, 32, 32, scale=0.2)
    with pytest.raises(KilnError, match=r"illegal value 7 for decision 'attention.bk'.*multiple"):
        kiln.compile(g, opt_level=0, decisions={"attention.bk": 7})


def test_the_kernel_is_a_shared_unit_of_its_own():
    """Each instance (element types, head sizes, tiles) is a shared kernel (csource.c_shared):
    one translation unit of its own, the same text in every module that uses it (its object
    cached per machine, and compiled as lowering meets it), none of its code in the module's
    units; a second instance is a second unit."""
    from kiln.codegen.c import is_shared_unit
    from kiln.compiler import run_stages

    def units(g):
        return run_stages(g, "c").source.units

    def attention_units(us):
        return [u for u in us if is_shared_unit(u) and "kiln_flash_attention" in u]
    a = units(fused_graph(1, 4, 2, 9, 33, 32, 32, scale=0.5))
    b = units(many([fused_node(0, 2, 8, 4, 17, 33, 32, 32, scale=0.25, causal=1),    # other sizes
                    fused_node(1, 1, 2, 2, 5, 6, 16, 16, scale=0.5)]))                  # other head sizes
    (one,) = attention_units(a)
    assert one in attention_units(b) and len(attention_units(b)) == 2
    assert not any("_tiles" in u for u in a + b if not is_shared_unit(u))
