"""What an OpenMP fork and join costs under each wait policy: the figure kiln's fork decisions use.

    python benchmarks/fork_cost.py [--threads 2] [--gaps 0,50,500] [--regions 2000]

A C loop of `--regions` near-empty `omp parallel for` regions (two chunks of 4096 floats), with
`gap` microseconds of serial work between them (the serial kernels between two parallel ones),
built with the system compiler and run once per setting in a fresh process: kiln's default
(OMP_WAIT_POLICY=PASSIVE: threads sleep at once), and short or long spins before sleeping
(GOMP_SPINCOUNT), and kiln's own pool (KILN_THREADS_IMPL=pool: the regions inside one inference,
workers spinning at most 100 us between them). Printed: p10 / median / p90 / p99 microseconds per region, and the load.
kiln.runtime.threads takes FORK_US_SLEEPING, FORK_US_SPINNING and FORK_US_POOL from such runs (the median,
raised where whole models showed more); on a machine shared with other work, spinning threads
wait for a thread that is not running and the spin settings' tails grow by orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
static float buf[2][4096];
int main(int argc, char** argv) {
  int gap = atoi(argv[1]), n = atoi(argv[2]);
  double* ts = malloc(sizeof(double) * n);
  for (int r = 0; r < n; ++r) {
    double t0 = now();
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 4096; ++j) buf[i][j] += 1.0f;
    ts[r] = now() - t0;
    double t1 = now();
    while (now() - t1 < gap) {}
  }
  qsort(ts, n, sizeof(double), cmp);
  printf("%.2f %.2f %.2f %.2f\n", ts[n / 10], ts[n / 2], ts[9 * n / 10], ts[99 * n / 100]);
  return buf[0][0] < 0;
}
"""

# the same loop on kiln's pool (kiln/codegen/c_src/kiln_pool.h), all regions inside one inference
POOL_MAIN = r"""
#include <stdio.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
static float buf[2][4096];
static void body(void* c, int64_t lo, int64_t hi) { for (int64_t i = lo; i < hi; ++i) for (int j = 0; j < 4096; ++j) buf[i][j] += 1.0f; }
int main(int argc, char** argv) {
  int gap = atoi(argv[1]), n = atoi(argv[2]);
  double* ts = malloc(sizeof(double) * n);
  kiln_pool_for(body, 0, 0, 2);   /* workers made */
  kiln_pool_enter();
  for (int r = 0; r < n; ++r) {
    double t0 = now();
    kiln_pool_for(body, 0, 0, 2);
    ts[r] = now() - t0;
    double t1 = now();
    while (now() - t1 < gap) {}
  }
  kiln_pool_leave();
  qsort(ts, n, sizeof(double), cmp);
  printf("%.2f %.2f %.2f %.2f\n", ts[n / 10], ts[n / 2], ts[9 * n / 10], ts[99 * n / 100]);
  return buf[0][0] < 0;
}
"""

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
        src, exe = os.path.join(tmp, "fork.c"), os.path.join(tmp, "fork")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([*cc, "-O2", "-fopenmp", src, "-o", exe], check=True)
        from kiln.codegen.c import PRELUDE  # noqa: PLC0415
        from kiln.codegen.csource import c_source  # noqa: PLC0415
        pool_src, pool_exe = os.path.join(tmp, "pool.c"), os.path.join(tmp, "pool")
        with open(pool_src, "w") as f:
            f.write(PRELUDE + c_source("kiln_pool.h") + POOL_MAIN)
        subprocess.run([*cc, "-O2", "-fopenmp", "-pthread", pool_src, "-o", pool_exe, "-lm"], check=True)
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
