"""RNN / GRU / LSTM with constant weights at -O3: decompose_recurrent's input-projection GEMM
+ kiln::Recurrent's native kernel (packed R, fused gates, directions in parallel), against
the ONNX ops' NumPy reference (kiln's interpreter) on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import helper as oh, numpy_helper

import kiln
from kiln.frontends.onnx import load_onnx
from kiln.ops.recurrent import pack_r, unpack_r
from kiln.passes.pipeline import run_passes

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
ACTS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
        "Elu", "Softsign", "Softplus"]


def layer(k: int, kind: str, rng, *, seq, batch, inp, hs, nd=1, layout=0, bias=True, lens=None, h0=False,
          c0=False, peep=False, outputs=None, direction=None, **attrs):
    """One recurrent node (inputs x{k}, lens{k}, h{k}, c{k} fed at run time; W, R, B, P constant):
    (node, initializers, graph inputs with their feeds, output names)."""
    g = GATES[kind]
    state = (batch, nd, hs) if layout else (nd, batch, hs)

    def f(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    feeds = {f"x{k}": f((batch, seq, inp) if layout else (seq, batch, inp))}
    inits = {f"W{k}": f((nd, g * hs, inp), 0.5), f"R{k}": f((nd, g * hs, hs), 0.5)}
    names = [f"x{k}", f"W{k}", f"R{k}", ""]
    if bias:
        inits[f"B{k}"], names[3] = f((nd, 2 * g * hs), 0.5), f"B{k}"
    names += ["", "", "", ""][:4 if kind == "LSTM" else 2]
    if lens is not None:
        feeds[f"lens{k}"], names[4] = np.asarray(lens, np.int32), f"lens{k}"
    if h0:
        feeds[f"h{k}"], names[5] = f(state), f"h{k}"
    if c0:
        feeds[f"c{k}"], names[6] = f(state), f"c{k}"
    if peep:
        inits[f"P{k}"], names[7] = f((nd, 3 * hs), 0.5), f"P{k}"
    while names[-1] == "":
        names.pop()
    outs = outputs or ([f"y{k}", f"yh{k}"] + ([f"yc{k}"] if kind == "LSTM" else []))
    outs = [o.format(k=k) for o in outs]
    direction = direction or ("bidirectional" if nd == 2 else "forward")
    node = oh.make_node(kind, names, outs, hidden_size=hs, direction=direction, layout=layout, **attrs)
    return node, inits, feeds, [o for o in outs if o]


def model(layers):
    nodes, inits, feeds, outs = [], {}, {}, []
    for n, i, f, o in layers:
        nodes.append(n)
        inits.update(i)
        feeds.update(f)
        outs += o
    vi = [oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    g = oh.make_graph(nodes, "g", vi, [oh.make_tensor_value_info(o, 0, None) for o in outs],
                      [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 22)]), feeds


def check(layers, rtol=1e-4, atol=1e-5, decisions=None):
    m, feeds = model(layers)
    optimized, _ = run_passes(load_onnx(m))
    ops = {n.qualified_op for n in optimized.nodes}
    assert "kiln::Recurrent" in ops and not ops & set(GATES), ops
    got = kiln.compile(m, decisions=decisions).run(feeds)
    want = kiln.compile(m, target="interpreter", opt_level=0).run(feeds)  # the ONNX ops themselves
    assert set(got) == set(want)
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max(initial=0))),
                                   err_msg=name)


@pytest.mark.parametrize("hs", [1, 16, 21])
@pytest.mark.parametrize("kind", list(GATES))
def test_pack_roundtrip(kind, hs):
    r = np.random.default_rng(hs).standard_normal((2, GATES[kind] * hs, hs)).astype(np.float32)
    rp = pack_r(r, GATES[kind], 16)
    assert rp.shape == (2, -(-hs // 16), hs, GATES[kind], 16)
    np.testing.assert_array_equal(unpack_r(rp), r)


def test_cases():
    """One module holding the corners: every kind and direction, layouts, ragged sequence_lens
    (0 and full included), initial states, peepholes, clip, activations with alpha/beta, GRU in
    both reset orders, input_forget, absent outputs, seq and hidden 1, hidden past one panel."""
    rng = np.random.default_rng(0)
    cases = [
        ("RNN", dict(seq=5, batch=3, inp=4, hs=5)),
        ("RNN", dict(seq=4, batch=2, inp=3, hs=17, nd=2, activations=["LeakyRelu", "Elu"],
                     activation_alpha=[0.3, 0.7], h0=True)),
        ("GRU", dict(seq=6, batch=5, inp=7, hs=20, nd=2, lens=[6, 3, 0, 5, 1], linear_before_reset=1, h0=True)),
        ("GRU", dict(seq=3, batch=2, inp=9, hs=33, layout=1, clip=0.5, bias=False)),
        ("GRU", dict(seq=4, batch=3, inp=5, hs=9, direction="reverse", lens=[4, 2, 0],
                     activations=["HardSigmoid", "Softsign"], activation_alpha=[0.3], activation_beta=[0.4])),
        ("LSTM", dict(seq=5, batch=3, inp=6, hs=18, nd=2, layout=1, lens=[5, 1, 3], h0=True, c0=True, peep=True)),
        ("LSTM", dict(seq=4, batch=4, inp=5, hs=7, input_forget=1, peep=True, clip=0.9, h0=True)),
        ("LSTM", dict(seq=3, batch=2, inp=3, hs=6, nd=2, activations=["Sigmoid", "Tanh", "Relu", "HardSigmoid",
                                                                        "Softsign", "ScaledTanh"],
                      activation_alpha=[0.2, 1.5], activation_beta=[0.5, 0.5])),
        ("LSTM", dict(seq=1, batch=1, inp=1, hs=1, outputs=["", "yh{k}"])),
        ("LSTM", dict(seq=2, batch=1, inp=4, hs=16, outputs=["", "", "yc{k}"], direction="reverse")),
    ]
    check([layer(k, kind, rng, **kw) for k, (kind, kw) in enumerate(cases)])


def _split_layers():
    rng = np.random.default_rng(1)
    return [layer(0, "LSTM", rng, seq=7, batch=3, inp=10, hs=136, lens=[7, 2, 5], h0=True, c0=True),
            layer(1, "GRU", rng, seq=5, batch=1, inp=6, hs=150, direction="reverse"),
            layer(2, "GRU", rng, seq=4, batch=2, inp=6, hs=150, linear_before_reset=1, nd=2),
            layer(3, "LSTM", rng, seq=3, batch=8, inp=5, hs=40),        # one tile, gates in two passes
            layer(4, "GRU", rng, seq=3, batch=19, inp=5, hs=20, linear_before_reset=1),   # two tiles
            # batch rows shared out between threads (kiln.lower.recurrent.ROW_MIN): ragged lens and
            # initial states per group, both directions, GRU's two stages, a tail panel
            layer(5, "LSTM", rng, seq=6, batch=9, inp=4, hs=24, nd=2, lens=[6, 1, 0, 4, 6, 2, 5, 3, 6], h0=True,
                  c0=True, peep=True),
            layer(6, "GRU", rng, seq=5, batch=13, inp=3, hs=33, direction="reverse", lens=[5, 4, 3, 2, 1, 0, 5, 5, 5,
                                                                                          4, 3, 2, 1], h0=True),
            layer(7, "RNN", rng, seq=1, batch=8, inp=2, hs=16),
            # rows could be shared out, but two threads' panels fit their L1d (rows_pay): panels
            layer(8, "LSTM", rng, seq=4, batch=8, inp=5, hs=64)]


def test_split_between_threads():
    """Steps big enough to share (kiln.lower.recurrent.team_per_direction): a direction's panels claimed by the threads
    (when the machine has two) stage by stage; ragged lens, odd batch, a tail panel, GRU's two
    stages per step, batch tiles whose gates are summed in passes; batches whose rows are
    shared out instead."""
    check(_split_layers())


@pytest.mark.parametrize("directions", ["shared", "own"])
def test_directions_shared_or_own(directions):
    """Bidirectional layers whose steps are big enough to share, both ways of running their
    directions (kiln.lower.recurrent.DIRECTIONS): claimed by the team stage by stage, or a
    thread each with no synchronisation; ragged lens, initial states, GRU's two stages."""
    rng = np.random.default_rng(4)
    check([layer(0, "LSTM", rng, seq=6, batch=1, inp=7, hs=136, nd=2, lens=[5], h0=True, c0=True),
           layer(1, "GRU", rng, seq=5, batch=3, inp=6, hs=150, nd=2, lens=[5, 0, 2], h0=True),
           layer(2, "LSTM", rng, seq=3, batch=8, inp=5, hs=130, nd=2, peep=True)],
          decisions={"recurrent.directions": directions})


