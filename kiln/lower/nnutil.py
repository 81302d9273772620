"""Helpers shared by the convolution, pooling and normalization lowerings: when a
kernel is worth forking threads for (`parallel_worth`), row schedules, broadcast loads.
Each asks the `Target` it is given (vector width, OpenMP wait policy), never the host.
"""

from __future__ import annotations

from kiln.dtypes import DType
from kiln.loops import const, max_, min_
from kiln.loops.symbols import extent, hint
from kiln.lower.decisions import OneOf, declare, parallel_min_work
from kiln.targets.target import Target


# A kernel forks when the time its threads save (the serial run, estimated, less its share
# per thread) is this many times the fork and join. It was 2 while parallel loops split their
# iterations evenly up front (a thread woken late then cost the whole kernel); they now take
# them in shrinking chunks (kiln.codegen.c.OMP_SCHEDULE), so the thread running starts at
# once and takes over what a late one has not begun, and a fork pays from one fork and join
# of saved time: on 2 cores a serial run of 2 forks (40 us when threads sleep), which the
# pointwise convs of a small CNN at batch 8 (~70 us) and a transformer layer's 256-wide
# projections reach. 2 threads of a quiet 16-core Xeon, medians (ms), gain 2 -> 1: a 256-wide
# transformer layer batch 4 x 64 2.51 -> 2.27, batch 1 x 64 0.605 -> 0.590, the DS-CNN
# keyword spotter batch 8 0.384 -> 0.352, batch 1 0.077 -> 0.076, an MNIST MLP batch 8
# 0.042 -> 0.040 (ONNX Runtime 2.63, 0.604, 0.245, 0.105, 0.037).
FORK_GAIN = 1
FORK_GAIN_DECISION = declare(
    "fork_gain", OneOf((0, 1, 2, 4, 8, 16)), lambda target: FORK_GAIN,
    "a kernel past parallel_min_work forks when the time its threads save is this many forks "
    "and joins (0: always)")
# One core's serial multiply-adds (or ops) per microsecond, per kind of kernel, as formulas
# of the Target, each constant with the measurement behind it:
# - "conv" and "gemm" (the packed GEMM's micro-kernel, kiln.lower.gemm): register-blocked
#   FMAs over vectors, so they scale with the vector width: 60e3 measured with AVX-512 (16
#   float32 lanes: 3.75e3 per lane); the AVX2 EPYC runs 1x1 convs at ~15e3, and with 60e3 a
#   0.5 ms conv looked like 0.12 ms and stayed serial (c81f711: mobilenetv2 -O3 19.7 -> 17.1
#   ms once the rate followed the lanes);
# - "depthwise" (10e3), "window" (pooling and other window ops, 2e3) and "copy" (packing and
#   other vectorized data movement, 4e3, 40a10cb): bound by loads rather than by the vector
#   width, measured on the same machines, the same for every target until one shows otherwise.
# - "attention" (kiln::FusedAttention's kernel: the GEMM's register tiles, plus an exp per score
#   and the online softmax's rescale per key block): 4 heads x 64 dims, one thread of the
#   AVX-512 Zen 4, benchmarks/attention.py --clock cpu: 16.7 GMAC/s at 32 keys, 26.4 at 64,
#   27.1 at batch 4 x 64 keys, so 1.65e3 per lane (the GEMM's rate took a 79 us attention
#   for 35 us);
# - weights read once per use, as a 1x1 conv on one pixel (a squeeze-excite block's) reads them,
#   arrive at the target's stream rate (`Target.stream_rate`: measured on the host by
#   kiln.codegen.stream_cost), not at a kind's (MobileNetV3's 960 -> 240 and 240 -> 960 on one
#   pixel took 30 and 36 us on the AVX-512 EPYC, one thread, where the "conv" rate says 4).
# - "sum": a plane summed into one vector per channel block (a global average pool: one vector
#   add per vector read, contiguous): 10e3-15e3 elements per us, squeeze-excite pools of
#   EfficientNet-B0 from 7x7x1152 to 56x56x144, one thread of the AVX-512 EPYC, thread CPU
#   time (corpus_cpu --profile, loaded); the "window" rate took them for 6x longer and forked
#   pools of 5-30 us (2 threads, quiet: 0.33 ms of pools against 0.18 on one thread).
MACS_PER_US_PER_LANE = {"conv": 3.75e3, "gemm": 3.75e3, "attention": 1.65e3}
OPS_PER_US = {"depthwise": 10e3, "window": 2e3, "copy": 4e3, "sum": 12e3}


def serial_rate(kind: str, target: Target) -> float:
    """Multiply-adds per microsecond one core of `target` does in a kernel of `kind`."""
    if kind in MACS_PER_US_PER_LANE:
        return MACS_PER_US_PER_LANE[kind] * target.vector_lanes(4)
    return OPS_PER_US[kind]


def parallel_worth(work: int, target: Target, kind: str = "window", streamed: int = 0) -> bool:
    """Whether a kernel doing `work` multiply-adds (window ops, elements copied) should run
    in parallel on `target`: past the serial floor (`parallel_min_work`), when the time `target.cores` threads
    save is `fork_gain` (FORK_GAIN by default) times the fork and join (`Target.fork_us`: a wake-up when threads sleep
    between kernels, kiln's default; ~2 us when they spin). `streamed`: elements (weights) the
    kernel reads once each, which take longer than its arithmetic where there is little of it
    (`Target.stream_rate`). A symbolic `work` is judged at its symbols' hints (kiln.loops.symbols)."""
    work = hint(work)
    if work < parallel_min_work():
        return False
    cores, rate, streamed = max(2, target.cores), serial_rate(kind, target), hint(streamed)
    serial_us = max(work / rate, streamed / target.stream_rate)
    # the cores split the weights as the work, read at the rate the cores stream together
    # (`Target.stream_rate_all`, measured; else each core at its own)
    together = target.stream_rate_all_measured or cores * target.stream_rate
    saved = serial_us - max(work / (cores * rate), streamed / together)
    return saved >= FORK_GAIN_DECISION.value() * target.fork_us


