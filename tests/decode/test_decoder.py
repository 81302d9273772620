"""Decoding with a static KV cache (issue 14 item 2): kiln.Decoder against ONNX Runtime on
the original past/present model step by step, from cache lengths 0 and 1; the cache
buffers bound in place (same array, only the new rows written); no C compiler run per
step; the rewrite's refusals."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.codegen.build import compiler_runs
from kiln.compiler import frontend
from kiln.decode import NotStaticCache, static_cache
from kiln.errors import KilnError

ort = pytest.importorskip("onnxruntime")

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=97, max_positions=64)


@pytest.fixture(scope="module")
def model():
    from benchmarks.decoder_model import llama_decoder
    return llama_decoder(**SMALL, seed=3)


@pytest.fixture(scope="module")
def decoder(model):
    return kiln.Decoder(model, capacity=24)


def _ort_steps(model, tokens: list[list[int]]):
    """ORT on the original model: per step (logits, {present name: array})."""
    from benchmarks.decoder_model import empty_cache
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    past, pos, out = empty_cache(model), 0, []
    names = [o.name for o in s.get_outputs()]
    for ids in tokens:
        n = len(ids)
        res = dict(zip(names, s.run(None, {"input_ids": np.array([ids], np.int64),
                                           "position_ids": np.arange(pos, pos + n, dtype=np.int64)[None],
                                           **past})))
        pos += n
        past = {k.replace("present", "past_key_values"): v for k, v in res.items() if k != "logits"}
        out.append((res["logits"], past))
    return out


def _kiln_steps(decoder, tokens, cache=None):
    cache = cache or decoder.new_cache()
    out = []
    for ids in tokens:
        pos = int(cache.length[0])
        res = decoder.step(cache, input_ids=np.array([ids], np.int64),
                           position_ids=np.arange(pos, pos + len(ids), dtype=np.int64)[None])
        out.append((res["logits"], {n: cache.past(n).copy() for n in cache.buffers}))
    return out, cache


@pytest.mark.parametrize("prompt", [5, 1], ids=["prompt5", "prompt1"])
def test_steps_match_ort(model, decoder, prompt):
    """From an empty cache (length 0): a prompt, then one token per step (cache lengths
    1.. for prompt 1), logits and every cache tensor against ORT's presents at each step."""
    rng = np.random.default_rng(prompt)
    tokens = [rng.integers(0, SMALL["vocab"], prompt).tolist()] + [[int(t)] for t in rng.integers(0, 97, 6)]
    want = _ort_steps(model, tokens)
    got, cache = _kiln_steps(decoder, tokens)
    assert int(cache.length[0]) == prompt + 6
    for step, ((gl, gc), (wl, wc)) in enumerate(zip(got, want)):
        np.testing.assert_allclose(gl, wl, rtol=1e-4, atol=1e-4, err_msg=f"logits, step {step}")
        assert gc.keys() == wc.keys()
        for name in gc:
            np.testing.assert_allclose(gc[name], wc[name], rtol=1e-4, atol=1e-5, err_msg=f"{name}, step {step}")


def test_cache_bound_in_place(decoder):
    """A step writes the new rows into the very buffers the cache holds (same array, same
    data pointer) and nothing else: rows past them keep a sentinel, rows before them keep
    their values."""
    cache = decoder.new_cache()
    ptrs = {n: b.ctypes.data for n, b in cache.buffers.items()}
    objs = {n: id(b) for n, b in cache.buffers.items()}
    for b in cache.buffers.values():
        b[...] = 7.0
    decoder.step(cache, input_ids=np.array([[1, 2, 3, 4, 5]]), position_ids=np.arange(5)[None])
    before = {n: b.copy() for n, b in cache.buffers.items()}
    decoder.step(cache, input_ids=np.array([[4]]), position_ids=np.array([[5]]))
    for n, b in cache.buffers.items():
        assert id(b) == objs[n] and b.ctypes.data == ptrs[n]
        changed = np.flatnonzero(np.any(b != before[n], axis=(0, 1, 3)))
        assert changed.tolist() == [5], (n, changed)      # row 5 only: the new token
        assert np.all(b[:, :, 6:] == 7.0)


def test_no_compile_per_step(decoder):
    """Past lengths 0 .. 15 run on one module per token count: after the first decode step
    no C compiler runs and no module is built."""
    cache = decoder.new_cache()
    decoder.step(cache, input_ids=np.arange(5)[None], position_ids=np.arange(5)[None])
    decoder.step(cache, input_ids=np.array([[7]]), position_ids=np.array([[5]]))
    runs, modules = compiler_runs(), decoder.modules
    for t in range(6, 16):
        decoder.step(cache, input_ids=np.array([[t]]), position_ids=np.array([[t]]))
    assert compiler_runs() == runs and decoder.modules == modules
    assert int(cache.length[0]) == 16


def test_cache_full_is_an_error(decoder):
    cache = decoder.new_cache()
    for k in range(4):
        decoder.step(cache, input_ids=np.zeros((1, 5), np.int64), position_ids=np.arange(5 * k, 5 * k + 5)[None])
    with pytest.raises(KilnError, match="KV cache is full"):
        decoder.step(cache, input_ids=np.zeros((1, 5), np.int64), position_ids=np.arange(20, 25)[None])
    assert int(cache.length[0]) == 20


