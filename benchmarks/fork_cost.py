"""What an OpenMP fork and join costs under each wait policy: the figure kiln's fork decisions use.

    python benchmarks/fork_cost.py [--threads 2] [--gaps 0,50,500] [--regions 2000]

A C loop of `--regions` near-empty `omp parallel for` regions (two chunks of 4096 floats), with
`gap` microseconds of serial work between them (the serial kernels between two parallel ones),
built with the system compiler and run once per setting in a fresh process: kiln's default
(OMP_WAIT_POLICY=PASSIVE: threads sleep at once), and short or long spins before sleeping
(GOMP_SPINCOUNT), and kiln's own pool (KILN_THREADS_IMPL=pool: the regions inside one inference,
workers spinning at most 100 us between them). Printed: p10 / median / p90 / p99 microseconds per region, and the load.
kiln.runtime.threads takes its table (FORK_US_SLEEPING, FORK_US_SPINNING, FORK_US_POOL) from such runs, and
kiln.codegen.fork_cost times the same loop on the host once (gap 50 us, the settings in force) and caches it,
the figure the host's fork decisions then use; on a machine shared with other work, spinning threads
wait for a thread that is not running and the spin settings' tails grow by orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile

SETTINGS = {"kiln default (PASSIVE)": {"OMP_WAIT_POLICY": "PASSIVE"},
            "GOMP_SPINCOUNT=3000": {"GOMP_SPINCOUNT": "3000"},
            "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gaps", default="0,50,500", help="serial microseconds between regions")
    p.add_argument("--regions", type=int, default=2000)
    args = p.parse_args(argv)
    cc = shlex.split(os.environ.get("KILN_CC") or "cc")
    with tempfile.TemporaryDirectory() as tmp:
        from kiln.codegen.fork_cost import build  # the loops kiln measures its host with  # noqa: PLC0415
        exe, pool_exe = build("omp", tmp, cc), build("pool", tmp, cc)
        runs = [(name, exe, env) for name, env in SETTINGS.items()] + [("kiln pool (spin 100 us)", pool_exe, {})]
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        print(f"{args.threads} threads, {args.regions} regions per run, load {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cpus; us per fork and join: p10 / median / p90 / p99")
        for gap in (int(g) for g in args.gaps.split(",")):
            for name, program, env in runs:
                out = subprocess.run([program, str(gap), str(args.regions)], capture_output=True, text=True, check=True,
                                     env={**base, **env, "OMP_NUM_THREADS": str(args.threads)}).stdout.split()
                print(f"  gap {gap:>4} us  {name:<24} " + " / ".join(f"{float(v):8.2f}" for v in out))


if __name__ == "__main__":
    main()
