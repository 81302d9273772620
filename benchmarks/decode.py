"""Greedy decoding with a KV cache: tokens/s of a Llama-style decoder, kiln against ONNX Runtime.

    python benchmarks/decode.py [--layers 4] [--hidden 512] [--heads 8] [--kv-heads 2]
                                [--intermediate 1376] [--vocab 4096] [--prompt 16] [--new 128]
                                [--capacity 2048] [--threads 2] [--clock wall|cpu] [--repeats 5]
                                [--json PATH]

The model (benchmarks/decoder_model.py) takes past key/values and returns presents (the ONNX
Attention op with past_key/past_value, rotary, RMSNorm, grouped-query attention, SiLU-gated
MLP). Each engine runs the same generation: the prompt in one step, then `--new` tokens one
at a time, each the argmax of the last logits.

- kiln: `kiln.Decoder` (kiln.decode): the model rewritten to a static cache of `--capacity`
  rows, the cache buffers bound as past inputs and present outputs (a step writes the new
  rows only), one native module per token count (the prompt's, then 1).
- ort: ONNX Runtime on the original model with IO binding, the way ORT users decode: each
  step's present OrtValues bound as the next step's past inputs (no copies through numpy;
  ORT's Attention still concatenates past and new into a fresh present every step).
- ort_gqa: ONNX Runtime on the same decoder (same weights) written with its contrib
  GroupQueryAttention, the way onnxruntime-genai runs Llama: one buffer per cache tensor
  bound as past and present, ORT appending in place (skipped if this ORT lacks it).
- ort_static: ONNX Runtime on kiln's static-cache graph (TensorScatter + Attention with
  nonpad_kv_seqlen, plain ONNX opset 24) with the cache buffers bound as input and output
  as well (skipped if this ORT cannot run it).

Reported: decode tokens/s (the `--new` steps after the prompt) and prompt ms per engine,
medians over `--repeats` generations run interleaved; the modules kiln built and the C
compiler runs during the generations (0 after the first); whether every engine generated
the same tokens, and the largest logits difference against ORT over every step.
`--clock cpu` times the calling thread's CPU time with one thread for every engine: on a
loaded machine the figure that still says something; wall figures taken under load are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def greedy(step, prompt: np.ndarray, new: int, clock):
    """The prompt in one step, then `new` tokens, each the argmax of the last logits;
    `step(ids [1, n], first position)` returns the last token's logits. Returns (tokens,
    logits per step, prompt seconds, decode seconds)."""
    t0 = clock()
    logits = [step(prompt[None], 0)]
    t1 = clock()
    toks = []
    for k in range(new):
        toks.append(int(np.argmax(logits[-1])))
        logits.append(step(np.array([[toks[-1]]], np.int64), len(prompt) + k))
    return toks, logits, t1 - t0, clock() - t1


def _positions(ids: np.ndarray, start: int) -> np.ndarray:
    return np.arange(start, start + ids.shape[1], dtype=np.int64)[None]


def _mask(names, ids: np.ndarray, start: int) -> dict:
    """An all-ones attention_mask over the past and new tokens, for a model that takes one."""
    return {"attention_mask": np.ones((1, start + ids.shape[1]), np.int64)} if "attention_mask" in names else {}


def kiln_generate(dec, prompt: np.ndarray, new: int, clock):
    cache = dec.new_cache()

    def step(ids, start):
        return dec.step(cache, input_ids=ids, position_ids=_positions(ids, start),
                        **_mask(dec.feeds, ids, start))["logits"][0, -1]
    return greedy(step, prompt, new, clock)


def ort_generate(sess, model, prompt: np.ndarray, new: int, clock):
    """ORT with IO binding: presents stay OrtValues and are bound as the next step's pasts."""
    import onnxruntime as ort
    from benchmarks.decoder_model import empty_cache
    outs = [o.name for o in sess.get_outputs()]
    pasts = {o: o.replace("present", "past_key_values") for o in outs if o != "logits"}
    io = sess.io_binding()
    cache = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in empty_cache(model).items()}
    names = [i.name for i in sess.get_inputs()]

    def step(ids, start):
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", _positions(ids, start))
        for k, v in _mask(names, ids, start).items():
            io.bind_cpu_input(k, v)
        for name, value in cache.items():
            io.bind_ortvalue_input(name, value)
        for o in outs:
            io.bind_output(o, "cpu")
        sess.run_with_iobinding(io)
        res = io.get_outputs()
        cache.update((pasts[o], v) for o, v in zip(outs, res) if o != "logits")
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        return res[outs.index("logits")].numpy()[0, -1]
    return greedy(step, prompt, new, clock)


