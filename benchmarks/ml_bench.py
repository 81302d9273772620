"""Tree-ensemble classifiers (scikit-learn -> skl2onnx): kiln cpu vs ONNX Runtime on 1 row
and on 10,000 rows, interleaved in one process, medians; outputs checked equal first.

    python benchmarks/ml_bench.py [--threads 2] [--rounds 15] [--trees 100]

Both engines get --threads threads (kiln through OMP_NUM_THREADS, set here before kiln
loads). Times include each engine's per-call overhead; --overhead also times kiln's run()
on an identity-like model to show how much of the 1-row latency is the call itself.
"build s" is kiln's compile plus the first run at that batch size (a specialisation).
Needs the test extra (scikit-learn, skl2onnx, onnxruntime).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def models(trees: int, features: int, seed: int = 0):
    """(name, fitted estimator, training rows) for the random forest and gradient boosting."""
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    x, y = make_classification(n_samples=5000, n_features=features, n_informative=features // 2, n_classes=3,
                               random_state=seed)
    x = x.astype(np.float32)
    return [("RandomForest", RandomForestClassifier(n_estimators=trees, max_depth=12, random_state=seed).fit(x, y), x),
            ("GradientBoosting", GradientBoostingClassifier(n_estimators=trees, max_depth=3,
                                                            random_state=seed).fit(x, y), x)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 10000])
    ap.add_argument("--overhead", action="store_true", help="also time kiln's per-call overhead")
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import numpy as np
    from skl2onnx import to_onnx

    import kiln
    from kiln.bench import ort_session, stats, time_interleaved

    rng = np.random.default_rng(1)
    print(f"threads={args.threads} rounds={args.rounds} trees={args.trees} features={args.features}")
    print(f"{'model':18} {'rows':>6} {'kiln ms':>10} {'ORT ms':>10} {'ORT/kiln':>9}  nodes  build s")
    for name, est, x in models(args.trees, args.features):
        onx = to_onnx(est, x[:1], options={id(est): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
        data = onx.SerializeToString()
        nodes = sum(len(a.ints) for n in onx.graph.node for a in n.attribute if a.name == "nodes_nodeids")
        sess = ort_session(onx, args.threads)
        t0 = time.perf_counter()
        model = kiln.compile(data)
        compile_s = time.perf_counter() - t0
        for rows in args.rows:
            feed = {"X": rng.standard_normal((rows, x.shape[1])).astype(np.float32)}
            t1 = time.perf_counter()
            got = model.run(feed)                      # the specialisation for this batch size
            built = time.perf_counter() - t1 + compile_s
            compile_s = 0.0
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
            assert (got["label"] == want["label"]).all(), f"{name}: labels differ from ORT"
            np.testing.assert_allclose(got["probabilities"], want["probabilities"], rtol=1e-5, atol=1e-6)
            runs = max(args.rounds * 4, 40) if rows == 1 else args.rounds * 2
            times = time_interleaved({"kiln": lambda: model.run(feed), "ort": lambda: sess.run(None, feed)},
                                     {"kiln": runs, "ort": runs}, args.rounds)
            k, o = stats(times["kiln"])["median_ms"], stats(times["ort"])["median_ms"]
            print(f"{name:18} {rows:>6} {k:>10.4f} {o:>10.4f} {o / k:>9.2f}  {nodes:>5}  {built:8.2f}")
    if args.overhead:
        _overhead(args)
    return 0


def _overhead(args) -> None:
    """kiln's run() on a one-Identity model of the same input: the per-call cost without work."""
    import numpy as np
    from onnx import TensorProto, helper

    import kiln
    from kiln.bench import stats, time_interleaved
    g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "id",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, args.features])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    m = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    feed = {"X": np.ones((1, args.features), np.float32)}
    m.run(feed)
    t = time_interleaved({"id": lambda: m.run(feed)}, {"id": 400}, 4)
    print(f"kiln per-call overhead (Identity, 1 row): {stats(t['id'])['median_ms'] * 1e3:.1f} us")


if __name__ == "__main__":
    sys.exit(main())
