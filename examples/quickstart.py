"""kiln's main job on the bundled example: build a model, compile it, check it, time it.

    python examples/quickstart.py [--target interpreter|cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_example import build_small_cnn  # noqa: E402

import kiln  # noqa: E402


def median_ms(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="interpreter")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "small_cnn.onnx")
    import onnx
    onnx.save(build_small_cnn(seed=0), path)
    print(f"built   {path}")

    t = time.perf_counter()
    model = kiln.compile(path, target=args.target)
    print(f"compile {model}  ({(time.perf_counter() - t) * 1e3:.0f} ms)")

    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = model.run({"x": x})["probs"]

    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    err = float(np.max(np.abs(got - ref)))
    ok = np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    print(f"check   max |kiln - onnxruntime| = {err:.2e}  -> {'agree' if ok else 'DISAGREE'}")

    # interleave the two engines' timing so machine noise hits both alike
    kiln_ms, ort_ms = [], []
    for _ in range(5):
        kiln_ms.append(median_ms(lambda: model.run({"x": x}), max(1, args.runs // 5)))
        ort_ms.append(median_ms(lambda: sess.run(None, {"x": x}), max(1, args.runs // 5)))
    k, o = statistics.median(kiln_ms), statistics.median(ort_ms)
    print(f"time    kiln[{args.target}] {k:.3f} ms/inference   onnxruntime {o:.3f} ms/inference"
          f"   (ratio {k / o:.2f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