def parallel_from(n, work_of, target: Target, kind: str = "conv") -> str:
    """A hand-written kernel's `parallel` argument as C: "1"/"0" for a static batch `n`, else
    `(n >= k)` for the least batch k whose work (`work_of(k)`) is worth threads, so a symbolic
    batch of 1 stays serial as its specialised kernel is (kiln.loops.symbols.c_size spells n)."""
    from kiln.loops.symbols import as_int, c_size, static  # noqa: PLC0415
    if static(n):
        return str(int(parallel_worth(work_of(as_int(n)), target, kind)))
    k = next((k for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256) if parallel_worth(work_of(k), target, kind)),
             None)
    return "0" if k is None else "1" if k == 1 else f"({c_size(n)} >= {k})"


def _rup(a: int, b: int) -> int:
    return -(-a // b) * b


def _strides_of(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _acc_dtype(dt: DType) -> DType:
    return DType.float32 if dt in (DType.float16, DType.bfloat16) else dt


# ---------------------------------------------------------------- native: shared helpers

def _lanes(dt: DType, target: Target) -> int:
    return target.vector_lanes(dt.itemsize)


def _conj(conds):
    out = None
    for c in conds:
        out = c if out is None else out & c
    return const(1, DType.bool) if out is None else out


def bcast_load(t, idx):
    """Numpy-broadcast read of tensor t at the (right-aligned) output index idx."""
    lead = len(idx) - len(t.shape)
    return t[tuple(0 if n == 1 else idx[lead + k] for k, n in enumerate(t.shape))]


def accumulate_rows(sch, t, work: int, target: Target):
    """A window op's stage t (pools, symbolic-size convs): (image, channel) fused and parallel
    when the work pays, one row of results accumulated in a local array (registers) over the
    window's taps and stored once, the row's axis vectorized. Returns the local array's stage
    (its axes ordered rows, taps, row) for the caller's unrolling."""
    row = sch.cache_write(t)
    s = sch[t]
    ax = list(s.axis)
    nc = s.fuse(ax[0], ax[1])
    if parallel_worth(work, target):
        s.parallel(nc)
    if hint(ax[-1].arg.dom[1]) >= 4:
        s.vectorize(ax[-1])
    sl = sch[row]
    sl.compute_at(s, ax[-2] if len(ax) > 3 else nc)
    lax = list(sl.axis)
    sl.reorder(*lax[:-1], *sl.reduce_axis, lax[-1])
    return sl


def schedule_rows(stage, lead: int, target: Target, work: int | None = None, vector: bool = True):
    """Fuse the first `lead` axes into one (parallel when there is work) and the rest into one
    vectorized loop: the shape of per-row/per-channel elementwise and pooling stages."""
    axes = list(stage.axis)
    if not axes:
        return
    lead = max(0, min(lead, len(axes) - 1))
    outer = stage.fuse(*axes[:lead]) if lead > 1 else axes[0] if lead == 1 else None
    inner_axes = axes[lead:]
    if stage.reduce_axis:
        if outer is not None and parallel_worth(0 if work is None else work, target) and extent(outer) > 1:
            stage.parallel(outer)
        return
    inner = stage.fuse(*inner_axes) if len(inner_axes) > 1 else inner_axes[0]
    lanes = _lanes(stage.tensor.dtype, target)
    if vector and extent(inner) >= lanes:
        stage.vectorize(inner)
    if outer is not None and parallel_worth(0 if work is None else work, target) and extent(outer) > 1:
        stage.parallel(outer)


# ---------------------------------------------------------------- sliding windows (pools, symbolic-size windows)

def _pool_taps(win, o, ks, spatial, lo=None, hi=None):
    """Input positions of taps ks at output o, whether each is inside [lo, hi), clamped positions."""
    pos, ok, clamped = [], [], []
    for i, (oi, k) in enumerate(zip(o, ks)):
        p = oi * win.strides[i] + k * win.dilations[i] - win.begin[i]
        lo_i = 0 if lo is None else lo[i]
        hi_i = spatial[i] if hi is None else hi[i]
        pos.append(p)
        ok.append((p >= lo_i) & (p < hi_i))
        clamped.append(min_(max_(p, 0), spatial[i] - 1))
    return pos, _conj(ok), clamped


def _window_count(win, o, spatial, lo, hi):
    """Number of taps of the window at output o falling inside [lo, hi) per dim, multiplied (int64)."""
    total = None
    for i, oi in enumerate(o):
        s, d, b, kk = win.strides[i], win.dilations[i], win.begin[i], win.kernel[i]
        start = oi * s - b
        k_lo = max_(-((start - lo[i]) // d), 0)                      # ceil((lo - start) / d)
        k_hi = min_(-((start - hi[i]) // d), kk)                     # ceil((hi - start) / d)
        c = max_(k_hi - k_lo, 0)
        total = c if total is None else total * c
    return total
