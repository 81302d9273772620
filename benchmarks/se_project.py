"""The kernels of a squeeze-excite inverted residual (expand, depthwise, the gate, the project conv
reading the gated tensor) at MobileNetV3 / EfficientNet-B0 shapes, one thread, thread CPU time:
median over --rounds of `CompiledModel.profile` per kernel, after checking the model against the
reference. Run it under two checkouts (PYTHONPATH) to compare them.

    python benchmarks/se_project.py [--rounds 15] [--only v3l_14,v3s_10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import numpy as np  # noqa: E402

# tests.passes.test_layout.se_block arguments: (input channels c, plane h, expanded m, squeezed r,
# output o, depthwise kernel k)
CASES = {
    "v3l_14": dict(c=160, h=7, m=960, r=240, o=160, k=5),         # MobileNetV3-Large's last blocks
    "v3l_12": dict(c=112, h=14, m=672, r=168, o=112, k=3),
    "v3s_10": dict(c=96, h=7, m=576, r=144, o=96, k=5),            # MobileNetV3-Small's last blocks
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"          # read when kiln's first module loads
    import kiln  # noqa: PLC0415
    from kiln.interpreter import Interpreter  # noqa: PLC0415
    from tests.passes.test_layout import se_block  # noqa: PLC0415
    time.perf_counter = time.thread_time        # the profile reads this clock: the kernels' own CPU time
    for name, kw in CASES.items():
        if args.only and name not in args.only.split(","):
            continue
        g = se_block(**kw)
        m = kiln.compile(g, target="cpu")
        x = np.random.default_rng(0).standard_normal((1, kw["c"], kw["h"], kw["h"])).astype(np.float32)
        want = Interpreter(g).run([x])[0]
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
        rounds = [dict(m.profile({"x": x}, runs=5)) for _ in range(args.rounds)]
        print(name, ", ".join(f"{what.split(' node')[0]} {what.split(chr(39))[1]} "
                              f"{statistics.median(r[what] for r in rounds) * 1e3:.3f} ms"
                              for what in rounds[0] if "Conv" in what), flush=True)


if __name__ == "__main__":
    main()
