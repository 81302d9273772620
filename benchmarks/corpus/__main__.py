"""python -m benchmarks.corpus [build|run|list] ...   (run is the default)

  build [--only a,b] [--family cnn] [--force]     export the models (torch, transformers)
  run   [--only a,b] [--family cnn] [-O N] [--json PATH] [--profile] [--no-openvino]
  list                                            the models, their shapes and build state
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.corpus", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    for name in ("build", "run", "list"):
        s = sub.add_parser(name)
        s.add_argument("--only", help="comma-separated model names")
        s.add_argument("--family", help="comma-separated families: cnn, transformer, rnn, small")
    b = sub.choices["build"]
    b.add_argument("--force", action="store_true", help="rebuild even when the cached file is current")
    r = sub.choices["run"]
    r.add_argument("-O", dest="opt_level", type=int, default=None, help="kiln opt level (default: kiln's default)")
    r.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    r.add_argument("--budget", type=float, default=1.0, help="timed seconds per engine per shape (default 1)")
    r.add_argument("--min-runs", type=int, default=5)
    r.add_argument("--max-runs", type=int, default=50)
    r.add_argument("--json", metavar="PATH", help="write the rows and geometric means as JSON")
    r.add_argument("--profile", action="store_true",
                   help="kiln's per-kernel times beside ORT's per-node profile, per op kind")
    r.add_argument("--check-only", action="store_true",
                   help="compile and check kiln against ORT at every shape; time nothing")
    r.add_argument("--no-openvino", dest="openvino", action="store_false", help="leave OpenVINO out")
    return p


def built_metas() -> list[dict]:
    from benchmarks.corpus.build import corpus_dir
    metas = []
    for path in sorted(glob.glob(os.path.join(corpus_dir(), "*.json"))):
        with open(path) as f:
            metas.append(json.load(f))
    return metas


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("build", "run", "list", "-h", "--help"):
        argv.insert(0, "run")
    args = parser().parse_args(argv)
    from benchmarks.corpus import FAMILIES, select, specs
    if args.cmd == "build":
        from benchmarks.corpus.build import build, corpus_dir
        failed = []
        for spec in select(specs(), args.only, args.family):
            try:
                build(spec, force=args.force)
            except Exception as e:  # an export bug: say which, go on with the rest
                failed.append(spec.name)
                print(f"FAILED {spec.name}: {type(e).__name__}: {str(e).strip()[:400]}", file=sys.stderr)
        print(f"corpus in {corpus_dir()}" + (f"; failed: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    if args.cmd == "list":
        from benchmarks.corpus.build import fingerprint, load_meta
        from benchmarks.corpus.spec import case_label
        for spec in select(specs(), args.only, args.family):
            meta = load_meta(spec)
            state = "not built" if meta is None else f"built, {meta['bytes'] / 1e6:.0f} MB" + (
                "" if meta["fingerprint"] == fingerprint(spec) else ", stale: its builder changed")
            print(f"{spec.name:<20} {spec.family:<12} {spec.exporter:<11} opset {spec.opset}  "
                  f"{' | '.join(map(case_label, spec.cases))}  ({state})")
        return 0
    metas = select(built_metas(), args.only, args.family)
    if not metas:
        print("no corpus models built: run `python -m benchmarks.corpus build` first", file=sys.stderr)
        return 1
    missing = [f for f in FAMILIES if args.family is None and not any(m["family"] == f for m in metas)]
    if missing:
        print(f"note: no models of family {missing} built", file=sys.stderr)
    from benchmarks.corpus.run import main as run
    run(args, metas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
