"""Which algorithm runs each convolution, and why: one chooser for the whole compiler.

kiln has three ways to run a float32 2-D convolution on the CPU:

- `direct-nchw`: the NCHW direct convolution (kiln.lower.conv), vectorized over output
  pixels; every shape, dtype and rank;
- `direct-nchwc`: the blocked direct convolution (kiln.lower.nchwc), vectorized over a
  block of output channels; dense, depthwise or grouped 2-D convs with constant weights
  (grouped: channels per group in whole blocks, or dividing one: kiln.ops.layout.block_groups);
- `winograd`: F(4x4, 3x3) on the blocked layout (kiln.ops.winograd, kiln.lower.winograd),
  4x fewer multiplies for 3x3 stride-1 undilated convs, paid for by the transforms
  (about a tenth of the work at 64 channels, more below) and by weights 4x larger; for
  3-tap stride-1 1-D convs, dilated or not, F(m, 3) (kiln.ops.winograd1d): 2-2.25x fewer;
  for strided 1-D ones, F(m, r) over their input phases (8 taps at stride 4: r = 2).

`choose(shape, target)` returns the algorithm and a sentence saying why; the layout pass
(kiln.passes.layout) calls it per conv, rewrites the graph accordingly and lists every
choice in `model.report` (its findings). It is also a schedule decision,
`conv.algorithm` ("direct" or "winograd"), declared here like the conv templates' own:
`kiln.compile(model, decisions={"conv.algorithm": "direct"})` or the environment's
KILN_CONV_ALGO=direct|winograd overrides the rule for every conv it can apply to (a
conv Winograd cannot run stays direct, and the reason says so). Direct-nchwc vs nchw is
the layout pass's own rule (blocked neighbours, `kiln.passes.layout.SELECTIVE`).

The rule (WINOGRAD_MIN_*, `winograd_streams`): Winograd where its fewer multiplies pay for
the transforms and for streaming its larger weights (those read at one core's stream rate
against the direct conv's multiply-adds on all the target's cores), measured with
benchmarks/conv_bench.py and benchmarks/conv_algo_table.py on the corpus CNNs' 3x3 convs
(figures beside the constants).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from kiln.errors import KilnError
from kiln.lower.decisions import OneOf, declare
from kiln.targets.target import Target

# "direct": the rule's direct conv (blocked or not: the layout pass's rule); "direct-nchwc" /
# "direct-nchw": that direct conv on the blocked layout / on NCHW, whatever the neighbour rule says
ALGORITHMS = ("direct", "winograd", "direct-nchwc", "direct-nchw")
CONV_ALGORITHM = declare("conv.algorithm", OneOf(ALGORITHMS), lambda target: "direct",
                         "how a conv runs: direct (on the layout the rule picks), Winograd, or direct on "
                         "the blocked layout / on NCHW (kiln.lower.conv_algo)")
ENV = "KILN_CONV_ALGO"
# Per conv, the algorithm is a decision keyed by the conv's workload (`conv_key`: what it
# computes and on which shapes, not its name): {"@conv:<hash>": {"conv.algorithm": "winograd"}}
# in kiln.compile's decisions, which is where `kiln tune` records go (kiln.tune.apply). Such an
# override that cannot run on its conv is a KilnError naming the decision and the conv (a
# tuning record's, marked "#record", a warning and the rule instead: kiln may have changed).

# The rule, measured (benchmarks/conv_bench.py --convs resnet18|unet256|dbnet320|probe, one
# thread, interleaved with ORT, p10 on the 2-core AVX2 EPYC at load 10-13): Winograd ran
# 1.6-3.4x faster than the direct NCHW conv (the default for dense 3x3 convs) on every 3x3
# stride-1 shape from 16 to 512 channels and 6x6 to 256x256 outputs, 4 tiles and up; it lost
# only with one tile (4x4 output, 256 channels: 0.29 ms vs 0.22 blocked direct), where its 4x
# larger weights stream for one tile's work.
WINOGRAD_MIN_CHANNELS = 16       # the fewest measured (16 -> 16 at 56x56: 0.077 ms vs 0.158)
WINOGRAD_MIN_TILES = 4           # 4x4 output tiles over the batch
WINOGRAD_MIN_TILE_USE = 0.5      # output pixels / pixels the tiles cover (6x6: 0.56, won 1.6x)
# Winograd reads its transformed weights U (36/9 = 4x the direct conv's) once per inference,
# from L3 or memory where a model's weights do not fit the caches, the cores each their share at
# the rate they stream together (`Target.stream_rate_all`, measured per machine: each core at its
# own rate where they do not share one stream); the direct conv's multiply-adds split over the
# cores likewise. So Winograd runs only where U read on all the target's cores takes less than
# the direct conv's multiply-adds at the conv rate on them (`winograd_streams`): 75 output pixels
# or more at this Sapphire Rapids VM's 3.21e3 floats per us a core (its 2 cores measured 5.0e3-
# 5.3e3 together past L3, and 2.3e3-2.9e3 each with both at once against 2.5e3-2.9e3 alone, one
# thread's CPU clock each, load 2-3: they do not share one stream; ResNet-50's convs choose the
# same at any rate down to one core's, DBNet's, U-Net's, YOLOv5s's 10x10 and 8x12 convs turn
# direct at 3.3e3 together). Measured there, 2 threads, quiet, DBNet 320 (three 512 -> 512 3x3 convs on 10x10 at
# batch 1, U 37.7 MB each): with U read at one core's rate they ran direct and the model took
# 44.6 / 36.4 ms (two runs, medians) against 42.9 / 35.4 with Winograd, where 512 -> 512 on 7x7
# (49 pixels) stays direct as before. On the AVX-512 Zen 4 below one core took the memory's whole
# rate: there the cores share one stream, which the all-cores measurement reads.
# Measured, 3x3 512 -> 512 on 7x7 at batch 1 (4 tiles, U 37.7 MB), AVX-512 Zen 4: one thread,
# thread CPU time, Winograd 1.75 ms vs blocked direct 2.19 (the rule: U 1.35 ms < direct 1.93);
# two threads, quiet, Winograd 1.52 vs direct 1.33 (U 1.35 > direct 0.96: its 37.7 MB at
# ~25 GB/s whatever the threads). 256 -> 256 on 14x14 (16 tiles, U 9.4 MB): one thread 1.12
# vs 2.09, and on two the rule keeps Winograd (U 0.34 ms < direct 0.96)
# 1-D convs (3 taps, stride 1, any dilation): F(m, 3), m outputs per tile from m + 2 inputs, m one
# of WINOGRAD_1D_MS: the fewest multiplies, the tiles' thrown-away outputs counted
# (`winograd_1d_m`). One thread, 128 -> 128 channels, 398 samples (benchmarks/conv_bench.py
# --convs conv1d): F(6, 3) 0.194 ms vs F(4, 3) 0.213 undilated, 0.229 vs 0.246 at dilation 16
# (direct: 0.36); its error is hardly larger (kiln.ops.winograd1d)
WINOGRAD_1D_MS = (4, 6)
# The rule, measured: one 1-D Conv+Relu model compiled each way, one thread, thread CPU time p10
# (load ~10): Winograd / direct 0.59-0.85 from 48 to 512 channels with 4 or more tiles (128 ch:
# 398 long 0.59, dilation 16 0.68, 32 long 0.74; 48 ch x 200 0.73; 256 ch x 24 0.74), about
# even at 32 channels (1.00-1.01) and 1.17 at 16; with 3 tiles it lost (128 ch x 16: 1.19,
# 512 ch x 16: 1.13, its weights 2.7x larger than the direct conv's for 3 tiles of work)
# Strided 1-D convs (undilated, r = ceil(K / S) of 2 or 3 taps per input phase) run as stride-1
# ones over S x the channels (kiln.ops.winograd1d), under the same rule with C x S channels:
# measured likewise, 128 ch 8-tap stride 4 x 3199 0.78, 4-tap stride 2 x 798 0.69, 512 ch
# 3-tap stride 2 x 3199 0.67, x 799 0.98, x 199 0.92
WINOGRAD_1D_MIN_CHANNELS = 48
WINOGRAD_1D_MIN_TILES = 4
WINOGRAD_1D_MIN_TILE_USE = 0.5


@dataclass(frozen=True)
class ConvShape:
    """What the chooser reads of one conv (static sizes)."""
    n: int
    c: int
    oc: int
    out: tuple                    # output spatial sizes
    kernel: tuple
    strides: tuple
    dilations: tuple
    group: int
    blockable: bool               # the layout pass can run it blocked (constant float32 weights, ...)
    block: int = 8                # the layout's channel block (the target's float32 lanes)
    narrow: bool = False          # blocked, it would read its few input channels as one block
    blocked_kind: bool = False    # a kind the layout pass blocks when a neighbour is blocked (pointwise,
                                  # depthwise, grouped, strided, 1-D, a stem: kiln.passes.layout_rules._selected_kind)
    kind: str = ""                # which of those kinds, in words
    unblockable: str = ""         # why it is not blockable, in words (when not)
    per_image: bool = False       # the batch is symbolic: `n` is 1, the choice holds for every batch

    def __str__(self) -> str:
        k = "x".join(map(str, self.kernel))
        s = "" if set(self.strides) == {1} else f" s{'x'.join(map(str, self.strides))}"
        d = "" if set(self.dilations) == {1} else f" d{'x'.join(map(str, self.dilations))}"
        g = "" if self.group == 1 else f" g{self.group}"
        n = "N(per image)" if self.per_image else self.n
        return f"{k}{s}{d}{g} {self.c}->{self.oc} out {n}x{'x'.join(map(str, self.out))}"


@dataclass(frozen=True)
class Choice:
    algorithm: str                # "winograd", "direct-nchwc" or "direct-nchw"
    reason: str


def asked(decisions: dict | None = None) -> str | None:
    """The algorithm an override asks for every conv: decisions["conv.algorithm"], else
    $KILN_CONV_ALGO; None when neither does ("auto" or "" in the environment: none)."""
    v = (decisions or {}).get(CONV_ALGORITHM.name)
    if v is None:
        v = os.environ.get(ENV, "").strip() or None
        if v == "auto":
            v = None
    if v is not None and v not in ALGORITHMS:
        raise KilnError(f"illegal value {v!r} for decision {CONV_ALGORITHM.name!r}: it must be "
                        f"{CONV_ALGORITHM.domain}", stage="schedule")
    return v


def winograd_applies(s: ConvShape, target: Target) -> str | None:
    """Why Winograd (F(4x4, 3x3), or F(m, 3) for a 1-D conv) cannot run this conv, or None when it can."""
    if len(s.kernel) == 1:
        (k,), (st,), (d,) = s.kernel, s.strides, s.dilations
        if st == 1 and k != 3:
            return f"kernel {k} (1-D Winograd here is for 3 taps at stride 1)"
        if st > 1 and (d > 1 or -(-k // st) not in (2, 3)):
            return f"kernel {k} stride {st}{' dilated' if d > 1 else ''} (1-D Winograd of a strided conv " \
                   "here is undilated, 2 or 3 taps per input phase)"
    elif len(s.kernel) != 2 or tuple(s.kernel) != (3, 3):
        return f"kernel {'x'.join(map(str, s.kernel))} (Winograd here is for 3x3)"
    elif set(s.strides) != {1} or set(s.dilations) != {1}:
        return "strided or dilated (Winograd here is for stride 1, no dilation)"
    if s.group != 1:
        return "grouped (Winograd here is for dense convs)"
    if not s.blockable or s.narrow:
        return "not blockable in whole channel blocks (Winograd runs on the blocked layout)"
    if s.block % 4:
        return f"a channel block of {s.block} (the kernel's vectors need a multiple of 4)"
    return None


def tile_use(out) -> float:
    """Output pixels over the pixels the 4x4 tiles cover."""
    return math.prod(out) / math.prod(-(-o // 4) * 4 for o in out)


def choose(s: ConvShape, target: Target, override: str | None = None, strict: str | None = None,
           source: str = "a per-conv decision") -> Choice:
    """The algorithm for conv `s` on `target` and why; `override` (one of ALGORITHMS) replaces
    the rule where it can run. `strict`: the conv's name when the override was asked of this
    conv alone (`source`: by whom): one that cannot run is then a KilnError naming it."""
    direct = Choice("direct-nchwc", f"{s.kind or 'pointwise, depthwise, grouped, strided, 1-D or a stem'}: "
                                    "blocked direct conv") if s.blockable and s.blocked_kind \
        else Choice("direct-nchw", "dense KxK direct conv (blocked measured no faster)") if s.blockable \
        else Choice("direct-nchw", f"not blockable: {s.unblockable or 'constant float32 1-D or 2-D weights in whole blocks needed'}")
    how = source if strict is not None else "conv.algorithm / KILN_CONV_ALGO"
    why_not = winograd_applies(s, target) if override != "direct-nchwc" else \
        None if s.blockable else direct.reason
    if why_not is not None and override in ("winograd", "direct-nchwc"):
        if strict is not None:
            raise KilnError(f"illegal value {override!r} for decision {CONV_ALGORITHM.name!r} in conv {strict!r} "
                            f"[{s}]: {why_not}", stage="schedule")
        return Choice(direct.algorithm, f"{direct.reason}; asked for {override}, but {why_not}")
    if override in ("winograd", "direct-nchwc", "direct-nchw"):
        return Choice(override, f"asked for ({how})")
    if why_not is not None:
        return direct
    if override == "direct":
        return Choice(direct.algorithm, f"{direct.reason}; asked for direct ({how})")
    if len(s.kernel) == 1:
        return choose_1d(s, direct)
    tiles = s.n * math.prod(-(-o // 4) for o in s.out)
    if min(s.c, s.oc) < WINOGRAD_MIN_CHANNELS:
        return Choice(direct.algorithm, f"{min(s.c, s.oc)} channels < {WINOGRAD_MIN_CHANNELS}: Winograd's "
                                        "transforms cost more than its GEMMs save")
    if tiles < WINOGRAD_MIN_TILES:
        return Choice(direct.algorithm, f"{tiles} 4x4 tiles < {WINOGRAD_MIN_TILES}: too little work for "
                                        "Winograd's 4x larger weights")
    if tile_use(s.out) < WINOGRAD_MIN_TILE_USE:
        return Choice(direct.algorithm, f"the 4x4 tiles cover {1 / tile_use(s.out):.2f}x the output "
                                        f"(< {WINOGRAD_MIN_TILE_USE} used)")
    streams = winograd_streams(s, target)
    if streams is not None:
        # (blocked: its neighbours' layout, as Winograd's would have been; the neighbour rule
        # still converts it where no neighbour is blocked)
        return Choice("direct-nchwc", streams)
    m = winograd_m(s, target)
    per_image = math.prod(-(-o // m) for o in s.out)
    saved = 9 * math.prod(s.out) / ((m + 2) ** 2 * per_image)
    return Choice("winograd", f"3x3 s1, {min(s.c, s.oc)}+ channels, {s.n * per_image} {m}x{m} tiles: "
                              f"F({m}x{m},3x3), {saved:.1f}x fewer multiplies")


# The output tile: F(4x4, 3x3) does 36 multiplies per 16 outputs (2.25 per output and channel
# pair, 4x fewer than direct) with transformed weights 36/9 = 4x the direct conv's; F(2x2, 3x3)
# 16 per 4 (4 per output, 2.25x fewer) with weights 16/9 = 1.78x. At batch 1 a plane of few
# tiles streams its weights once per inference, so the larger weights cost more than the fewer
# multiplies save: each is timed as its weights read at one core's stream rate
# (`Target.stream_rate`) plus its GEMMs' multiply-adds on that core (the two do not overlap:
# ResNet-50's 256 -> 256 convs on 14x14, F(4x4), took 1.3 ms one thread in the model, their
# 9.4 MB at 12.8 GB/s 0.74 ms and 42 M multiply-adds 0.57), the faster taken (ties: F(4x4)).
# One core, not all the target's: where the cores split the stream as they split the
# multiply-adds the choice is the same, and with the multiply-adds on every core but the stream
# at one core's rate, F(2x2) won where it lost on one thread (one thread, thread CPU time, both
# tiles interleaved in one process, load 5-7, against F(4x4) everywhere: YOLOv5s-style 320
# 29.9 -> 30.4 ms, DBNet 320 67.0 -> 68.9, U-Net 128x192 31.3 -> 33.0, ResNet-50 batch 4 193.9
# -> 196.6; ResNet-50 batch 1, where it wins on one core too, 55.95 -> 55.14).
WINOGRAD_TILE = declare("conv.winograd_m", OneOf((4, 2)), lambda target: 4,
                        "the output tile of a Winograd conv, F(4x4, 3x3) or F(2x2, 3x3) "
                        "(kiln.lower.conv_algo.winograd_m)")


def winograd_us(s: ConvShape, target: Target, m: int) -> float:
    """F(m x m, 3x3)'s estimated microseconds for conv `s` on one core of `target` (see
    WINOGRAD_TILE's note)."""
    from kiln.lower.nnutil import serial_rate  # noqa: PLC0415
    blocks = -(-s.c // s.block) * -(-s.oc // s.block) * s.block * s.block
    npos, tiles = (m + 2) ** 2, s.n * math.prod(-(-o // m) for o in s.out)
    return npos * blocks / target.stream_rate + tiles * npos * blocks / serial_rate("conv", target)


def winograd_m(s: ConvShape, target: Target, decisions: dict | None = None) -> int:
    """The output tile m (4 or 2) of the Winograd conv `s` on `target`: decisions["conv.winograd_m"]
    where given, else the faster by `winograd_us`; 4 for a symbolic batch (`per_image`: at a
    few images F(4x4)'s weights already pay)."""
    v = (decisions or {}).get(WINOGRAD_TILE.name)
    if v is not None:
        if v not in WINOGRAD_TILE.domain:
            raise WINOGRAD_TILE.illegal(v, "the native Winograd kernel computes F(4x4, 3x3) or F(2x2, 3x3)")
        return int(v)
    if s.per_image:
        return 4
    return min((4, 2), key=lambda m: (winograd_us(s, target, m), -m))


def winograd_streams(s: ConvShape, target: Target) -> str | None:
    """Why streaming Winograd's transformed weights would take longer than the direct conv's
    multiply-adds, both on all the target's cores (see WINOGRAD_MIN_TILE_USE's note), or None.
    None for a symbolic batch (`per_image`): the choice then holds for every batch, and at a few
    images Winograd's stream is already shorter (512 -> 512 on 7x7: direct 1.93 ms at two
    images on 2 cores, U 1.35 ms), where direct at batch 1 saves only its 14%."""
    if s.per_image:
        return None
    from kiln.lower.nnutil import serial_rate  # noqa: PLC0415
    blocks = -(-s.c // s.block) * -(-s.oc // s.block) * s.block * s.block
    cores = max(1, target.cores)
    u_us = 36 * blocks / target.stream_rate_all
    direct_us = s.n * math.prod(s.out) * 9 * blocks / (cores * serial_rate("conv", target))
    if u_us <= direct_us:
        return None
    on = f"on {cores} core{'s' if cores > 1 else ''}"
    return (f"Winograd's {36 * blocks * 4 / 1e6:.1f} MB of transformed weights take ~{u_us:.0f} us to stream {on}, "
            f"more than the direct conv's multiply-adds {on} (~{direct_us:.0f} us): blocked direct conv")


@dataclass(frozen=True)
class ConvChoice:
    """A finding of the layout pass: the algorithm chosen for one conv node, and why."""
    node: str
    shape: ConvShape
    choice: Choice
    key: str = ""                 # the conv's workload (`conv_key`): per-conv decisions and records name it
    options: tuple = ()           # the algorithms this conv can take (`legal`): what `kiln tune` searches
    decision = CONV_ALGORITHM.name   # (what kiln.tune.pass_tasks reads of a pass's per-node choice)

    @property
    def value(self) -> str:
        return self.choice.algorithm

    def __str__(self) -> str:
        return f"conv {self.node!r} [{self.shape}]: {self.choice.algorithm} ({self.choice.reason})"


def legal(s: ConvShape, target: Target) -> tuple[str, ...]:
    """The algorithms conv `s` can run by (for a per-conv decision; "direct" is the rule's direct)."""
    return tuple(a for a in ("winograd", "direct-nchwc", "direct-nchw")
                 if (a != "winograd" or winograd_applies(s, target) is None) and (a != "direct-nchwc" or s.blockable))


def conv_key(node, opset: int) -> str:
    """A conv's workload key (kiln.lower.workload.node_key, "conv:" before it)."""
    from kiln.lower.workload import node_key  # noqa: PLC0415
    return node_key(node, opset, "conv:")


def asked_for(decisions: dict | None, key: str) -> tuple[str | None, int | None]:
    """The algorithm a per-conv decision asks of the conv of workload `key`, and the tuning record
    it comes from (None: asked by hand); (None, None) when none is (the global override is
    `asked`'s: it does not make a choice strict)."""
    from kiln.lower.workload import pass_override  # noqa: PLC0415
    return pass_override({k: v for k, v in (decisions or {}).items() if k.startswith("@")}, key, CONV_ALGORITHM)


def tiles_1d(n: int, ow: int, d: int, m: int) -> int:
    """Tiles of 1-D F(m, 3) over n signals of ow outputs at dilation d: m outputs of one phase each."""
    return n * d * (-(-(-(-ow // d)) // m))


def winograd_1d_m(n: int, ow: int, d: int, r: int = 3) -> int:
    """The tile size m of WINOGRAD_1D_MS with the fewest multiplies (tiles x (m + r - 1), r taps
    per phase), ties to the larger."""
    return min(WINOGRAD_1D_MS, key=lambda m: (tiles_1d(n, ow, d, m) * (m + r - 1), -m))


def choose_1d(s: ConvShape, direct: Choice) -> Choice:
    """The rule for a 3-tap stride-1 1-D conv (Winograd can run it): see WINOGRAD_1D_*."""
    (ow,), (d,), (st,), (k,) = s.out, s.dilations, s.strides, s.kernel
    r = -(-k // st)
    m = winograd_1d_m(s.n, ow, d, r)
    tiles = tiles_1d(s.n, ow, d, m)
    use = s.n * ow / (tiles * m)
    chans = min(s.c * st, s.oc)         # a strided conv reduces over its input phases too
    if chans < WINOGRAD_1D_MIN_CHANNELS:
        return Choice(direct.algorithm, f"{chans} channels{' x phases' if st > 1 else ''} < "
                                        f"{WINOGRAD_1D_MIN_CHANNELS}: Winograd's transforms cost more than "
                                        "its GEMMs save")
    if tiles < WINOGRAD_1D_MIN_TILES:
        return Choice(direct.algorithm, f"{tiles} tiles of {m} < {WINOGRAD_1D_MIN_TILES}: too "
                                        "little work for Winograd's larger weights")
    if use < WINOGRAD_1D_MIN_TILE_USE:
        return Choice(direct.algorithm, f"the {m}-output tiles cover {1 / use:.2f}x the output "
                                        f"(< {WINOGRAD_1D_MIN_TILE_USE} used)")
    how = f" (dilation {d}: tiles per phase)" if d > 1 else \
        f" ({st} input phases as channels: {r} taps each)" if st > 1 else ""
    return Choice("winograd", f"{k}-tap s{st}{how}, {chans}+ channels, {tiles} tiles: F({m},{r}), "
                              f"{r * m * use / (m + r - 1):.2f}x fewer multiplies")


# ---------------------------------------------------------------- fused inverted residuals

# An expand 1x1 -> depthwise -> project 1x1 chain (kiln.passes.inverted_residual) runs as one
# kernel (kiln::InvertedResidual) or as its three convs. Fused, the expanded tensor is made a few
# rows at a time and stays in L1/L2; unfused, it goes through memory twice, which costs where it
# does not fit L2 (IR_MIN_L2_SHARE of it: the other tensors and the weights share L2 too).
# The fused kernel's 1x1 tiles end in a clamp; an expand or project activation of IR_ROW_PASS_ACTS
# runs as a second pass over the row after the tile (kiln/codegen/c_src/inverted_residual.c),
# where the unfused convs apply it in registers. That pass costs about as much as the L2
# traffic fusion saves on a tensor that still fits L2, so such blocks fuse only past the whole
# L2 (IR_ROW_PASS_L2_SHARE). Measured one thread, Zen 4 (1 MiB L2 a core), fused / unfused:
# 40->240->80 28x28 s2 (735 KiB expanded) 1.06-1.09 with HardSwish, 0.99 with Clip; 32->192->64
# 28x28 s2 Clip (588 KiB) 0.95-0.96; 24->144->32 56x56 s2 Clip (1.7 MiB) 0.83.
INVERTED_RESIDUAL = declare("conv.inverted_residual", OneOf(("fused", "unfused")), lambda target: "fused",
                            "an expand/depthwise/project chain as one kernel or three "
                            "(kiln.lower.conv_algo.choose_inverted_residual)")
IR_ENV = "KILN_INVERTED_RESIDUAL"
IR_MIN_L2_SHARE = 0.5
IR_ROW_PASS_ACTS = ("hardswish", "swish")
IR_ROW_PASS_L2_SHARE = 1.0
# A tensor that fits still fuses where the rows are long: input rows of at least IR_WIDE_TILES
# of the fused kernel's widest 1x1 tiles (kiln.lower.inverted_residual.MAX_COLUMNS), and output
# rows as long, or the whole batch's expanded tensor past the share of L2 (unfused, it goes
# through L3 then). Sapphire Rapids (2 MiB L2), one thread, in the model's order, fused vs the
# three kernels: 24->72->24 56x56 s1 Relu (1003 KiB expanded) b1 0.244 vs 0.368 ms, b8 2.03 vs
# 4.30; 16->72->24 3x3 s2 on 56x56 (28x28 out) b1 0.204 vs 0.133, b8 0.92 vs 1.25. Narrow rows
# stay unfused: 32->192->32 28x28 1.27 of the three kernels' time warm, and their whole-batch
# fusion at b8 1.055x slower (MobileNetV2). Not for a row-pass activation (not measured).
IR_WIDE_TILES = 4


def asked_inverted_residual(decisions: dict | None = None) -> str | None:
    """"fused" / "unfused" when decisions["conv.inverted_residual"] or $KILN_INVERTED_RESIDUAL
    asks for it, else None (the rule)."""
    v = (decisions or {}).get(INVERTED_RESIDUAL.name) or os.environ.get(IR_ENV, "").strip() or None
    if v == "auto":
        v = None
    if v is not None and v not in INVERTED_RESIDUAL.domain:
        raise KilnError(f"illegal value {v!r} for decision {INVERTED_RESIDUAL.name!r}: it must be "
                        f"{INVERTED_RESIDUAL.domain}", stage="schedule")
    return v


def choose_inverted_residual(expanded_bytes: int, target: Target, override: str | None = None,
                             acts: tuple[str, ...] = (), widths: tuple[int, int] | None = None,
                             batch: int = 1) -> Choice:
    """Fused ("inverted-residual") or not ("unfused"), and why: fused when one image's expanded
    tensor takes more than IR_MIN_L2_SHARE of the target's L2, or IR_ROW_PASS_L2_SHARE when the
    expand or project activation (acts: the three convs' activation names) is one that the
    fused kernel runs as a pass over the row (IR_ROW_PASS_ACTS); else fused where the rows are
    long (widths: the input's and the output's; see IR_WIDE_TILES), else not."""
    if override is not None:
        return Choice("inverted-residual" if override == "fused" else "unfused",
                      f"asked for {override} ({INVERTED_RESIDUAL.name} / {IR_ENV})")
    passes = [a for a in acts[0::2] if a in IR_ROW_PASS_ACTS]
    share = IR_ROW_PASS_L2_SHARE if passes else IR_MIN_L2_SHARE
    budget = share * target.l2_bytes
    kib = expanded_bytes / 1024
    why = f" (a {passes[0]} pass over the row in the fused kernel)" if passes else ""
    if expanded_bytes > budget:
        return Choice("inverted-residual", f"the expanded tensor, {kib:.0f} KiB per image, exceeds "
                                           f"{share} of L2 ({budget / 1024:.0f} KiB){why}: made a few "
                                           "rows at a time in one kernel")
    from kiln.lower.inverted_residual import MAX_COLUMNS  # noqa: PLC0415 (the kernel's module: not at the passes' import)
    wide = IR_WIDE_TILES * MAX_COLUMNS
    long_rows = widths is not None and widths[0] >= wide and (widths[1] >= wide or batch * expanded_bytes > budget)
    if long_rows and not passes:
        return Choice("inverted-residual", f"the expanded tensor, {kib:.0f} KiB per image, fits {share} of L2, but "
                                           f"rows of {widths[0]} -> {widths[1]} columns" +
                                           (f" (at least {wide})" if widths[1] >= wide else
                                            f" and {batch} images' {batch * kib:.0f} KiB") +
                                           ": made a few rows at a time in one kernel")
    return Choice("unfused", f"the expanded tensor, {kib:.0f} KiB per image, fits {share} of L2 "
                             f"({budget / 1024:.0f} KiB){why}: three kernels")


def choose_expand_depthwise(expanded_bytes: int, strided: bool, target: Target, override: str | None = None,
                            acts: tuple[str, ...] = (), widths: tuple[int, int] | None = None,
                            batch: int = 1) -> Choice:
    """An expand 1x1 -> depthwise chain whose project conv cannot join it (kiln::ExpandDepthwise):
    choose_inverted_residual's rule for a strided depthwise conv; a stride-1 one stays unfused
    (its result, written whole either way, is as large as the expanded tensor, so fusion saves
    less, and the fused kernel's 1x1 tiles are a little slower than ConvNCHWc's). Measured one
    thread, EfficientNet-B0 at batch 4 (Zen 4), fused / unfused, with the gate's pool:
    16->96 3x3 s2 on 112x112 0.80, 24->144 5x5 s2 on 56x56 0.83, 24->144 3x3 s1 on 56x56 1.04."""
    if override is None and not strided:
        return Choice("unfused", "a stride-1 depthwise result is as large as the expanded tensor: three kernels")
    return choose_inverted_residual(expanded_bytes, target, override, acts, widths, batch)
