"""kiln::Recurrent's native kernel (cpu target): the state's GEMV per step, gates fused.

Per time step and direction the state's product h @ R^T is the whole cost: it
reads all of R (G * H * H floats, 1 MiB for an LSTM of 256 units) to do
G * H * H multiply-adds per batch row, so at batch 1 it is bound by how fast R
streams from cache. R arrives packed (kiln.ops.recurrent.pack_r) as panels of
U = 16 hidden units x G gates: a panel is read front to back, its G * U sums (per
batch row of a tile) stay in vector registers, and the panel's epilogue adds the
projected input, applies the gate nonlinearities (inline, vectorised: recurrent.h)
and updates c, h and Y for those U units at once: nothing of a step goes back to
memory but the new state.

Batch rows: a tile of rows shares each panel row's loads, and each tile reads all of R
once per step, so a tile takes as many rows as half the register file holds sums for,
its gates then summed in passes of a few gates (`_tile`): batch 8 of an LSTM is one tile,
two passes of 2 gates x 8 rows, instead of two tiles of 4 rows that read R twice.

Threads: the team is one kiln_par_for job (kiln/codegen/c_src/kiln_par.h: kiln's pool, the
module's threads; one fork per kernel, none per step), each member a file-scope function
call. When a step is big enough (`team_per_direction`), the team shares the
panels of every direction, each thread streaming its own range of R from its own core's
cache: at 2 threads a unidirectional layer's panels half each (an LSTM of 256 units:
512 KiB of its 1 MiB of R, which fits a Zen 4 core's 1 MiB L2; the whole does not). A
layer with no more threads than directions (bidirectional at 2 threads) runs a direction
on each thread with no synchronisation instead (DIRECTIONS). The team claims panels
stage by stage (kiln/codegen/c_src/recurrent.h): own range first, then what is left of the others', so
a partner that is late (waking from its sleep between kernels) or descheduled (a loaded
machine) costs a step only the panels it holds, never a wait for it, and the kernel
never falls back to one thread. A stage is a step's product (two for GRU without
linear_before_reset, whose reset gate must be complete before the h gate's product); h
is double-buffered so a step reads the previous state while writing the next. Smaller
steps run each direction on a thread of its own, with no synchronisation at all, and so
do groups of a batch's rows where R is small enough (ROW_MIN, ROW_L2): a member then runs
one direction for its rows through the whole sequence.

Each tile asks for its projected inputs' and Y's cache lines before its sums (far apart, a
line or two per row and gate: the hardware prefetcher misses them), so the sums hide the misses,
and for the next step's projected inputs into L2.
"""

from __future__ import annotations

import hashlib

from kiln.dtypes import DType
from kiln.ops.recurrent import DOMAIN, GATES
from kiln.loops.symbols import as_int, c_size, same_size, static
from kiln.lower.rnn import _lit
from kiln.codegen.csource import c_source
from kiln.lower.context import lowering
from kiln.lower.decisions import OneOf, declare
from kiln.targets.target import Target

# One thread or several per step, from R's size and the caches. A step streams R (G x H x H
# floats) once per tile of batch rows, from the cache level it fits; shared by t threads it
# costs each thread 1/t of that, plus the stage's end: the claims and the wait, a few cache
# lines passed between cores (~0.1-0.3 us), a fork (once per kernel) aside. So a thread's share
# must stream from L2 several times that long: a share of SHARE_L1 x L1d bytes of R x rows
# (128 KiB on Zen 4's 32 KiB L1d: ~1.3 us at the ~100 GB/s one core streams from L2, measured
# by benchmarks/recurrent.py's bound). R of at most one such share runs on one thread (an LSTM
# of 64 units at batch 1: 64 KiB, 1.2 us a step, where the split's synchronisation cost as
# much as it saved); past it, each thread gets at least one share, so an LSTM of 128 units
# (256 KiB) splits in two and one of 256 units (1 MiB) in up to eight: its halves (512 KiB)
# also fit each core's 1 MiB L2, where the whole, with the projected inputs streaming
# through, overfills one (a step at 85-96 GB/s instead of ~104).
SHARE_L1 = 4


# The panel order turns round from step to step (kiln_rec_mirror, recurrent.h) only while a
# thread streams at most this many L2s of R a stage. Measured at one thread, thread CPU time,
# corpus models (benchmarks/recurrent.py --corpus): 1 MiB of R (an LSTM of 256 units, the
# L2's size) 11.6-12.4 us a step turning, 12.9-13.1 not; 2 MiB (a bidirectional one, both
# directions on the thread) 14.6-16.2 turning, 12.8-13.7 not; 768 KiB (GRU 256) the same
# either way.
TURN_L2 = 1.5


