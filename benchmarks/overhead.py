"""Per-call overhead: what a call of a tiny model costs beyond its arithmetic, kiln vs ONNX Runtime.

    python benchmarks/overhead.py [--inputs 4] [--size 8] [--calls 20000] [--json PATH]
    python benchmarks/overhead.py --ab /work/main [--rounds 3]   # this checkout vs another, A/B

Two models, nothing to compute, so the time is the overhead:
- "add-mul": `--inputs` float32 inputs of shape [1, size] combined by Add/Mul into one output;
- "identity": one float32 [1, size] input copied to its output.
kiln is measured whole (`CompiledModel.run(feeds)`: input validation, the shape-keyed dispatch,
the foreign call, the output dict) and in parts: validation alone (`CompiledModel.ordered`), the
dispatch and call (`Program.run` on validated arrays) and the foreign call alone (the native module
called with validated arrays: output allocation, pointers, the entry). ONNX Runtime:
`InferenceSession.run(None, feeds)`. Medians of batches of calls, in µs per call, all interleaved.

`--ab DIR` runs this benchmark alternately on this checkout's kiln and on the kiln under DIR (its
`--kiln-root`), `--rounds` times each, in separate processes, and prints both medians side by side:
on a loaded machine that relative figure is the honest one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_model(n: int, size: int):
    """out = ((x0 + x1) * x2 + x3) ...: n inputs, one output, no real work."""
    from onnx import TensorProto, helper
    names = [f"x{k}" for k in range(n)]
    nodes, acc = [], names[0]
    for k, name in enumerate(names[1:], 1):
        out = f"t{k}" if k < n - 1 else "out"
        nodes.append(helper.make_node("Add" if k % 2 else "Mul", [acc, name], [out]))
        acc = out
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, size])
                                           for x in names],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, size])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def identity_model(size: int):
    """out = Identity(x0): one input, one output (a copy: kiln does not return its input)."""
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Identity", ["x0"], ["out"])], "identity",
                          [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, size])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, size])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def per_call_us(fn, calls: int, batches: int, clock=time.perf_counter) -> list[float]:
    """µs per call for each of `batches` batches of calls."""
    per = max(1, calls // batches)
    out = []
    for _ in range(batches):
        t = clock()
        for _ in range(per):
            fn()
        out.append((clock() - t) / per * 1e6)
    return out


def measure(model, n_inputs: int, size: int, calls: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Per part, µs per call of each batch (interleaved rounds)."""
    import kiln
    from kiln.bench import ort_session
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal((1, size)).astype(np.float32) for k in range(n_inputs)}
    compiled = kiln.compile(model, tier="full")   # (the -O3 build: kiln.codegen.tiers)
    sess = ort_session(model, 1)
    want = sess.run(None, feeds)[0]
    got = compiled.run(feeds)["out"]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), "kiln disagrees with ORT"
    values = compiled.ordered(feeds)
    program = compiled.program
    runner = program.runner_for(values)   # the native module these shapes run on
    fns = {"kiln run(feeds)": lambda: compiled.run(feeds),
           "  validation (ordered)": lambda: compiled.ordered(feeds),
           "  dispatch + call (Program.run)": lambda: program.run(values),
           "  foreign call (native module)": lambda: runner(values),
           "ort run(None, feeds)": lambda: sess.run(None, feeds)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    rounds = 5
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(100):
                fn()
            times[k] += per_call_us(fn, calls // rounds, 4, clock)
    return times


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def run_all(args) -> dict:
    root = os.path.abspath(args.kiln_root or HERE)
    sys.path.insert(0, root)
    import kiln
    if os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__))) != root:
        raise SystemExit(f"imported kiln from {kiln.__file__}, not from {root}")
    models = {"add-mul": (tiny_model(args.inputs, args.size), args.inputs),
              "identity": (identity_model(args.size), 1)}
    res = {}
    print(f"kiln from {root}; float32 [1, {args.size}] inputs, {args.calls} calls per part, {args.clock} clock, "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    for name, (model, n) in models.items():
        times = measure(model, n, args.size, args.calls, CLOCKS[args.clock])
        res[name] = {k.strip(): float(np.median(v)) for k, v in times.items()}
        print(f"{name} ({n} input{'s' if n > 1 else ''}):")
        for k, v in times.items():
            print(f"  {k:<36} {np.median(v):8.2f} µs/call  (p10 {np.percentile(v, 10):.2f}, "
                  f"p90 {np.percentile(v, 90):.2f})")
        whole = res[name]["kiln run(feeds)"]
        print(f"  {'kiln / ort':<36} {whole / res[name]['ort run(None, feeds)']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us_per_call": res, "inputs": args.inputs, "size": args.size,
                       "load": os.getloadavg()[0]}, f, indent=1)
    return res


def ab(args) -> None:
    """This checkout vs `args.ab`, alternating processes; medians over rounds side by side."""
    runs: dict[str, list[dict]] = {"this": [], "other": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for who, root in (("other", args.ab), ("this", HERE)):
                path = os.path.join(tmp, f"{who}{r}.json")
                env = dict(os.environ, PYTHONPATH=root)
                subprocess.run([sys.executable, os.path.abspath(__file__), "--kiln-root", root, "--json", path,
                                "--inputs", str(args.inputs), "--size", str(args.size),
                                "--calls", str(args.calls), "--clock", args.clock], check=True, env=env, stdout=subprocess.DEVNULL)
                with open(path) as f:
                    runs[who].append(json.load(f)["us_per_call"])
    print(f"A/B, {args.rounds} alternating rounds, µs per call (median of rounds); "
          f"this = {HERE}, other = {args.ab}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    for model in runs["this"][0]:
        print(f"{model}:")
        for part in runs["this"][0][model]:
            this = np.median([r[model][part] for r in runs["this"]])
            other = np.median([r[model][part] for r in runs["other"]])
            print(f"  {part:<34} other {other:8.2f}   this {this:8.2f}   this/other {this / other:5.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=4)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--kiln-root", metavar="DIR", help="import kiln from DIR (default: this checkout)")
    p.add_argument("--ab", metavar="DIR", help="compare this checkout with the kiln under DIR")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="wall: perf_counter; cpu: the calling thread's CPU time (time.thread_time), steadier "
                        "on a loaded machine (a tiny model runs on the calling thread in both engines)")
    args = p.parse_args(argv)
    if args.ab:
        return ab(args)
    return run_all(args)


if __name__ == "__main__":
    main()