@pytest.mark.slow
@pytest.mark.parametrize("threads,impl", [("3", "pool"), ("4", "omp"), ("1", "pool")])
def test_split_between_more_threads_than_cores(threads, impl):
    """More threads than cores: partners are descheduled mid-run, and whoever runs claims
    their panels (the same results as the reference, run after run); on kiln's pool and on
    OpenMP's team (KILN_THREADS_IMPL), whose members kiln_par_for hands out alike; one thread."""
    import os
    import subprocess
    import sys
    code = ("from tests.ops.test_recurrent_packed import check, _split_layers\n"
            "for _ in range(20): check(_split_layers())\n")
    env = dict(os.environ, OMP_NUM_THREADS=threads, KILN_THREADS_IMPL=impl)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def test_left_alone_when_weights_are_inputs():
    rng = np.random.default_rng(2)
    node, inits, feeds, outs = layer(0, "LSTM", rng, seq=3, batch=2, inp=4, hs=5)
    feeds.update(inits)
    m, _ = model([(node, {}, feeds, outs)])
    optimized, _ = run_passes(load_onnx(m))
    assert [n.op for n in optimized.nodes] == ["LSTM"]


@st.composite
def layers(draw):
    kind = draw(st.sampled_from(list(GATES)))
    nd = draw(st.sampled_from([1, 2]))
    seq, batch = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    kw = dict(seq=seq, batch=batch, inp=draw(st.integers(1, 9)), hs=draw(st.sampled_from([1, 3, 8, 15, 16, 17, 31, 40])),
              nd=nd, layout=draw(st.integers(0, 1)), bias=draw(st.booleans()), h0=draw(st.booleans()))
    if nd == 1:
        kw["direction"] = draw(st.sampled_from(["forward", "reverse"]))
    if draw(st.booleans()):
        kw["lens"] = draw(st.lists(st.integers(0, seq), min_size=batch, max_size=batch))
    if draw(st.booleans()):
        kw["clip"] = draw(st.floats(0.1, 3.0))
    if kind == "LSTM":
        kw.update(c0=draw(st.booleans()), peep=draw(st.booleans()), input_forget=draw(st.integers(0, 1)))
    if kind == "GRU":
        kw["linear_before_reset"] = draw(st.integers(0, 1))
    if draw(st.booleans()):
        per = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
        kw["activations"] = draw(st.lists(st.sampled_from(ACTS), min_size=per * nd, max_size=per * nd))
        for attr in ("activation_alpha", "activation_beta"):
            values = draw(st.lists(st.floats(0.1, 1.5), max_size=per * nd))
            if values:  # an empty list is no attribute
                kw[attr] = values
    return kind, kw


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(layers(), min_size=1, max_size=3), st.integers(0, 2**31 - 1))
def test_random_layers(specs, seed):
    rng = np.random.default_rng(seed)
    check([layer(k, kind, rng, **kw) for k, (kind, kw) in enumerate(specs)], rtol=1e-4, atol=1e-4)


