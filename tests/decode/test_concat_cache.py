"""The Concat form of a KV cache (issue 14 item 2): a transformers Llama exported by
torch.onnx.export with past_key_values (the past concatenated onto the new keys/values,
the mask and positions computed from the past length) decoded by kiln.Decoder, against ONNX
Runtime stepping the same model: cache lengths 0, 1 and a few hundred, odd token counts,
the cache written in place, one shape-generic module and no C compiler run per step."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.codegen.build import compiler_runs
from kiln.compiler import frontend
from kiln.decode import NotStaticCache, concat_cache

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("torch")
pytest.importorskip("transformers")

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=97)
CAPACITY = 320


@pytest.fixture(scope="module")
def model():
    from benchmarks.decoder_model import hf_llama_decoder
    return hf_llama_decoder(**SMALL, seed=1)


@pytest.fixture(scope="module")
def decoder(model):
    return kiln.Decoder(model, capacity=CAPACITY)


def _feeds(rng, past: int, n: int, batch: int = 1) -> dict:
    return {"input_ids": rng.integers(0, SMALL["vocab"], (batch, n)),
            "attention_mask": np.ones((batch, past + n), np.int64),
            "position_ids": np.tile(np.arange(past, past + n), (batch, 1))}


def _steps_against_ort(model, decoder, counts, batch=1, seed=0):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    rng = np.random.default_rng(seed)
    cache = decoder.new_cache(batch)
    past = {p.past: np.zeros((batch, p.heads, 0, p.dim), np.float32) for p in decoder.static.pairs}
    for step, n in enumerate(counts):
        feeds = _feeds(rng, int(cache.length[0]), n, batch)
        want = dict(zip(names, s.run(None, {**feeds, **past})))
        got = decoder.step(cache, **feeds)
        where = f"step {step}, cache length {int(cache.length[0]) - n}, {n} tokens"
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4, err_msg=where)
        for p in decoder.static.pairs:
            np.testing.assert_allclose(cache.past(p.past), want[p.present], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{p.present}, {where}")
        past = {p.past: want[p.present] for p in decoder.static.pairs}
        yield step, cache


def test_steps_from_cache_length_0_match_ort(model, decoder):
    """Cache lengths 0 (one token), 1, then odd token counts, a 300-token chunk at length 9 and
    single tokens past 300: logits and every cache tensor against ORT; after the first step no C
    compiler runs, and the decoder holds two modules for every length: the generic one, and
    the one-token one (batch and token count fixed, the cache length generic)."""
    assert decoder.concat
    runs = None
    for step, cache in _steps_against_ort(model, decoder, [1, 1, 3, 1, 1, 2, 300, 1, 1]):
        if step == 0:
            runs = compiler_runs()
    assert compiler_runs() == runs and decoder.modules == 2
    assert int(cache.length[0]) == 311


def test_attention_reads_the_cache_in_place(decoder):
    """The filled rows are not sliced off into a copy: the fused attention reads the cache
    buffers, bounded by run-time lengths (kiln.passes.attention's kv_lens)."""
    for model in (decoder.model, decoder._model_for(1, 1)):
        calls = model.module.info["calls"]    # per step (call_nodes: per C call, variants too)
        assert sum(c.startswith("FusedAttention") for c in calls) == SMALL["layers"]
        assert not [c for c in calls if "cache_rows'" in c and c.startswith("Slice")], calls


def test_prompt_first_and_batch_of_two(model, decoder):
    """A 5-token prompt at cache length 0, then single tokens, two batch entries."""
    for _, cache in _steps_against_ort(model, decoder, [5, 1, 1], batch=2, seed=3):
        pass
    assert cache.length.tolist() == [7, 7]


def test_cache_written_in_place(decoder):
    """A step writes its rows into the cache's own buffers (same arrays, same data) and no
    other row: rows before keep their values, rows after keep a sentinel."""
    cache = decoder.new_cache()
    ptrs = {n: (id(b), b.ctypes.data) for n, b in cache.buffers.items()}
    for b in cache.buffers.values():
        b[...] = 7.0
    rng = np.random.default_rng(5)
    decoder.step(cache, **_feeds(rng, 0, 4))
    before = {n: b.copy() for n, b in cache.buffers.items()}
    decoder.step(cache, **_feeds(rng, 4, 1))
    for n, b in cache.buffers.items():
        assert (id(b), b.ctypes.data) == ptrs[n]
        changed = np.flatnonzero(np.any(b != before[n], axis=(0, 1, 3)))
        assert changed.tolist() == [4], (n, changed)
        assert np.all(b[:, :, 5:] == 7.0)


def test_cache_full_and_unequal_lengths_are_errors(decoder):
    rng = np.random.default_rng(6)
    cache = decoder.new_cache()
    cache.length[:] = CAPACITY - 1
    with pytest.raises(kiln.KilnError, match="KV cache is full"):
        decoder.step(cache, **_feeds(rng, CAPACITY - 1, 2))
    cache = decoder.new_cache(2)
    cache.length[:] = [3, 4]
    with pytest.raises(kiln.KilnError, match="batch entries of one length"):
        decoder.step(cache, **_feeds(rng, 3, 1, batch=2))


def test_rewritten_graph_on_interpreter(model):
    """The rewrite alone (interpreter, the ops' NumPy reference) equals the original on a past
    of 4 random rows followed by junk rows in the buffer."""
    g = frontend(model)
    cc = concat_cache(g, 16)
    ref, new = kiln.compile(g, target="interpreter"), kiln.compile(cc.graph, target="interpreter")
    rng = np.random.default_rng(0)
    past = {p.past: rng.standard_normal((1, p.heads, 4, p.dim)).astype(np.float32) for p in cc.pairs}
    feeds = _feeds(rng, 4, 2)
    want = ref.run({**feeds, **past})
    bufs = {n: np.concatenate([x, np.full((1, x.shape[1], 12, x.shape[3]), 50.0, np.float32)], axis=2)
            for n, x in past.items()}
    got = new.run({**feeds, **bufs, cc.length: np.array([4]), cc.rows: np.zeros(5, np.uint8)})
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    for p in cc.pairs:
        np.testing.assert_allclose(got[p.present][:, :, :6], want[p.present], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_dynamo_export_matches_ort():
    """The same model exported by the dynamo exporter (its own mask and position forms)."""
    from benchmarks.decoder_model import hf_llama_decoder
    m = hf_llama_decoder(**SMALL, seed=2, exporter="dynamo")
    dec = kiln.Decoder(m, capacity=64)
    for _ in _steps_against_ort(m, dec, [1, 1, 5, 1, 40, 1], seed=4):
        pass
    assert dec.modules == 2


def test_past_read_by_another_node_is_refused():
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("new", f, [1, 2, "s", 8]),
           helper.make_tensor_value_info("pk", f, [1, 2, "p", 8])]
    nodes = [helper.make_node("Concat", ["pk", "new"], ["present"], axis=2), helper.make_node("Relu", ["pk"], ["r"])]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("present", "r")]
    m = helper.make_model(helper.make_graph(nodes, "c", ins, outs), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NotStaticCache, match="also read by Relu node"):
        concat_cache(frontend(m), 16)
    nodes = [helper.make_node("Concat", ["pk", "new"], ["present"], axis=2),
             helper.make_node("Concat", ["pk"], ["alias"], axis=2)]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("present", "alias")]
    m = helper.make_model(helper.make_graph(nodes, "c", ins, outs), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NotStaticCache, match="also read by Concat node"):
        concat_cache(frontend(m), 16)


def test_rounded_up_plans_keep_live_buffers_apart(decoder):
    """The decoder's modules plan their arenas per doubling of the symbols (round_plans): at
    every cache length, buffers alive together still lie apart at their actual sizes, inside
    the workspace."""
    for model in (decoder.model, decoder._model_for(1, 1)):
        plan = model.module._layout.__self__
        assert model.module.round_plans
        covers = set()
        for n in range(1, 140, 3):
            dims = tuple(n + 1 if s.startswith("cache_next") else n + 1 if s != "batch" and s != "seq" else 1
                         for s in plan.symbols)
            ws, offsets = plan.layout(dims, True)
            covers.add(id(offsets))
            sizes = plan._sizes(dims)
            for k, (_, first, last) in enumerate(plan.buffers):
                assert offsets[k] + sizes[k] <= ws
                for j in plan._overlaps[k]:
                    if j != k and sizes[j] and sizes[k]:
                        assert offsets[j] + sizes[j] <= offsets[k] or offsets[k] + sizes[k] <= offsets[j]
        assert len(covers) < 10
