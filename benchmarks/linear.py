"""Linear layers y = relu(x @ W + b) with a constant W (kiln::MatMulPacked), kiln vs ONNX Runtime.

    python benchmarks/linear.py [--threads 1] [--runs 200] [--also gemm.mr=4] 32x256x768 32x768x768x8 ...

Shapes are MxKxN, or MxKxNxB for a batch of B (the weight shared by the batch, as in a
transformer's projections at batch > 1). Both engines run the same model on the same input,
interleaved in 10 rounds; medians in microseconds and kiln's GMAC/s. With one thread (the
default) the clock is the calling thread's CPU time (time.thread_time): both engines then run
on the calling thread, and time-slicing by other processes does not inflate it, so the figures
hold on a loaded machine (less so for L3-bound shapes: other processes still share the cache).
`--threads 2` times wall clock (perf_counter): on a loaded machine that measures the load.
`--also NAME=VALUE` (repeatable; true/false for a yes-no decision) times kiln once more per shape with that schedule decision
overridden (kiln.lower.decisions), interleaved with the others: an A/B of one heuristic in
one process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def linear_model(shape, k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "B")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "B"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    g = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", nargs="+", help="MxKxN or MxKxNxB")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--also", action="append", default=[], metavar="NAME=VALUE",
                   help="also time kiln with this decision overridden")
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # before kiln's first library loads libgomp
    import kiln
    from kiln.bench import ort_session
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"{args.threads} thread(s), {'thread CPU time' if args.threads == 1 else 'wall clock'}, "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    for spec in args.shapes:
        d = [int(v) for v in spec.split("x")]
        m, k, n = d[:3]
        shape = [*d[3:4], m, k]
        model = linear_model(shape, k, n)
        compiled, sess = kiln.compile(model), ort_session(model, args.threads)
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        got, want = compiled.run(x=x)["y"], sess.run(None, {"x": x})[0]
        ok = np.allclose(got, want, rtol=1e-3, atol=1e-3)
        fns = {"kiln": lambda: compiled.run(x=x)}
        for d in args.also:
            name, value = d.split("=")
            parsed = {"true": True, "false": False}.get(value.lower(), None)
            other = kiln.compile(model, decisions={name: int(value) if parsed is None else parsed})
            fns[f"kiln[{d}]"] = lambda other=other: other.run(x=x)
        fns["ort"] = lambda: sess.run(None, {"x": x})
        times = {name: [] for name in fns}
        for _ in range(10):
            for name, fn in fns.items():
                fn()
                for _ in range(max(1, args.runs // 10)):
                    t = clock()
                    fn()
                    times[name].append((clock() - t) * 1e6)
        tk, to = np.median(times["kiln"]), np.median(times["ort"])
        macs = int(np.prod(shape)) * n
        also = "".join(f"  {name} {np.median(times[name]):9.1f} us ({macs / np.median(times[name]) / 1e3:5.1f})"
                       for name in times if name.startswith("kiln["))
        print(f"  {spec:<16} kiln {tk:9.1f} us ({macs / tk / 1e3:5.1f} GMAC/s){also}  ort {to:9.1f} us  "
              f"kiln/ort {tk / to:5.2f}{'' if ok else '  MISMATCH'}")


if __name__ == "__main__":
    main()