def test_step_names_its_inputs(decoder):
    with pytest.raises(KilnError, match="missing \\['position_ids'\\]"):
        decoder.step(decoder.new_cache(), input_ids=np.array([[1]]))


def _attention_model(mask: bool = False, shape_reader: bool = False):
    f = TensorProto.FLOAT
    q = helper.make_tensor_value_info("q", f, [1, 2, "s", 8])
    k = helper.make_tensor_value_info("k", f, [1, 2, "s", 8])
    pk = helper.make_tensor_value_info("pk", f, [1, 2, "p", 8])
    pv = helper.make_tensor_value_info("pv", f, [1, 2, "p", 8])
    ins = [q, k, pk, pv]
    args = ["q", "k", "k", "m" if mask else "", "pk", "pv"]
    nodes = [helper.make_node("Attention", args, ["y", "ok", "ov"], is_causal=1)]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "ok", "ov")]
    if mask:
        ins.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [1, 1, "s", "t"]))
    if shape_reader:
        nodes.append(helper.make_node("Shape", ["pk"], ["n"]))
        outs.append(helper.make_tensor_value_info("n", TensorProto.INT64, None))
    return helper.make_model(helper.make_graph(nodes, "a", ins, outs), opset_imports=[helper.make_opsetid("", 23)])


def test_static_cache_refusals():
    g = frontend(_attention_model(mask=True))
    with pytest.raises(NotStaticCache, match="attn_mask is sized by the past length"):
        static_cache(g, 16)
    g = frontend(_attention_model(shape_reader=True))
    with pytest.raises(NotStaticCache, match="also read by Shape node"):
        static_cache(g, 16)
    g = frontend(_attention_model())
    sc = static_cache(g, 16)
    assert [(p.past, p.present) for p in sc.pairs] == [("pk", "ok"), ("pv", "ov")]
    assert [n.op for n in sc.graph.nodes].count("TensorScatter") == 2