def test_reference_of_the_decomposed_graph():
    """The rewrite itself, on the reference alone: the -O3 graph (MatMul, Add, kiln::Recurrent
    with packed R) interpreted gives the ONNX ops' results."""
    rng = np.random.default_rng(3)
    m, feeds = model([layer(0, "GRU", rng, seq=4, batch=2, inp=5, hs=6, nd=2, linear_before_reset=1, lens=[4, 2]),
                      layer(1, "LSTM", rng, seq=3, batch=3, inp=4, hs=5, layout=1, peep=True, h0=True)])
    decomposed = kiln.compile(m, target="interpreter", opt_level=3)
    assert [n.op for n in decomposed.graph.nodes].count("Recurrent") == 2
    got = decomposed.run(feeds)
    want = kiln.compile(m, target="interpreter", opt_level=0).run(feeds)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_rows_are_shared_out_only_where_the_panels_spill_the_l1():
    """Batch rows shared out read all of R every step from L2; the panels shared, each thread's
    share, from L1 where it fits: an LSTM of 64 units (64 KiB) on two threads with a 48 KiB L1d
    takes panels, a GRU of 256 (768 KiB) rows, and so does the LSTM on one thread of a 32 KiB
    L1d, or both directions of a bidirectional one on two."""
    from kiln.lower.recurrent import panel_threads, rows_pay
    from kiln.targets.target import Target
    t48 = Target.named("x86-64-v3", l1d_bytes=48 << 10)
    t32 = Target.named("x86-64-v3", l1d_bytes=32 << 10)
    lstm, gru = 4 * 64 * 64 * 4, 3 * 256 * 256 * 4
    assert not rows_pay(lstm, 1, 2, t48) and rows_pay(gru, 1, 2, t48)
    assert rows_pay(lstm, 1, 1, t32) and rows_pay(lstm, 2, 2, t32) and not rows_pay(lstm, 1, 2, t32)
    # the kernel's run-time test: panels from this many threads on (64 KiB over 48 KiB: 2)
    assert panel_threads(lstm, 1, t48) == 2 and panel_threads(gru, 1, t48) == 16


def test_team_size_follows_r_and_the_l1():
    """A step is shared by one thread per SHARE_L1 x L1d bytes of R x rows (at most one per
    panel): with a 32 KiB L1d an LSTM of 64 units at batch 1 runs on one thread, 128 units on
    two, 256 on eight; batch rows count as more work; a bigger L1d asks for bigger shares."""
    from kiln.lower.recurrent import team_per_direction
    from kiln.targets.target import Target
    t32 = Target.named("x86-64-v3", l1d_bytes=32 << 10)
    t64 = Target.named("x86-64-v3", l1d_bytes=64 << 10)
    lstm = lambda h: 4 * h * h * 4   # noqa: E731  R's bytes
    assert [team_per_direction(lstm(h), 1, -(-h // 16), t32) for h in (64, 128, 256)] == [1, 2, 8]
    assert team_per_direction(lstm(64), 8, 4, t32) == 4            # 8 rows: more work, one thread per panel
    assert team_per_direction(lstm(128), 1, 8, t64) == 1 and team_per_direction(lstm(256), 1, 16, t64) == 4
