"""Per-call overhead: what a call of a tiny model costs beyond its arithmetic, kiln vs ONNX Runtime.

    python benchmarks/overhead.py [--inputs 4] [--size 16] [--calls 20000] [--json PATH]

The model adds and multiplies `--inputs` float32 vectors of `--size` elements (nothing to compute,
so the time is the overhead). kiln is measured whole (`CompiledModel.run(feeds)`: input
validation, the shape-keyed dispatch, the foreign call, the output dict) and in parts:
validation alone (`CompiledModel.ordered`), and the foreign call alone (the native module called
with already validated arrays). ONNX Runtime: `InferenceSession.run(None, feeds)`. Medians of
batches of calls, in µs per call, all engines interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from kiln.bench import ort_session  # noqa: E402


def tiny_model(n: int, size: int) -> onnx.ModelProto:
    """out = ((x0 + x1) * x2 + x3) ...: n inputs, one output, no real work."""
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


def per_call_us(fn, calls: int, batches: int = 20) -> list[float]:
    """µs per call for each of `batches` batches of calls."""
    per = max(1, calls // batches)
    out = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(per):
            fn()
        out.append((time.perf_counter() - t) / per * 1e6)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=4)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    model = tiny_model(args.inputs, args.size)
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal((1, args.size)).astype(np.float32) for k in range(args.inputs)}
    compiled = kiln.compile(model)
    sess = ort_session(model, 1)
    want = sess.run(None, feeds)[0]
    got = compiled.run(feeds)["out"]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), "kiln disagrees with ORT"
    values = compiled.ordered(feeds)
    runner = compiled.program.runner_for(values)   # the native module these shapes run on
    fns = {"kiln run(feeds)": lambda: compiled.run(feeds),
           "kiln validation (ordered)": lambda: compiled.ordered(feeds),
           "kiln foreign call (native module)": lambda: runner(values),
           "ort run(None, feeds)": lambda: sess.run(None, feeds)}
    times = {k: [] for k in fns}
    for _ in range(5):   # interleaved rounds
        for k, fn in fns.items():
            for _ in range(100):
                fn()
            times[k] += per_call_us(fn, args.calls // 5, 4)
    res = {k: float(np.median(v)) for k, v in times.items()}
    print(f"{args.inputs} inputs of {args.size} float32, {args.calls} calls each, load {os.getloadavg()[0]:.1f}")
    for k, us in res.items():
        print(f"  {k:<36} {us:8.2f} µs/call  (p10 {np.percentile(times[k], 10):.2f}, "
              f"p90 {np.percentile(times[k], 90):.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us_per_call": res, "inputs": args.inputs, "size": args.size}, f, indent=1)
    return res


if __name__ == "__main__":
    main()