def ort_static_generate(sess, static, prompt: np.ndarray, new: int, clock):
    """ORT on the static-cache graph, each cache buffer bound as both input and output."""
    bufs = {p.past: np.zeros((1, p.heads, static.capacity, p.dim), np.float32) for p in static.pairs}
    length = np.zeros(1, np.int64)
    io = sess.io_binding()
    for p in static.pairs:
        b = bufs[p.past]
        io.bind_input(p.past, "cpu", 0, np.float32, list(b.shape), b.ctypes.data)
        io.bind_output(p.present, "cpu", 0, np.float32, list(b.shape), b.ctypes.data)
    io.bind_input(static.length, "cpu", 0, np.int64, [1], length.ctypes.data)
    vocab = next(o for o in sess.get_outputs() if o.name == "logits").shape[-1]

    def step(ids, start):
        out = np.empty((1, ids.shape[1], vocab), np.float32)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", _positions(ids, start))
        io.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        sess.run_with_iobinding(io)
        length[0] += ids.shape[1]
        return out[0, -1]
    return greedy(step, prompt, new, clock)


def ort_gqa_generate(sess, capacity: int, prompt: np.ndarray, new: int, clock):
    """ORT's GroupQueryAttention form (onnxruntime-genai's): one buffer per cache tensor bound as
    past and present (ORT then appends in place), seqlens_k and total_sequence_length per step."""
    outs = [o.name for o in sess.get_outputs()]
    caches = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    bufs = {i.name: np.zeros((1, i.shape[1], capacity, i.shape[3]), np.float32) for i in caches}
    io = sess.io_binding()
    for name, b in bufs.items():
        io.bind_input(name, "cpu", 0, np.float32, list(b.shape), b.ctypes.data)
        io.bind_output(name.replace("past_key_values", "present"), "cpu", 0, np.float32, list(b.shape),
                       b.ctypes.data)
    vocab = sess.get_outputs()[outs.index("logits")].shape[-1]

    def step(ids, start):
        total = start + ids.shape[1]
        out = np.empty((1, ids.shape[1], vocab), np.float32)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", _positions(ids, start))
        io.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        io.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        sess.run_with_iobinding(io)
        return out[0, -1]
    return greedy(step, prompt, new, clock)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1376)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--form", choices=["onnx", "hf"], default="onnx",
                    help="onnx: the decoder written with ONNX Attention (past/present in the op); hf: transformers' "
                         "LlamaForCausalLM exported by torch.onnx.export (the cache Concat'ed in the graph)")
    a = ap.parse_args(argv)
    threads = 1 if a.clock == "cpu" else a.threads
    os.environ["OMP_NUM_THREADS"] = str(threads)   # before kiln's native code loads
    import kiln
    from kiln.bench import ort_session
    from kiln.codegen.build import compiler_runs
    from benchmarks.decoder_model import hf_llama_decoder, llama_decoder
    if a.form == "hf":
        model = hf_llama_decoder(a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab,
                                 max_positions=max(a.capacity, a.prompt + a.new))
    else:
        model = llama_decoder(a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab,
                              max_positions=max(a.capacity, a.prompt + a.new))
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    t = time.perf_counter()
    runs0 = compiler_runs()
    dec = kiln.Decoder(model, capacity=a.capacity)
    prompt = np.random.default_rng(0).integers(0, a.vocab, a.prompt).astype(np.int64)
    kiln_generate(dec, prompt, 1, clock)   # builds the prompt's and the one-token module
    compile_s, runs1 = time.perf_counter() - t, compiler_runs()
    engines = {"kiln": lambda: kiln_generate(dec, prompt, a.new, clock)}
    sess = ort_session(model, threads)
    engines["ort"] = lambda: ort_generate(sess, model, prompt, a.new, clock)
    try:
        if a.form == "hf":
            raise NotImplementedError("the static-cache graph is the ONNX Attention form's")
        ssess = ort_session(_proto(dec.static.graph, model), threads)
        ort_static_generate(ssess, dec.static, prompt, 1, clock)
        engines["ort_static"] = lambda: ort_static_generate(ssess, dec.static, prompt, a.new, clock)
    except Exception as e:  # noqa: BLE001 - an ORT without TensorScatter: reported, not fatal
        print(f"ort_static skipped: {type(e).__name__}: {str(e)[:200]}")
    try:
        if a.form == "hf":
            raise NotImplementedError("the GroupQueryAttention decoder has the ONNX form's weights")
        gsess = ort_session(llama_decoder(a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab,
                                          max_positions=max(a.capacity, a.prompt + a.new), attention="gqa"), threads)
        ort_gqa_generate(gsess, a.capacity, prompt, 1, clock)
        engines["ort_gqa"] = lambda: ort_gqa_generate(gsess, a.capacity, prompt, a.new, clock)
    except Exception as e:  # noqa: BLE001 - an ORT without the contrib op: reported, not fatal
        print(f"ort_gqa skipped: {type(e).__name__}: {str(e)[:200]}")
    load = os.getloadavg()[0]
    rows = {k: [] for k in engines}
    results = {}
    for _ in range(a.repeats):
        for k, fn in engines.items():
            toks, logits, pre, dur = fn()
            rows[k].append((pre, dur))
            results[k] = (toks, logits)
    modules = dec.modules
    runs2 = compiler_runs()
    ref_toks, ref_logits = results["ort"]
    diff = {k: max(float(np.max(np.abs(x - y))) for x, y in zip(lg, ref_logits)) for k, (_, lg) in results.items()}
    same = {k: toks == ref_toks for k, (toks, _) in results.items()}
    out = {"config": vars(a), "threads": threads, "clock": a.clock, "load_before": load,
           "load_after": os.getloadavg()[0], "kiln_compile_s": compile_s, "kiln_compiler_runs_compile": runs1 - runs0,
           "kiln_compiler_runs_generating": runs2 - runs1, "kiln_modules": modules, "engines": {}}
    print(f"{a.layers} layers, hidden {a.hidden}, {a.heads} heads / {a.kv_heads} KV, vocab {a.vocab}; prompt {a.prompt}, "
          f"{a.new} new tokens, capacity {a.capacity}; {threads} thread(s), {a.clock} clock, load {load:.1f}")
    print(f"kiln: {modules} modules built, compile + first steps {compile_s:.2f} s, C compiler runs "
          f"{runs1 - runs0} then {runs2 - runs1} while generating")
    for k, r in rows.items():
        pre = float(np.median([x[0] for x in r])) * 1e3
        tps = float(np.median([a.new / x[1] for x in r]))
        out["engines"][k] = {"prompt_ms": pre, "tokens_per_s": tps, "same_tokens_as_ort": same[k],
                             "max_abs_logits_vs_ort": diff[k]}
        print(f"  {k:<11} {tps:9.1f} tokens/s   prompt {pre:7.2f} ms   same tokens as ort: {same[k]}   "
              f"max |logits - ort| {diff[k]:.2e}")
    best = max((k for k in out["engines"] if k != "kiln"), key=lambda k: out["engines"][k]["tokens_per_s"])
    base = out["engines"][best]["tokens_per_s"]
    out["kiln_over_best_peer"] = out["engines"]["kiln"]["tokens_per_s"] / base
    print(f"  kiln / ort tokens/s: {out['engines']['kiln']['tokens_per_s'] / out['engines']['ort']['tokens_per_s']:.2f}"
          f"   kiln / best ORT ({best}): {out['kiln_over_best_peer']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(same.values()) else 1


def _proto(graph, like):
    """kiln's static-cache graph (flat, plain attributes) written back as an ONNX model for ORT."""
    from onnx import helper, numpy_helper
    inits, seen, nodes = [], set(), []
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and v.const is not None and v.name not in seen:
                seen.add(v.name)
                inits.append(numpy_helper.from_array(np.asarray(v.const), v.name))
        nodes.append(helper.make_node(n.op, ["" if v is None else v.name for v in n.inputs],
                                      [v.name for v in n.outputs], name=n.name, domain=n.domain or None,
                                      **n.attrs))

    def info(v):
        return helper.make_tensor_value_info(v.name, v.type.dtype.onnx, list(v.type.shape))
    g = helper.make_graph(nodes, graph.name, [info(v) for v in graph.inputs], [info(v) for v in graph.outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()])
    m.ir_version = like.ir_version
    return m


if __name__ == "__main__":
    raise SystemExit(main())