def test_concat_form_is_refused_saying_so():
    """torch.onnx.export's form: Concat(past, new) along the sequence as the present, the
    attention reading it with a mask built from the past length: not static_cache's, which
    names the rewrite that takes it (tests/decode/test_concat_cache.py)."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("new", f, [1, 2, "s", 8]), helper.make_tensor_value_info("pk", f, [1, 2, "p", 8])]
    nodes = [helper.make_node("Concat", ["pk", "new"], ["present"], axis=-2),
             helper.make_node("Attention", ["new", "present", "present"], ["y"])]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "present")]
    m = helper.make_model(helper.make_graph(nodes, "c", ins, outs), opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(NotStaticCache, match="concatenated outside the attention \\(Concat node .*concat_cache"):
        static_cache(frontend(m), 16)


def test_static_cache_graph_on_interpreter(model):
    """The rewritten graph itself (interpreter, the ops' NumPy reference) equals the
    original: the rewrite is a semantics-preserving graph change, not a runtime trick."""
    g = frontend(model)
    sc = static_cache(g, 16)
    ref = kiln.compile(g, target="interpreter")
    new = kiln.compile(sc.graph, target="interpreter")
    rng = np.random.default_rng(0)
    past = {p.past: rng.standard_normal((1, p.heads, 4, p.dim)).astype(np.float32) for p in sc.pairs}
    feeds = {"input_ids": np.array([[3, 9]]), "position_ids": np.array([[4, 5]])}
    want = ref.run({**feeds, **past})
    bufs = {n: np.concatenate([x, np.full((1, x.shape[1], 12, x.shape[3]), 50.0, np.float32)], axis=2)
            for n, x in past.items()}
    got = new.run({**feeds, **bufs, sc.length: np.array([4])})
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    for p in sc.pairs:
        np.testing.assert_allclose(got[p.present][:, :, :6], want[p.present], rtol=1e-6, atol=1e-6)


def test_long_caches_match_ort():
    """Cache lengths at key-block edges and next to a 2048-row capacity: one step on random
    past rows against ORT given the same rows as its past."""
    from benchmarks.decoder_model import llama_decoder
    m = llama_decoder(**dict(SMALL, max_positions=2048), seed=5)
    dec = kiln.Decoder(m, capacity=2048)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    rng = np.random.default_rng(1)
    cache = dec.new_cache()
    for b in cache.buffers.values():
        b[...] = rng.standard_normal(b.shape).astype(np.float32)
    for n in (63, 64, 65, 2047):
        cache.length[:] = n
        past = {k: v[:, :, :n].copy() for k, v in cache.buffers.items()}
        feeds = {"input_ids": np.array([[n % 97]]), "position_ids": np.array([[n]])}
        want = dict(zip(names, s.run(None, {**feeds, **past})))
        got = dec.step(cache, **feeds)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4, err_msg=f"length {n}")
        for k in cache.buffers:
            np.testing.assert_allclose(cache.past(k), want[k.replace("past_key_values", "present")], rtol=1e-4,
                                       atol=1e-5, err_msg=f"{k}, length {n}")
    assert dec.modules == 1


def test_batch_of_two_matches_ort(model, decoder):
    from benchmarks.decoder_model import empty_cache
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    rng = np.random.default_rng(2)
    cache, past, pos = decoder.new_cache(batch=2), empty_cache(model, batch=2), 0
    for n in (5, 1, 1, 1):
        ids = rng.integers(0, SMALL["vocab"], (2, n))
        feeds = {"input_ids": ids, "position_ids": np.tile(np.arange(pos, pos + n), (2, 1))}
        want = dict(zip(names, s.run(None, {**feeds, **past})))
        got = decoder.step(cache, **feeds)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)
        past = {k.replace("present", "past_key_values"): v for k, v in want.items() if k != "logits"}
        for k in cache.buffers:
            np.testing.assert_allclose(cache.past(k), past[k], rtol=1e-4, atol=1e-5)
        pos += n
    assert cache.length.tolist() == [8, 8]


def test_decode_benchmark_runs_and_agrees(tmp_path, monkeypatch, capsys):
    """benchmarks/decode.py end to end at tiny sizes: every engine generates ORT's tokens, and
    kiln compiles nothing while generating (its figures are for the README, never asserted)."""
    import json
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from benchmarks import decode
    path = tmp_path / "decode.json"
    rc = decode.main(["--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "96",
                      "--vocab", "97", "--prompt", "5", "--new", "6", "--capacity", "24", "--repeats", "1",
                      "--clock", "cpu", "--json", str(path)])
    out = json.loads(path.read_text())
    assert rc == 0 and all(e["same_tokens_as_ort"] for e in out["engines"].values())
    assert out["kiln_compiler_runs_generating"] == 0 and out["kiln_modules"] == 2
    assert "kiln / ort tokens/s" in capsys.readouterr().out


def test_prefill_in_power_of_two_chunks(model, decoder):
    """prefill(13 tokens) runs 8 + 4 + 1 and equals ORT on the whole prompt (logits of every
    prompt token, the cache); after prompts of 13 and 6, a prompt of 14 (8 + 4 + 2) and one of
    7 (4 + 2 + 1) build nothing."""
    from kiln.decode.decoder import _chunks
    assert _chunks(13) == [8, 4, 1] and _chunks(16) == [16] and _chunks(1) == [1]
    rng = np.random.default_rng(7)
    for n in (13, 6):
        tokens = [rng.integers(0, SMALL["vocab"], n).tolist()]
        (want_logits, want_cache), = _ort_steps(model, tokens)
        cache = decoder.new_cache()
        got = decoder.prefill(cache, input_ids=np.array(tokens), position_ids=np.arange(n)[None])
        np.testing.assert_allclose(got["logits"], want_logits, rtol=1e-4, atol=1e-4)
        for k in cache.buffers:
            np.testing.assert_allclose(cache.past(k), want_cache[k], rtol=1e-4, atol=1e-5)
    runs, modules = compiler_runs(), decoder.modules
    for n in (14, 7):
        decoder.prefill(decoder.new_cache(), input_ids=np.zeros((1, n), np.int64), position_ids=np.arange(n)[None])
    assert compiler_runs() == runs and decoder.modules == modules


def test_three_d_attention_matches_ort():
    """Attention on (B, S, H*D) inputs (q_num_heads / kv_num_heads): the rewrite splits heads
    for the cache and merges the output back; steps from an empty cache against ORT."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, [1, "s", 32]), helper.make_tensor_value_info("k", f, [1, "s", 16]),
           helper.make_tensor_value_info("v", f, [1, "s", 16]),
           helper.make_tensor_value_info("pk", f, [1, 2, "p", 8]), helper.make_tensor_value_info("pv", f, [1, 2, "p", 8])]
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "ok", "ov"], is_causal=1,
                            q_num_heads=4, kv_num_heads=2)
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "ok", "ov")]
    m = helper.make_model(helper.make_graph([node], "a3", ins, outs), opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    dec = kiln.Decoder(m, capacity=16)
    cache = dec.new_cache()
    rng = np.random.default_rng(4)
    past = {"pk": np.zeros((1, 2, 0, 8), np.float32), "pv": np.zeros((1, 2, 0, 8), np.float32)}
    for n in (3, 1, 1):
        feeds = {x: rng.standard_normal((1, n, w)).astype(np.float32) for x, w in (("q", 32), ("k", 16), ("v", 16))}
        y, ok, ov = s.run(None, {**feeds, **past})
        got = dec.step(cache, feeds)
        np.testing.assert_allclose(got["y"], y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(cache.past("pk"), ok, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(cache.past("pv"), ov, rtol=1e-6, atol=1e-6)
        past = {"pk": ok, "pv": ov}


def test_decoder_options_it_cannot_take(model):
    for bad in ({"shapes": "generic"}, {"target": "interpreter"}):
        with pytest.raises(KilnError, match="native module per new-token count"):
            kiln.Decoder(model, capacity=16, **bad)