# Batch rows shared out instead of panels: each member (a thread) runs a group of the batch's rows
# through every step on its own, reading all of R per step from its own core's caches, with no
# synchronisation at all between steps. A tile of r rows does r multiply-adds (vectors) per vector
# of R it reads: at r >= ROW_MIN the member is bound by its FMAs, not by streaming R (Zen 4: one
# 64-byte FMA a cycle, ~27 bytes a cycle from L2), so reading all of R costs it no more than a
# panel split's half does, and the split's per-step barrier (and its stolen panels, read from the
# other core's cache) is gone. Only while R fits ROW_L2 of a core's L2 (it stays there from step
# to step, next to the projected inputs streaming through): an LSTM of 64 units (64 KiB) at
# batch 8 takes two groups of 4 rows; one of 256 units (1 MiB) keeps its panels split. At half
# an L2 R no longer stays: Sapphire Rapids (2 MiB L2), 2 threads, quiet, benchmarks/thread_scaling.py
# at seq 128 batch 8, ms per layer: an LSTM of 256 units (1 MiB, 0.5 of L2) 6.6-6.9 in rows against
# 2.4-3.0 in panels (the model 25.8 against 14.1 ms); a GRU of 256 units (768 KiB, 0.375 of L2)
# 2.2-2.6 in rows against 2.6-2.7 in panels.
ROW_MIN = 4
ROW_L2 = 0.4


def panel_threads(r_bytes: int, nd: int, target: Target) -> int:
    """The fewest threads whose shares of all directions' R (nd x r_bytes) each fit a thread's
    L1d: from that many on, the panels are shared (`rows_pay`; the kernel holds its thread count
    against it at run time)."""
    return -(-nd * r_bytes // target.l1d_bytes)


def rows_pay(r_bytes: int, nd: int, threads: int, target: Target) -> bool:
    """Whether batch rows shared out (each thread reading all of R every step, from its L2) beat
    the panels shared (each thread its share of R): not where that share of all directions' R
    fits a thread's L1d. Sapphire Rapids (48 KiB L1d), 2 threads, quiet, `python -m benchmarks.corpus
    run --only lstm_classifier`: an LSTM of 64 units (R 64 KiB, 32 KiB a thread) at batch 8 took
    0.39-0.52 ms in rows (1.58-1.74 of ONNX Runtime) and 0.21 in panels (0.76), one thread 0.32.
    A 4-row member took 2.5-3x what the same 4 rows take at batch 4 (0.14 ms), also with the two
    members run in turn on one core (KILN_POOL_SERIAL=1: the model 0.56-0.81 ms), so it is not
    the two threads' interference (why, not found)."""
    return threads < panel_threads(r_bytes, nd, target)


# A layer of several directions on at most one thread per direction (2 threads, bidirectional):
# the team claims every direction's panels stage by stage ("shared": a late or descheduled thread's
# panels are taken by the other, for a claim, a counter and a flag passed between the cores every
# step), or each direction runs on a thread of its own through the whole sequence ("own": no
# synchronisation at all; a thread that comes late delays only its own direction, and the kernel's
# end). Own, measured quiet (2 threads, Zen 4, load 1.2-1.7, interleaved with ONNX Runtime, corpus
# models, kiln ms own / shared in each of 4-5 runs): bilstm seq 512 b1 0.93-1.0, seq 128 b8
# 0.92-1.0, seq 128 b1 0.96-1.0; bigru 0.97-1.0. The tuner may still choose shared.
DIRECTIONS = declare("recurrent.directions", OneOf(("shared", "own")), lambda t: "own",
                     "several directions on at most one thread each: panels claimed by the team "
                     "stage by stage (shared) or a thread per direction, unsynchronised (own)")


def team_per_direction(r_bytes: int, batch: int, panels: int, target: Target) -> int:
    """Threads that share one direction's step (1: it runs on one thread): one per
    SHARE_L1 x L1d bytes of R x batch rows, at most one per panel."""
    return max(1, min(panels, r_bytes * batch // (SHARE_L1 * target.l1d_bytes)))


# the panel claims and activations every kiln::Recurrent kernel shares
PREAMBLE = c_source("kiln_sigmoid.h") + c_source("kiln_par.h") + c_source("recurrent.h")


def _act(name: str, a, b, v: str) -> str:
    """C (float) for activation `name` of variable `v`, as the reference computes it."""
    la = _lit(a, "float") if a is not None else None
    lb = _lit(b, "float") if b is not None else None
    return {
        "relu": f"({v} < 0.0f ? 0.0f : {v})",
        "tanh": f"kiln_rec_tanh({v})",
        "sigmoid": f"kiln_sigmoid_f32({v})",
        "affine": f"({la} * {v} + {lb})",
        "leakyrelu": f"({v} >= 0.0f ? {v} : {la} * {v})",
        "thresholdedrelu": f"({v} > {la} ? {v} : 0.0f)",
        "scaledtanh": f"({la} * kiln_rec_tanh({lb} * {v}))",
        "hardsigmoid": f"kiln_rec_clamp({la} * {v} + {lb}, 0.0f, 1.0f)",
        "elu": f"({v} >= 0.0f ? {v} : {la} * (expf({v}) - 1.0f))",
        "softsign": f"({v} / (1.0f + fabsf({v})))",
        "softplus": f"log1pf(expf({v}))",
    }[name]


def _tile(batch: int, gates: int, target: Target) -> tuple[int, int, int]:
    """(batch rows per tile, gates per pass, q-split). A tile's sums, rows x gates 64-byte
    vectors, take half the register file (`budget`: 16 of AVX-512's 32 zmm; 4, i.e. 8 of
    AVX2's 16 ymm), the rest is left for the panel row's loads and the broadcasts. Each tile
    reads all of R once per step, so a tile takes as many rows as the budget allows (batch 8:
    one tile instead of two of 4 rows, which read R twice and, a panel being larger than L1,
    from L2 the second time) and a panel's gates in as many passes as that needs (8 rows x 2
    gates, twice): a pass reads only its gates' cache lines, so R is still read once. Batch 1
    sums even and odd q apart when that fits, for more independent FMA chains."""
    budget = target.vector_registers // 2 * target.vector_bytes // 64
    tiles = -(-batch // budget)
    rows = -(-batch // tiles)
    per_pass = max(1, min(gates, budget // rows))
    per_pass = -(-gates // -(-gates // per_pass))   # passes of equal size
    split = 2 if rows * per_pass * 2 <= budget and batch == 1 else 1
    return rows, per_pass, split


def _gemv(nrows: int, gates: list[int], g: int, split: int, src: str, target: Target) -> list[str]:
    """C: acc_<row>_<k> (kv) = sum over q of src row's q-th float x panel row q, gate k."""
    lines = [f"kv acc_{r}_{k} = {{0}};" for r in range(nrows) for k in gates]
    if split == 2:
        lines += [f"kv acc2_{r}_{k} = {{0}};" for r in range(nrows) for k in gates]
    lines += [f"const float* s_{r} = {src}(b0 + {r} < rhi ? b0 + {r} : rhi - 1);" for r in range(nrows)]

    # with several rows each panel vector feeds several FMAs: hold it in a register (GCC would
    # fold a load into every FMA, and Zen 4 loads one 64-byte vector per cycle, one FMA too)
    pin = nrows > 1 and target.vector_bytes == 64 and target.arch in ("x86_64", "amd64")

    def body(q: str, acc: str) -> list[str]:
        out = [f"const float* wq = wp + ({q}) * {g * 16};"]
        out += [f"kv w_{k}; memcpy(&w_{k}, wq + {k * 16}, 64);" + (f' __asm__("" : "+v"(w_{k}));' if pin else "")
                for k in gates]
        for r in range(nrows):
            out.append(f"{{ const float hv = s_{r}[{q}];")
            out += [f"  {acc}_{r}_{k} += hv * w_{k};" for k in gates]
            out.append("}")
        return out

    if split == 2:
        lines += ["int64_t q = 0;", "for (; q + 1 < H; q += 2) {",
                  *("  " + x for x in ["{", *body("q", "acc"), "}", "{", *body("q + 1", "acc2"), "}"]),
                  "}", "if (q < H) {", *("  " + x for x in body("q", "acc")), "}"]
        lines += [f"acc_{r}_{k} += acc2_{r}_{k};" for r in range(nrows) for k in gates]
    else:
        lines += ["for (int64_t q = 0; q < H; ++q) {", *("  " + x for x in body("q", "acc")), "}"]
    return lines


@lowering("Recurrent", domain=DOMAIN)
def _lower(ctx, xw, rp, rbh=None, lens=None, h0=None, c0=None, p=None):
    from kiln.ops.rnn import _activation_specs, _num_dirs
    target = Target.of(ctx.target)
    kind = ctx.attr("kind")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    xt, rt = ctx.input_types[:2]
    if xt.dtype is not DType.float32 or rt.dtype is not DType.float32:
        ctx.fail(f"Recurrent's native kernel takes float32 xw and rp, got {xt.dtype} and {rt.dtype}",
                 stage="lower")
    layout = int(ctx.attr("layout", 0))
    nd, g, hs = _num_dirs(ctx), GATES[kind], int(ctx.attr("hidden_size"))
    steps, batch = (xt.shape[1], xt.shape[0]) if layout else xt.shape[:2]
    # steps and batch may be symbols (a shape-generic module): C expressions of the kernel's
    # symbol locals, the schedule's choices (tile rows, threads) then made at run time
    S, Bc = c_size(steps), c_size(batch)
    n_p, lanes = rt.shape[1], rt.shape[4]
    if tuple(rt.shape) != (nd, -(-hs // 16), hs, g, 16) or lanes != 16 or n_p * 16 < hs:
        ctx.fail(f"rp must be packed [{nd}, {-(-hs // 16)}, {hs}, {g}, 16], got {tuple(rt.shape)}", stage="lower")
    gh, pu = g * hs, n_p * 16
    # whether the batch's rows may be shared out between threads (ROW_MIN, ROW_L2), decided at run time
    rows_ok = g * hs * hs * 4 <= target.l2_bytes * ROW_L2 and (not static(batch) or as_int(batch) >= 2 * ROW_MIN)
    names = ["xw", "rp", "rbh", "lens", "h0", "c0", "P"][:len(ctx.node.inputs)]
    arg, k = {}, 0
    for i, name in enumerate(names):
        if ctx.has_input(i):
            arg[name], k = f"in{k}", k + 1
    hshape = (batch, nd, hs) if layout else (nd, batch, hs)
    want = {"rbh": (nd, hs), "lens": (batch,), "h0": hshape, "c0": hshape, "P": (nd, 3 * hs)}
    for i, name in enumerate(names):
        got = tuple(ctx.input_types[i].shape) if ctx.has_input(i) else ()
        if name in want and ctx.has_input(i) and (len(got) != len(want[name]) or
                                                  not all(same_size(a, b) for a, b in zip(got, want[name]))):
            ctx.fail(f"{name} must have shape {want[name]}, got {got}", stage="lower")
    specs = _activation_specs(ctx, kind, nd)
    clip = ctx.attr("clip", None)
    lbr = bool(ctx.attr("linear_before_reset", 0))
    forget = bool(ctx.attr("input_forget", 0))
    direction = ctx.attr("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    n_out = len(ctx.node.outputs)
    y_shape = (batch, steps, nd, hs) if layout else (steps, nd, batch, hs)
    shapes = [y_shape, hshape, hshape][:n_out]

    def act(slot: int, v: str) -> str:
        alts = [_act(*specs[d][slot], v) for d in range(nd)]
        return alts[0] if nd == 1 or alts[0] == alts[1] else f"(d == 0 ? {alts[0]} : {alts[1]})"

    pre = (lambda v: v) if clip is None else \
        (lambda v: f"kiln_rec_clamp({v}, -{_lit(float(clip), 'float')}, {_lit(float(clip), 'float')})")
    def peep(w: int, c: str) -> str:  # + the peephole term, when there are peepholes
        return f" + pp[{w * hs} + j] * {c}" if "P" in arg else ""
    Y = (lambda: f"((b * S + ti) * {nd} + d) * {hs}") if layout else \
        (lambda: f"((ti * {nd} + d) * B + b) * {hs}")
    XW = (lambda: f"(b * S + ti) * {nd * gh} + d * {gh}") if layout else \
        (lambda: f"(ti * B + b) * {nd * gh} + d * {gh}")
    H = (lambda d_, b_: f"(({b_}) * {nd} + ({d_})) * {hs}") if layout else \
        (lambda d_, b_: f"(({d_}) * B + ({b_})) * {hs}")
    lens_b = f"(int64_t){arg['lens']}[b]" if "lens" in arg else "S"
    gru2 = kind == "GRU" and not lbr  # two products per step: (z, r) from h, then h-gate from r * h

    # the state of one direction: h (2 buffers), c, and for gru2 r * h and z: [B][PU] each
    per_dir = f"({2 + 1 + (2 if gru2 else 0)} * B * PU)"

    def epilogue(rows: int, cell: list[str]) -> list[str]:
        """Per live row of the tile: pre[k][jj] = the row's sum for gate k, then `cell` over the
        panel's units (j = p * 16 + jj < H) with xr the row's projected input, hp / hq its state."""
        out = []
        for r in range(rows):
            out += [f"if (b0 + {r} < rhi) {{",
                    f"  const int64_t b = b0 + {r};",
                    f"  const int64_t len = {lens_b};",
                    "  float* hq = hn + b * PU + p * 16; const float* hp = hc + b * PU + p * 16;",
                    "  if (!(s < len)) { if (copy_dead) memcpy(hq, hp, 64); } else {",
                    "    const int64_t ti = rev ? len - 1 - s : s;",
                    f"    const float* xr = xw + {XW()} + p * 16;",
                    "    float* cc = cb + b * PU + p * 16; (void)cc;",
                    f"    float* yo = out0 + {Y()} + p * 16; (void)yo;",
                    "    float* rh = rhb + b * PU + p * 16; float* zz = zb + b * PU + p * 16; (void)rh; (void)zz;",
                    f"    float (*pre)[16] = pacc[{r}];",
                    "    #pragma omp simd",
                    "    for (int64_t jj = 0; jj < n; ++jj) {",
                    "      const int64_t j = p * 16 + jj; (void)j;",
                    *("      " + x for x in cell),
                    "    }",
                    "  }",
                    "}"]
        return out

    h_gate = f"pre[2][jj] + rb[j]" if "rbh" in arg else "pre[2][jj]"
    if kind == "RNN":
        phases = [([0], "hc", ["float v = xr[jj] + pre[0][jj];",
                               f"v = {pre('v')}; const float h = {act(0, 'v')};",
                               "hq[jj] = h; yo[jj] = h;"])]
    elif kind == "LSTM":
        forget_gate = ("const float gf = 1.0f - gi;" if forget else
                       f"v = xr[{2 * hs} + jj] + pre[2][jj]{peep(2, 'cc[jj]')}; v = {pre('v')}; "
                       f"const float gf = {act(0, 'v')};")
        phases = [([0, 1, 2, 3], "hc", [
            f"float v = xr[jj] + pre[0][jj]{peep(0, 'cc[jj]')}; v = {pre('v')}; const float gi = {act(0, 'v')};",
            forget_gate,
            f"v = xr[{3 * hs} + jj] + pre[3][jj]; v = {pre('v')}; const float gc = {act(1, 'v')};",
            "const float c = gf * cc[jj] + gi * gc; cc[jj] = c;",
            f"v = xr[{hs} + jj] + pre[1][jj]{peep(1, 'c')}; v = {pre('v')}; const float go = {act(0, 'v')};",
            f"const float h = go * {act(2, 'c')};",
            "hq[jj] = h; yo[jj] = h;"])]
    elif lbr:
        phases = [([0, 1, 2], "hc", [
            f"float v = xr[jj] + pre[0][jj]; v = {pre('v')}; const float z = {act(0, 'v')};",
            f"v = xr[{hs} + jj] + pre[1][jj]; v = {pre('v')}; const float r = {act(0, 'v')};",
            f"v = xr[{2 * hs} + jj] + r * ({h_gate}); v = {pre('v')}; const float hh = {act(1, 'v')};",
            "const float h = (1.0f - z) * hh + z * hp[jj];",
            "hq[jj] = h; yo[jj] = h;"])]
    else:
        phases = [([0, 1], "hc", [
            f"float v = xr[jj] + pre[0][jj]; v = {pre('v')}; zz[jj] = {act(0, 'v')};",
            f"v = xr[{hs} + jj] + pre[1][jj]; v = {pre('v')}; const float r = {act(0, 'v')};",
            "rh[jj] = r * hp[jj];"]),
            ([2], "rhb", [
            f"float v = xr[{2 * hs} + jj] + pre[2][jj]; v = {pre('v')}; const float hh = {act(1, 'v')};",
            "const float h = (1.0f - zz[jj]) * hh + zz[jj] * hp[jj];",
            "hq[jj] = h; yo[jj] = h;"])]

    def panel(gates: list[int], src: str, cell: list[str], last: bool) -> list[str]:
        """C: panel p of a stage, for every tile of batch rows: the tile's sums for `gates`, a
        pass of gates at a time, stored to pacc, then the epilogue. A symbolic batch: one such
        loop per tile height a batch of 1, 2, 4, ... rows takes, picked at run time (from the
        member's rows [rlo, rhi), where the rows may be shared out)."""
        if static(batch) and not rows_ok:
            return tiles(as_int(batch), gates, src, cell, last)
        budget = target.vector_registers // 2 * target.vector_bytes // 64
        heights = sorted({_tile(1 << k, len(gates), target)[0]: 1 << k for k in range(budget.bit_length())}.items())
        out = []
        for k, (rows, b) in enumerate(heights):
            cond = "" if k == len(heights) - 1 else f"if (rhi - rlo <= {rows}) "
            out += [("} else " if k else "") + cond + "{", *("  " + x for x in tiles(b, gates, src, cell, last))]
        return out + ["}"]

    def tiles(batch: int, gates: list[int], src: str, cell: list[str], last: bool) -> list[str]:
        """panel's loop over tiles of batch rows, its tile height as for `batch` rows."""
        rows, per_pass, split = _tile(batch, len(gates), target)
        sums = []
        for i in range(0, len(gates), per_pass):
            part = gates[i:i + per_pass]
            sums += ["{", *("  " + x for x in _gemv(rows, part, g, split, f"{src} + PU * ", target)),
                     *(f"  memcpy(pacc[{r}][{k}], &acc_{r}_{k}, 64);" for r in range(rows) for k in part), "}"]
        # the epilogue's projected inputs (a line or two per row and gate, far apart: the
        # prefetcher misses them) and Y's lines asked for before the tile's sums, which take
        # long enough to hide their misses; and the next step's projected inputs into L2, a
        # step ahead (those asked for a tile ahead still come late at batch 8: LSTM / GRU of 256
        # units at batch 8, one thread, thread CPU time, 1-7% of the layer's time; batch 1 the same)
        nxt = XW().replace("ti", "(rev ? len - 2 - s : s + 1)")
        ahead = [f"for (int64_t r = 0; r < {rows} && b0 + r < rhi; ++r) {{",
                 f"  const int64_t b = b0 + r, len = {lens_b};",
                 "  if (s < len) {",
                 "    const int64_t ti = rev ? len - 1 - s : s;",
                 f"    const float* xr = xw + {XW()} + p * 16;",
                 *(f"    __builtin_prefetch(xr + {k * hs}); __builtin_prefetch(xr + {k * hs + 15});" for k in gates),
                 *([f"    __builtin_prefetch(out0 + {Y()} + p * 16, 1); __builtin_prefetch(out0 + {Y()} + p * 16 + 15, 1);"]
                   if last else []),
                 f"    if (s + 1 < len) {{ const float* xn = xw + {nxt} + p * 16;",
                 *(f"      __builtin_prefetch(xn + {k * hs}, 0, 2); __builtin_prefetch(xn + {k * hs + 15}, 0, 2);"
                   for k in gates),
                 "    }",
                 "  }",
                 "}"]
        return [f"const float* wp = rpd + p * {hs * g * 16};",
                "const int64_t n = H - p * 16 < 16 ? H - p * 16 : 16;",
                f"const int copy_dead = {int(last)};",
                f"for (int64_t b0 = rlo; b0 < rhi; b0 += {rows}) {{",
                f"  float pacc[{rows}][{g}][16];",
                *("  " + x for x in ahead),
                *("  " + x for x in sums),
                *("  " + x for x in epilogue(rows, cell)),
                "}"]

    rev = "d == 1" if direction == "bidirectional" else str(int(direction == "reverse"))
    nph = len(phases)
    # a stage's panels: idx = d * n_p + p over [lo, hi), claimed by the team or taken in order
    step = [f"const int64_t s = stage / {nph}, ph = stage % {nph}; (void)ph;"]
    for i, (gates, src, cell) in enumerate(phases):
        body = panel(gates, src, cell, i == nph - 1)
        # shared panels: the state this stage reads was written by the team's other cores in
        # the last one; its lines asked for at once (their misses overlap) rather than one by
        # one as the sums reach them
        at = "(s & 1) * B * PU" if src == "hc" else "3 * B * PU"
        step += [*([f"if (ph == {i}) {{"] if nph > 1 else ["{"]),
                 f"  if (claim) for (int64_t dd = 0; dd < ND; ++dd) for (int64_t i = 0; i < B * PU; i += 16) "
                 f"__builtin_prefetch(state + dd * {per_dir} + {at} + i);",
                 f"  int64_t cnt = 0, idx; const int mirror = turn && kiln_rec_mirror(stage, {nph});",
                 f"  while ((idx = claim ? kiln_rec_claim(team, nt, tid, {nd * n_p}, stage, mirror) "
                 ": lo + cnt < hi ? (mirror ? hi - 1 - cnt : lo + cnt) : -1) >= 0) {",
                 "    ++cnt;",
                 f"    const int64_t d = idx / {n_p}, p = idx % {n_p};",
                 f"    const int rev = {rev}; (void)rev;",
                 f"    const float* rpd = in1 + d * {n_p * hs * g * 16};",
                 *([f"    const float* rb = {arg['rbh']} + d * {hs};"] if "rbh" in arg else []),
                 *([f"    const float* pp = {arg['P']} + d * {3 * hs};"] if "P" in arg else []),
                 f"    float* sd = state + d * {per_dir};",
                 "    float* hc = sd + (s & 1) * B * PU; float* hn = sd + ((s & 1) ^ 1) * B * PU;",
                 "    float* cb = sd + 2 * B * PU;",
                 "    float* rhb = sd + 3 * B * PU; float* zb = sd + 4 * B * PU; (void)rhb; (void)zb;",
                 *("    " + x for x in body),
                 "  }",
                 f"  stage = claim ? kiln_rec_finish(team, {nd * n_p}, stage, cnt) : stage + 1;",
                 "}"]

    h_init = f"(float){arg['h0']}[{H('d', 'b')} + j]" if "h0" in arg else "0.0f"
    c_init = f"(float){arg['c0']}[{H('d', 'b')} + j]" if "c0" in arg else "0.0f"
    share = SHARE_L1 * target.l1d_bytes   # team_per_direction's, for the run-time batch
    # directions on threads of their own where there are no more threads than directions
    own = " && avail > ND" if nd > 1 and DIRECTIONS.value() == "own" else ""
    if static(batch) and static(steps):
        per = team_per_direction(g * hs * hs * 4, as_int(batch), n_p, target)
        split = int(per > 1 and as_int(steps) > 1)
        # threads in the team: `per` per direction, 64 (KILN_REC_MAXPER) in all
        most = min(nd * per, 64) if split else nd
        sizes = [f"enum {{ B = {as_int(batch)}, H = {hs}, PU = {pu}, ND = {nd} }};", f"enum {{ S = {as_int(steps)} }};"]
    else:   # the same choices at run time
        split, most = "split", "most"
        sizes = [f"enum {{ H = {hs}, PU = {pu}, ND = {nd} }};",
                 f"const int64_t B = {Bc}, S = {S};",
                 f"const int64_t work = B * {g * hs * hs * 4} / {share};",
                 f"const int64_t per = work < 1 ? 1 : work < {n_p} ? work : {n_p};",
                 "const int split = per > 1 && S > 1;",
                 f"const int64_t most = split ? ({nd} * per < 64 ? {nd} * per : 64) : {nd};"]
    # the team's work, one call per member [kiln_lo, kiln_hi) of team_n (kiln_par_for: kiln's
    # pool, or OpenMP's team where the module has no pool): a file-scope function named by a
    # hash of its text, its sizes and pointers from the kernel (kiln_rec_job)
    ins = [f"const {ctx.input_types[i].dtype.c_storage}* restrict {arg[nm]} = "
           f"(const {ctx.input_types[i].dtype.c_storage}*)job->in[{i}];"
           for i, nm in enumerate(names) if nm in arg and nm not in ("h0", "c0")]
    member = [
        "const kiln_rec_job* job = (const kiln_rec_job*)kiln_ctx;",
        "typedef float kv __attribute__((vector_size(64)));",
        *(sizes if static(batch) and static(steps) else
          [f"enum {{ H = {hs}, PU = {pu}, ND = {nd} }};", "const int64_t B = job->B, S = job->S;"]),
        "const int split = job->split; const int64_t groups = job->groups; (void)groups;",
        *ins,
        "float* restrict out0 = job->out0; float* state = job->state; kiln_rec_team* team = job->team;",
        "const float* xw = in0; (void)xw;",
        "const int nt = job->team_n;",
        "for (int64_t tid = kiln_lo; tid < kiln_hi; ++tid) {",
        # split: the team claims every direction's panels stage by stage (its own range first;
        # a member that comes late, or never, leaves its panels to those that run); one member
        # takes them all in order; else each member runs one direction for one group of batch
        # rows, all its panels, with no synchronisation
        "  const int claim = split && nt > 1;",
        "  const int64_t grp = split ? 0 : tid / ND, rlo = grp * B / groups, rhi = (grp + 1) * B / groups;",
        "  for (int64_t d0 = claim ? 0 : split ? (tid == 0 ? 0 : ND) : tid % ND; d0 < ND; d0 += ND) {",
        f"    const int64_t lo = split ? 0 : d0 * {n_p}, hi = split ? {nd * n_p} : lo + {n_p};",
        # steps turn the panel order round while what this thread streams a stage (its own range,
        # or all it takes in order) is at most TURN_L2 x L2: past that too little of it stays
        # for the next step, and each panel's descending jump costs the prefetcher more
        f"    const int turn = (claim ? {nd * n_p} / nt : hi - lo) * {hs * g * 16 * 4} <= "
        f"{int(TURN_L2 * target.l2_bytes)};",
        f"    for (int64_t stage = 0; stage < S * {nph}; ) {{",
        *("      " + x for x in step),
        "    }",
        "  }",
        "}",
    ]
    text = "\n".join("  " + x for x in member) + "\n}\n"
    fn = "kiln_rec_member_" + hashlib.sha1(text.encode()).hexdigest()[:16]
    member_c = f"static void {fn}(void* kiln_ctx, int64_t kiln_lo, int64_t kiln_hi) {{\n" + text
    ptrs = ", ".join(arg[nm] if nm in arg and nm not in ("h0", "c0") else "0" for nm in names)
    body = [
        *sizes,
        "int rc = 0;",
        *([f"for (int64_t b = 0; b < B; ++b) if ({int(direction != 'forward')} && {lens_b} > S) rc = 1;",
           "if (rc) return 1;"] if "lens" in arg else []),
        f"float* state = (float*)kiln_alloc(sizeof(float) * {nd} * {per_dir});",
        "if (!state) return -1;",
        f"memset(state, 0, sizeof(float) * {nd} * {per_dir});",
        *([f"memset(out0, 0, sizeof(float) * S * B * {nd * hs});"] if "lens" in arg else []),
        "for (int64_t d = 0; d < ND; ++d)",
        "  for (int64_t b = 0; b < B; ++b)",
        "    for (int64_t j = 0; j < H; ++j) {",
        f"      state[d * {per_dir} + b * PU + j] = {h_init};",
        f"      state[d * {per_dir} + 2 * B * PU + b * PU + j] = {c_init};",
        "    }",
        "const int avail = kiln_par_threads();",
        # batch rows shared out (rows_ok): a group of at least ROW_MIN rows per thread
        f"int64_t groups = avail / ND < B / {ROW_MIN} ? avail / ND : B / {ROW_MIN};" if rows_ok else
        "int64_t groups = 1;",
        # ... unless the panels shared fit each thread's L1d (rows_pay)
        *([f"if ({split} && avail >= {panel_threads(g * hs * hs * 4, nd, target)}) groups = 1;"]
          if rows_ok else []),
        "if (groups < 1) groups = 1;",
        f"const int split_ = {split} && groups == 1{own};",
        f"const int team_n = !split_ ? (int)(ND * groups) : avail < {most} ? avail : (int){most};",
        "kiln_rec_team team;",
        f"kiln_rec_init(&team, team_n, {nd * n_p});",
        f"const kiln_rec_job job = {{ {{ {ptrs} }}, out0, state, &team, B, S, groups, team_n, split_ }};",
        f"kiln_par_for({fn}, (void*)&job, 0, team_n, team_n > 1);",
        *(["for (int64_t d = 0; d < ND; ++d)",
           "  for (int64_t b = 0; b < B; ++b) {",
           f"    const int live = {lens_b} > 0;",
           f"    const float* hf = state + d * {per_dir} + (S & 1) * B * PU + b * PU;",
           f"    const float* cf = state + d * {per_dir} + 2 * B * PU + b * PU; (void)cf;",
           "    for (int64_t j = 0; j < H; ++j) {",
           *([f"      out1[{H('d', 'b')} + j] = live ? hf[j] : 0.0f;"] if n_out > 1 else []),
           *([f"      out2[{H('d', 'b')} + j] = live ? cf[j] : 0.0f;"] if n_out > 2 else []),
           "    }",
           "  }"] if n_out > 1 else []),
        "free(state);",
        "return 0;",
    ]
    return ctx.extern("\n".join("  " + x for x in body), [xw, rp, rbh, lens, h0, c0, p],
                      [(s, DType.float32) for s in shapes], preamble=PREAMBLE + member_c,
                      errors={1: "a sequence_lens value exceeds the sequence length"
                              + (f" {as_int(steps)}" if static(steps) else "")})
