"""The `kiln` command: compile, run, bench and inspect models from the shell.

Built on click (arguments, help) and rich (tables; progress on stderr). Results
go to stdout, progress and errors to stderr. A KilnError prints one message
(`error: ...`) and exits 1 without a traceback; `kiln --debug ...` (or
KILN_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

import kiln
from kiln.errors import KilnError
from kiln.names import escape

TARGETS = ("cpu", "interpreter")
from kiln.compiler import STAGES  # noqa: E402

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class _Debug:
    on = False


# ---------------------------------------------------------------- shared options

def _pairs(ctx, param, values) -> dict[str, str]:
    """NAME=VALUE options (repeatable) → {NAME: VALUE}."""
    pairs = {}
    for v in values:
        name, eq, value = v.partition("=")
        if not eq or not name or not value:
            raise click.BadParameter(f"expected NAME=VALUE, got {v!r}")
        if name in pairs:  # (an artifact holds one specialisation: no --dim batch=1 --dim batch=8)
            raise click.BadParameter(f"{name!r} given twice ({pairs[name]} and {value})")
        pairs[name] = value
    return pairs


def _dims(ctx, param, values) -> dict[str, int]:
    dims = {}
    for name, value in _pairs(ctx, param, values).items():
        if not value.isdigit() or int(value) < 1:
            raise click.BadParameter(f"size of {name!r} must be a positive integer, got {value!r}")
        dims[name] = int(value)
    return dims


def dim_option(f):
    return click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", callback=_dims,
                        help="Size of a symbolic dim, e.g. --dim batch=1 (repeatable).")(f)


def _decisions(ctx, param, values) -> dict:
    """--decision NAME=VALUE (every kernel) or KERNEL:NAME=VALUE (one kernel) → kiln.compile's
    `decisions`; VALUE is an integer, true/false, or else a string."""
    out: dict = {}
    for key, text in _pairs(ctx, param, values).items():
        value = int(text) if text.lstrip("-").isdigit() else {"true": True, "false": False}.get(text, text)
        kernel, colon, name = key.rpartition(":")
        if colon:
            out.setdefault(kernel, {})[name] = value
        else:
            out[name] = value
    return out


def decision_option(f):
    return click.option("--decision", "decisions", multiple=True, metavar="[KERNEL:]NAME=VALUE",
                        callback=_decisions,
                        help="Override a schedule decision (kiln.lower.decisions) for every kernel, or "
                             "for one kernel (k3_Conv:fork_gain=0); repeatable.")(f)


def target_option(f):
    return click.option("--target", "-t", type=click.Choice(TARGETS), default=None,
                        help="Where the code runs (default: cpu).")(f)


def cpu_option(f):
    from kiln.targets.target import NAMED
    return click.option("--cpu", type=click.Choice(["host", *NAMED]), default=None, metavar="NAME",
                        help="The CPU to generate code for (default: host, this machine): a name GCC's "
                             "-march knows, e.g. x86-64-v3 (any AVX2 machine), x86-64-v4, znver4, "
                             f"sapphirerapids. One of: host, {', '.join(NAMED)}.")(f)


def opt_option(f):
    return click.option("-O", "opt_level", type=click.IntRange(0, 3), default=None, metavar="0..3",
                        help="Graph optimization level, -O0 to -O3 "
                             "(default -O3, the fastest; lower levels are for debugging).")(f)


# ---------------------------------------------------------------- helpers

@contextmanager
def progress(what: str):
    """A spinner on stderr while `what` runs, then one line saying how long it took."""
    t = time.perf_counter()
    with err.status(what + " ..."):
        yield
    err.print(Text(f"{what}: {time.perf_counter() - t:.2f} s", style="dim"))


def load_graph(path: str):
    if not Path(path).is_file():  # before importing the frontend: a typo fails at once
        raise KilnError(f"model file not found: {path}")
    with progress(f"importing {path}"):
        return kiln.load_onnx(path)


def compile_graph(graph, target: str | None, opt_level: int | None, cpu: str | None = None,
                  decisions: dict | None = None):
    options = {} if opt_level is None else {"opt_level": opt_level}
    if decisions:
        options["decisions"] = decisions
    if cpu is not None:
        options["cpu"] = cpu
    target = target or "cpu"
    with progress(f"compiling {len(graph.nodes)} nodes for {target}" + (f" ({cpu})" if cpu else "")):
        return kiln.compile(graph, target=target, **options)


FORMATS = {".onnx": "onnx", ".kiln": "kiln"}


def format_option(f):
    return click.option("--format", "fmt", type=click.Choice(sorted(set(FORMATS.values()))),
                        help="What MODEL is: an ONNX model or a kiln artifact (default: from its "
                             "extension, .onnx or .kiln; never from its content).")(f)


def model_format(path: str, fmt: str | None) -> str:
    """What the user asked for: --format, else the file's extension. Never the content: a
    file can be a valid ONNX model and a zip at once, and an artifact runs native code."""
    if fmt:
        return fmt
    found = FORMATS.get(Path(path).suffix.lower())
    if found is None:
        raise KilnError(f"cannot tell from its name whether {path} is an ONNX model or a kiln artifact: "
                        "name it .onnx or .kiln, or pass --format onnx|kiln")
    return found


def load_model(path: str, target: str | None, opt_level: int | None, fmt: str | None = None):
    """A runnable model from an ONNX file (compiled here) or a .kiln artifact (loaded)."""
    if model_format(path, fmt) == "kiln":
        if target is not None or opt_level is not None:
            raise KilnError(f"{path} is a compiled artifact; --target and -O apply to ONNX models")
        return kiln.load(path)
    return compile_graph(load_graph(path), target, opt_level)


def cells(*values) -> list[Text]:
    """Table cells as plain text (a tensor name like 'x[0]' is not rich markup), control
    characters escaped (a model's names are untrusted: no raw terminal escapes)."""
    return [Text(escape(v)) for v in values]


def table(title: str, columns: list[str], rows: list[list]) -> Table:
    t = Table(title=Text(escape(title)), title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")  # hashes and node names wrap, never get cut
    for r in rows:
        t.add_row(*cells(*r))
    return t


def stage_table(cold, warm) -> Table:
    """Compile time per pipeline stage (kiln.timing.StageTimes), cold and warm, wall and CPU ms."""
    names = cold.stages() + [s for s in warm.stages() if s not in cold.wall]
    ms = lambda d, s: f"{d[s] * 1e3:.1f}" if s in d else "-"  # noqa: E731
    rows = [[s, ms(cold.wall, s), ms(cold.cpu, s), ms(warm.wall, s), ms(warm.cpu, s)] for s in names]
    rows.append(["(all stages)", f"{cold.total_wall * 1e3:.1f}", f"{sum(cold.cpu.values()) * 1e3:.1f}",
                 f"{warm.total_wall * 1e3:.1f}", f"{sum(warm.cpu.values()) * 1e3:.1f}"])
    return table("compile time per stage (cpu: this process and the C compilers it ran)",
                 ["stage", "cold wall ms", "cold cpu ms", "warm wall ms", "warm cpu ms"], rows)


def kv_table(title: str, rows: list[list]) -> Table:
    """A two-column key/value table without a header row."""
    t = table(title, ["", ""], rows)
    t.show_header = False
    return t


def fmt_shape(shape) -> str:
    return "*" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def io_table(title: str, specs) -> Table:
    return table(title, ["name", "dtype", "shape"],
                 [[s.name, s.dtype if s.kind == "tensor" else f"{s.kind}<{s.dtype}>", fmt_shape(s.shape)]
                  for s in specs])


# ---------------------------------------------------------------- the command group

def _size(ctx, param, value):
    from kiln.limits import parse_size
    if value is None:
        return None
    try:
        return parse_size(value, param.opts[0])
    except KilnError as e:
        raise click.BadParameter(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="KILN_DEBUG", help="On an error, show the full traceback.")
@click.option("--max-memory", metavar="SIZE", callback=_size,
              help="Memory one compiled model may plan or one tensor may take, e.g. 8G "
                   "(default: half the RAM; env KILN_MAX_MEMORY).")
@click.option("--max-constant", metavar="SIZE", callback=_size,
              help="Bytes of one constant (default: a quarter of the RAM; env KILN_MAX_CONSTANT).")
@click.option("--max-trip-count", metavar="N", callback=_size,
              help="Iterations of one Loop or Scan (default: 10000000; env KILN_MAX_TRIP_COUNT).")
@click.version_option(kiln.__version__, prog_name="kiln")
def cli(debug: bool, max_memory, max_constant, max_trip_count):
    """kiln: compile ONNX models to native code, run, benchmark and inspect them."""
    from kiln import limits
    _Debug.on = debug
    given = {k: v for k, v in (("max_memory_bytes", max_memory), ("max_constant_bytes", max_constant),
                               ("max_trip_count", max_trip_count)) if v is not None}
    limits.set_default(given or None)


@cli.command("compile")
@click.argument("model")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Artifact to write (default: MODEL's name with .kiln, unless --emit is given).")
@target_option
@cpu_option
@opt_option
@dim_option
@decision_option
@click.option("--emit", type=click.Choice(STAGES),
              help="Print a stage: the imported graph, the optimized graph, its fusion groups, the loop IR "
                   "or the C source.")
@click.option("--emit-to", type=click.Path(dir_okay=False),
              help="Write the --emit text to this file (full text; printed text elides weights).")
@click.option("--name", metavar="NAME",
              help="The artifact's C name: its library's symbols and header macros start with it "
                   "(NAME_run, NAME_WEIGHTS_BYTES; default: MODEL's file name made a C identifier).")
def compile_cmd(model, output, target, cpu, opt_level, dims, decisions, emit, emit_to, name):
    """Compile MODEL (.onnx) into a deployable .kiln artifact, or show one of its stages.

    The artifact is a zip holding the native library, its C header and source,
    the weights and a JSON manifest; `kiln run` and `kiln.load` run it. It holds one
    specialisation: symbolic dims need --dim NAME=SIZE. It runs on CPUs with the
    features of --cpu (default: this machine's); the manifest records which.
    """
    from kiln.stages import stage_text
    if emit_to and not emit:
        raise click.UsageError("--emit-to needs --emit STAGE")
    if output is None and emit is None:
        output = Path(model).stem + ".kiln"
    if output is not None:
        from kiln.export import symbol_prefix
        symbol_prefix(name)  # a bad --name fails before the compile, not after
    graph = load_graph(model)
    if emit is not None:
        with progress(f"making the {emit} stage"):
            text = stage_text(graph, emit, dims, target=target or "cpu", opt_level=opt_level, cpu=cpu,
                              decisions=decisions)
        show(text, emit_to)
    if output is not None:
        compiled = compile_graph(graph, target, opt_level, cpu, decisions)
        from kiln.export import save
        with progress(f"writing {output}"):
            manifest = save(compiled, output, dims=dims, source=model, name=name)
        size = Path(output).stat().st_size
        n = len(manifest["kernels"])
        click.echo(f"wrote {output} ({fmt_bytes(size)}): {n} kernel{'s' * (n != 1)}, "
                       f"weights {fmt_bytes(manifest['weights_bytes'])}, "
                       f"workspace {fmt_bytes(manifest['workspace_bytes'])}; C entry {manifest['entry']}")


def show(text: str, path: str | None) -> None:
    """Write `text` to `path`, or print it with weight data elided."""
    if path:
        Path(path).write_text(text)
        err.print(Text(f"wrote {path}", style="dim"))
    else:
        click.echo(elide_weights(text), nl=not text.endswith("\n"))


def elide_weights(text: str) -> str:
    """Graph text with each long base64 tensor payload replaced by its size."""
    def size(m):
        b64 = m.group(1)
        return f'("<{len(b64) * 3 // 4 - b64.count("=")} bytes>")'
    return re.sub(r'\("([A-Za-z0-9+/=]{65,})"\)', size, text)


@cli.command()
@click.argument("model", metavar="MODEL|ARTIFACT")
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy", callback=_pairs,
              help="An input from a .npy file (repeatable).")
@click.option("--random", "random_", is_flag=True, help="Make seeded random values for inputs not given.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random.")
@dim_option
@target_option
@opt_option
@click.option("--output-dir", "-d", type=click.Path(file_okay=False),
              help="Save each output there as NAME.npy.")
@format_option
def run(model, inputs, random_, seed, dims, target, opt_level, output_dir, fmt):
    """Run MODEL (.onnx, compiled first) or a .kiln artifact once and summarise its outputs."""
    from kiln.runtime.inputs import random_inputs
    if dims and not random_:
        raise click.UsageError("--dim sizes the --random inputs; with --input files the shapes are theirs")
    m = load_model(model, target, opt_level, fmt)
    feeds = read_inputs(m, inputs)
    if random_:
        feeds = random_inputs(m.inputs, dims, seed, given=feeds)
    missing = [s.name for s in m.inputs if s.name not in feeds]
    if missing:
        raise KilnError(f"no value for input(s) {missing}: give --input NAME=FILE.npy or --random")
    t = time.perf_counter()
    outs = m.run(feeds)
    ms = (time.perf_counter() - t) * 1e3
    out.print(table(f"outputs (target {m.target}, first run {ms:.2f} ms)",
                    ["name", "dtype", "shape", "min", "max", "mean", "first values"],
                    [[name, *summary(x)] for name, x in outs.items()]))
    if output_dir:
        for path in save_outputs(outs, Path(output_dir)):
            err.print(Text(f"wrote {path}", style="dim"))


def read_inputs(model, inputs: dict[str, str]) -> dict[str, np.ndarray]:
    names = [s.name for s in model.inputs]
    unknown = [n for n in inputs if n not in names]
    if unknown:
        raise KilnError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
    feeds = {}
    for name, path in inputs.items():
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise KilnError(f"--input {name}: file not found: {path}") from None
        except (OSError, ValueError) as e:
            raise KilnError(f"--input {name}: {path} is not a .npy array ({e})") from None
        if not isinstance(feeds[name], np.ndarray):
            raise KilnError(f"--input {name}: {path} is an .npz archive; give one .npy array")
    return feeds


def summary(x) -> list[str]:
    """dtype, shape, min, max, mean and the first values of an output."""
    if isinstance(x, list):
        return ["sequence", f"{len(x)} tensors", "", "", "", ""]
    if x is None:
        return ["none", "", "", "", "", ""]
    x = np.asarray(x)
    first = " ".join(f"{v:.4g}" if x.dtype.kind == "f" else str(v) for v in x.reshape(-1)[:4])
    first += " ..." if x.size > 4 else ""
    if x.size and x.dtype.kind in "fiub":
        v = x.astype(np.float64)
        return [str(x.dtype), fmt_shape(x.shape), f"{v.min():.4g}", f"{v.max():.4g}", f"{v.mean():.4g}", first]
    return [str(x.dtype), fmt_shape(x.shape), "", "", "", first]


def save_outputs(outs: dict, folder: Path) -> list[Path]:
    """NAME.npy per output (NAME.k.npy per element of a sequence), never pickled."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, x in outs.items():
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        items = [(f"{stem}.{k}", e) for k, e in enumerate(x)] if isinstance(x, list) else [(stem, x)]
        for s, e in items:
            if e is None:
                continue
            e = np.asarray(e)
            path = folder / f"{s}.npy"
            np.save(path, e.astype(str) if e.dtype == object else e, allow_pickle=False)
            written.append(path)
    return written


@cli.command()
@click.argument("model")
@click.option("--against", default=None, metavar="PEERS",
              help="Comma-separated peers to time alongside: ort, torch (or 'none'); for a .py "
                   "torch model: torch, inductor, openvino. Default: ort (torch for a .py file).")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Threads for kiln (OpenMP) and every peer (default: all cores).")
@click.option("--runs", type=click.IntRange(1), default=50, show_default=True, help="Timed runs per engine.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--profile", type=click.IntRange(0), default=0, metavar="N",
              help="Also time kiln's kernels one by one and list the N slowest.")
@target_option
@opt_option
@dim_option
def bench(model, against, threads, runs, seed, profile, target, opt_level, dims):
    """Time MODEL (.onnx, or a .py file defining a torch `model` and `example_inputs`) compiled
    by kiln against peers, interleaved in one process.

    Reports median, p10 and p90 latency, each peer's ratio to kiln, kiln's cold
    (empty cache) and warm (cached) compile time, and kiln's error against each
    peer. The torch peer (eager PyTorch running kiln's imported graph) needs the
    torch extra: pip install -e ".[torch]".
    """
    from kiln.bench import bench_model
    is_torch = model.endswith(".py")
    against = against or ("torch" if is_torch else "ort")
    peers = [] if against == "none" else [p.strip() for p in against.split(",") if p.strip()]
    options = {} if opt_level is None else {"opt_level": opt_level}
    if is_torch:
        from kiln.bench_torch import bench_torch_file
        res = bench_torch_file(model, peers=peers, threads=threads, runs=runs, target=target or "cpu",
                               options=options, step=progress)
    else:
        res = bench_model(model, peers=peers, threads=threads, runs=runs, seed=seed, target=target or "cpu",
                          dims=dims, options=options, step=progress, profile=profile > 0)
    for p, why in res.skipped.items():
        err.print(Text(f"{p} skipped: {why}", style="yellow"))
    click.echo(f"{Path(model).name}: target {res.target}, {res.threads} threads, {runs} runs each")
    out.print(table("latency", ["engine", "median ms", "p10 ms", "p90 ms"],
                    [[k, f"{r['median_ms']:.3f}", f"{r['p10_ms']:.3f}", f"{r['p90_ms']:.3f}"]
                     for k, r in res.times.items()]))
    kiln_ms = res.times["kiln"]["median_ms"]
    for p, r in res.times.items():
        if p != "kiln":
            ratio = kiln_ms / r["median_ms"]
            how = f"{ratio:.2f}x slower than" if ratio > 1 else f"{1 / ratio:.2f}x faster than"
            click.echo(f"kiln is {how} {p} (median, kiln/{p} = {ratio:.3f})")
    click.echo(f"kiln compile (and first run): cold {res.cold_s:.2f} s (empty cache), "
                   f"warm {res.warm_s:.2f} s (cached)")
    if res.cold_stages is not None:
        out.print(stage_table(res.cold_stages, res.warm_stages))
    for p, c in res.checks.items():
        click.echo(f"kiln vs {p}: max abs error {c['max_abs']:.2e}, max rel {c['max_rel']:.2e} "
                   f"-> {'agree' if c['ok'] else 'DISAGREE'}")
    if res.kernels:
        total = sum(t for _, t in res.kernels)
        top = sorted(enumerate(res.kernels), key=lambda kt: -kt[1][1])[:profile]
        out.print(table(f"kernels: {len(res.kernels)} calls, {total * 1e3:.3f} ms called one by one",
                        ["call", "ms", "%", "computes"],
                        [[str(k), f"{t * 1e3:.3f}", f"{100 * t / total:.1f}", what]
                         for k, (what, t) in top]))
    bad = [p + (f" ({c['why']})" if "why" in c else "") for p, c in res.checks.items() if not c["ok"]]
    if bad:
        raise KilnError(f"kiln's outputs disagree with {', '.join(bad)}")


@cli.command()
@click.argument("model", metavar="MODEL|ARTIFACT")
@target_option
@opt_option
@dim_option
@click.option("--compile/--no-compile", "do_compile", default=True, show_default=True,
              help="Also compile for cpu and report the kernels and memory.")
@format_option
def inspect(model, target, opt_level, dims, do_compile, fmt):
    """Describe MODEL (.onnx) or a .kiln artifact: opsets, inputs and outputs, ops, what is
    unsupported (every node at once), parameters, and the compiled kernels and memory."""
    from kiln import describe
    from kiln.runtime.artifact import read_manifest
    from kiln.runtime.inputs import symbols
    if model_format(model, fmt) == "kiln":
        return show_manifest(model, read_manifest(model))
    facts = describe.model_facts(model)
    show_facts(facts)
    if facts.unsupported:
        return
    graph, ins, outs = describe.io_specs(model)
    out.print(io_table("inputs", ins), io_table("outputs", outs))
    if (target or "cpu") != "cpu" or not do_compile or facts.no_lowering:
        return
    free = [d for d in symbols(ins) if d not in dims]
    if free:
        click.echo(f"symbolic dims {free}: give --dim NAME=SIZE to compile and see the kernels")
        return
    with progress(f"compiling {len(graph.nodes)} nodes for cpu"):
        show_kernels(describe.kernel_report(graph, opt_level, dims))


@cli.command()
@click.option("--seed", type=int, default=0, show_default=True, help="First seed.")
@click.option("--count", "-n", type=click.IntRange(1), default=300, show_default=True,
              help="Number of generated graphs (seeds seed .. seed+count-1).")
@click.option("--levels-per-graph", type=click.IntRange(1, 4), default=4, show_default=True,
              help="-O levels compiled per graph, rotating with the seed (all 4 covered when < 4).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="fuzz-regressions",
              show_default=True, help="Where shrunk failing graphs are saved (.onnx + .npz inputs).")
@click.option("--time-budget", type=float, default=None, metavar="SECONDS",
              help="Stop starting new graphs after this long.")
@click.option("--workers", "-j", type=click.IntRange(0), default=0, help="Worker processes (0: one per core).")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds one graph may take (all its levels) before it counts as a hang.")
@click.option("--ort/--no-ort", "use_ort", default=True, show_default=True,
              help="Also compare with ONNX Runtime where it accepts the graph.")
@click.option("--shrink/--no-shrink", "do_shrink", default=True, show_default=True,
              help="Shrink each distinct failure to a minimal graph and save it.")
def fuzz(seed, count, levels_per_graph, out_dir, time_budget, workers, timeout, use_ort, do_shrink):
    """Differential fuzzing: random valid ONNX graphs compiled for cpu at -O levels, compared
    with the interpreter and ONNX Runtime; each distinct failure shrunk and saved.

    Exits with status 1 when anything failed. Replay a saved file with
    `python -m pytest tests/regressions -k fuzz` after copying it to tests/regressions/fuzz/.
    """
    from kiln.testing.fuzz import fuzz as run_fuzz
    done = [0]

    def on_result(s, found):
        done[0] += 1
        for f in found:
            err.print(Text(f"seed {s}: {f}"[:400], style="red"))
        if done[0] % 100 == 0:
            err.print(Text(f"{done[0]} graphs checked", style="dim"))
    with err.status("fuzzing ..."):
        rep = run_fuzz(range(seed, seed + count), levels_per_graph=levels_per_graph, workers=workers,
                       use_ort=use_ort, timeout=timeout, time_budget=time_budget, out_dir=out_dir,
                       do_shrink=do_shrink, on_result=on_result, log=lambda m: err.print(Text(m, style="dim")))
    c = rep.campaign
    levels = ", ".join(f"-O{k}: {v}" for k, v in sorted(c.levels_run.items()))
    click.echo(f"{c.cases} graphs in {c.seconds:.1f} s ({levels}); {len(c.findings)} failed, "
               f"{len(rep.classes)} distinct failure(s)")
    for bc in rep.classes:
        click.echo(f"{len(bc.seeds)} graph(s) (seeds {' '.join(map(str, bc.seeds[:8]))}"
                   f"{' ...' if len(bc.seeds) > 8 else ''}): {bc.example}")
        if bc.saved:
            click.echo(f"    shrunk to {bc.nodes} node(s): {bc.saved}")
    if rep.classes:
        sys.exit(1)


def show_facts(facts) -> None:
    """What is known without type inference: the file, ops, parameters, what kiln lacks."""
    from kiln.describe import declared_specs

    def op_name(d, op):
        return f"{d}::{op}" if d else op
    out.print(kv_table(f"{facts.file} ({fmt_bytes(facts.bytes)})", [
        ["ir version", facts.ir_version], ["producer", facts.producer or "-"],
        ["opsets", ", ".join(f"{d} {v}" for d, v in facts.opsets.items())],
        ["nodes", sum(facts.ops.values())],
        ["parameters", f"{facts.parameters:,} ({fmt_bytes(facts.parameter_bytes)})"]]))
    unlowered = {op_name(d, op) for d, op, _ in facts.no_lowering}
    out.print(table("ops", ["op", "nodes", "cpu lowering"],
                    [[op, n, "no" if op in unlowered else "yes"] for op, n in facts.ops.most_common()]))
    if facts.unsupported:
        out.print(table(f"unsupported: {len(facts.unsupported)} node(s) kiln has no definition for",
                        ["op", "opset", "node"],
                        [[op_name(d, op), v, name] for d, op, name, v in facts.unsupported]))
        ins, outs = declared_specs(facts.graph)
        out.print(io_table("inputs (declared)", ins), io_table("outputs (declared)", outs))
    elif facts.no_lowering:
        out.print(table(f"target cpu cannot compile {len(facts.no_lowering)} node(s) yet (no lowering)",
                        ["op", "node"], [[op_name(d, op), name] for d, op, name in facts.no_lowering]))


def show_kernels(rep) -> None:
    """The native module the model compiled to: kernels, fusion, memory, kiln's compile report."""
    out.print(kv_table("compiled for cpu", [
        ["input shapes", ", ".join(map(fmt_shape, rep.shapes))],
        ["kernels", len(rep.kernels)], ["fused kernels", len(rep.fused)],
        ["weights", fmt_bytes(rep.weights_bytes)], ["workspace arena", fmt_bytes(rep.workspace_bytes)]]))
    if rep.fused:
        out.print(table("fused kernels", ["kernel", "nodes"],
                        [[k, desc] for k, desc in enumerate(rep.kernels) if desc in rep.fused]))
    if rep.report is not None:
        click.echo(str(rep.report))


def show_manifest(path: str, m: dict) -> None:
    """`kiln inspect` of an artifact: its manifest, readably."""
    from kiln.runtime.artifact import file_sha256
    t = m["target"]
    out.print(kv_table(f"{path} (kiln artifact v{m['format_version']}: native code, run only if you trust "
                       "its source)", [
        ["members", "each matches its SHA256SUMS line"],
        ["made by", f"kiln {m['kiln_version']}"],
        ["source", m["source"].get("file") or "-"], ["source sha256", m["source"].get("sha256") or "-"],
        ["target", f"{t['name']} {t.get('cpu', '')} {t['arch']} ({t['cflags']})"],
        ["needs cpu features", " ".join(t["features"]) or "-"],
        ["entry", m["entry"]], ["kernels", len(m["kernels"])],
        ["weights", fmt_bytes(m["weights_bytes"])], ["workspace arena", fmt_bytes(m["workspace_bytes"])]]))
    for title, ports in (("inputs", m["inputs"]), ("outputs", m["outputs"])):
        out.print(table(title, ["name", "dtype", "shape"],
                        [[p["name"], p["dtype"], fmt_shape(p["shape"])] for p in ports]))
    # as `sha256sum` prints it, to compare with the hash its publisher gives
    click.echo(f"sha256 {file_sha256(path)}  {path}")


@cli.command("fuzz-mutate")
@click.option("--models", type=click.IntRange(0), default=200, show_default=True, help="Mutated models to run.")
@click.option("--artifacts", type=click.IntRange(0), default=0, show_default=True,
              help="Mutated .kiln artifacts to run.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the mutations.")
@click.option("--corpus", type=click.Choice(["builtin", "onnx", "generated", "all"]), default="builtin",
              show_default=True, help="Seed models: kiln's small built-in set, the ONNX backend node tests, "
                                      "the differential fuzzer's random graphs, or all three.")
@click.option("--hours", type=float, default=None,
              help="Long mode: repeat rounds (new seeds) of --models/--artifacts for this long.")
@click.option("--jobs", "-j", type=click.IntRange(1), default=2, show_default=True, help="Sandboxes at once.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds per case.")
@click.option("--memory", metavar="SIZE", default="4G", show_default=True, help="RLIMIT_AS of each sandbox.")
@click.option("--out", type=click.Path(file_okay=False), help="Save failing cases here (with failures.jsonl).")
def fuzz_mutate(models, artifacts, seed, corpus, hours, jobs, timeout, memory, out):
    """Mutate valid models and artifacts and run each in a sandbox (time and memory limits).

    Every case must end ok or with a KilnError; an other exception, a crash or a hang
    fails (exit status 1). See kiln/testing/mutate.py for the mutations.
    """
    from kiln.limits import parse_size
    from kiln.testing.mutate import Report, run_campaign
    total, end, rnd = Report(), (time.time() + hours * 3600 if hours else None), 0
    while True:
        with err.status(f"round {rnd} (seed {seed + rnd})") as status:
            rep = run_campaign(models, artifacts, seed + rnd, corpus=corpus, jobs=jobs, timeout_s=timeout,
                               memory_bytes=parse_size(memory, "--memory"), out=out,
                               progress=lambda i, n: status.update(f"round {rnd}: case {i}/{n}"))
        total.counts.update(rep.counts)
        total.wrapped.update(rep.wrapped)
        total.failures += rep.failures
        total.seconds += rep.seconds
        rnd += 1
        if end is None or time.time() >= end:
            break
        err.print(Text(str(rep).splitlines()[0], style="dim"))
    click.echo(escape(str(total), keep=chr(10)))
    if total.failures:
        raise KilnError(f"{len(total.failures)} case(s) ended neither ok nor in a KilnError"
                        + (f"; saved in {out}" if out else ""))


# ---------------------------------------------------------------- entry point

# ---------------------------------------------------------------- tune

def _duration(ctx, param, value) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", value or "")
    if not m or float(m.group(1)) <= 0:
        raise click.BadParameter(f"expected a duration such as 90s, 10m or 1h, got {value!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@cli.command("tune")
@click.argument("model")
@click.option("--budget", default="10m", show_default=True, callback=_duration, metavar="DURATION",
              help="Tuning time, e.g. 90s, 10m, 1h (spread over the tasks by their weight).")
@click.option("--db", "db_path", default="tuning.db", show_default=True, type=click.Path(dir_okay=False),
              help="The records database (created; an existing one is resumed and added to).")
@click.option("--trials-per-round", type=click.IntRange(1), default=8, show_default=True,
              help="Candidates measured per round of search.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds a candidate may run before its measurement is abandoned.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the search.")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: time candidates on the model's threads (a quiet machine); cpu: on one thread by "
                   "thread CPU time, for a loaded machine (thread decisions keep their defaults).")
@click.option("--end-to-end/--no-end-to-end", default=True, show_default=True,
              help="Time the whole model untuned and tuned at the end.")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Measure on a Ray cluster: auto (the running one), ADDRESS, or local (start one here); pip install 'kiln[ray]'.")
@dim_option
def tune(model, budget, db_path, trials_per_round, timeout, seed, clock, end_to_end, ray_address, dims):
    """Search MODEL's schedules on this machine for --budget; keep the best in --db.

    Interrupt with Ctrl-C at any time and run the same command again: it goes on from
    the records. Then `kiln.compile(model, tuning=DB)` or KILN_TUNING_DB=DB uses them.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415
    from kiln.tuning import tune_model  # noqa: PLC0415
    if not Path(model).is_file():
        raise KilnError(f"model file not found: {model}")
    measurer = None
    if ray_address:
        from kiln.tune.distributed import RayMeasurer  # noqa: PLC0415
        measurer = RayMeasurer(ray_address, timeout=timeout, clock=clock)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=err,
                   transient=False)
    tid = bar.add_task("extracting tasks", total=budget)

    def on_progress(rep, elapsed):
        live = [s for s in rep.tasks if s.default_s]
        trials = sum(s.trials for s in rep.tasks)
        best = max(live, key=lambda s: s.speedup, default=None)
        bar.update(tid, completed=min(elapsed, budget), description=(
            f"{len(rep.tasks)} tasks, {trials} trials, best task x{best.speedup if best else 1:.2f}, "
            f"est. end-to-end x{rep.estimated_speedup:.2f}"))
    with bar:
        rep = tune_model(model, db_path, budget, dims=dims, trials_per_round=trials_per_round, timeout=timeout,
                       seed=seed, end_to_end=end_to_end, on_progress=on_progress, measurer=measurer, clock=clock)
    notes = any(s.note for s in rep.tasks)
    rows = [[s.task.key[:8], s.task.description.split(" (")[0], str(s.task.weight),
             f"{s.default_s * 1e6:.1f}" if s.default_s else "-", f"{s.best_s * 1e6:.1f}" if s.best_s else "-",
             f"x{s.speedup:.2f}", str(s.trials), str(s.failures), *([s.note] if notes else [])] for s in rep.tasks]
    out.print(table(f"kiln tune: {len(rep.tasks)} tasks, {rep.seconds:.0f} s, machine {rep.signature}",
                    ["task", "kernel", "x", "default us", "best us", "speedup", "trials", "failed",
                     *(["note"] if notes else [])], rows))
    if rep.passes:   # the graph passes' decisions, timed on the whole model (kiln.tune.pass_tasks)
        prow = [[t.key[:13], t.decision, t.description, str(t.weight), str(t.default),
                 ", ".join(f"{a} {s * 1e3:.3f}" for a, s in sorted(t.seconds.items(), key=lambda kv: kv[1])) or "-",
                 "; ".join(f"{a}: {e}" for a, e in t.errors.items())] for t in rep.passes]
        out.print(table("graph pass decisions (model ms with each value, against the rule's)",
                        ["node", "decision", "shape", "x", "rule", "measured", "failed"], prow))
    summary = [["estimated end-to-end (kernel times x weights)", f"x{rep.estimated_speedup:.2f}"],
               ["cost model", f"Kendall tau {rep.mean_tau:.2f} on held-out batches ({len(rep.taus)} rounds)"]]
    if rep.stale_records:   # this machine's records of other kernel code: not applied (kiln.tune.version)
        from kiln.tune.version import stale_reason  # noqa: PLC0415
        summary.append([f"{sum(rep.stale_records.values())} records skipped as stale (seeds only)",
                        "; ".join(f"{n} {stale_reason(v)}" for v, n in rep.stale_records.items())])
    if rep.end_to_end:
        e = rep.end_to_end
        how = "one thread, thread CPU time" if e.get("clock") == "cpu" else "wall clock"
        summary.append([f"measured end-to-end (median of {e.get('runs', '?')} interleaved, {how})",
                        f"{e['untuned'] * 1e3:.3f} ms -> {e['tuned'] * 1e3:.3f} ms "
                        f"(x{e['speedup']:.2f}), outputs {'match' if e['outputs_match'] else 'DIFFER'}"])
    if rep.interrupted:
        summary.append(["interrupted", f"run `kiln tune {model} --db {db_path}` again to go on"])
    out.print(kv_table("summary", summary))


def main(argv: list[str] | None = None) -> None:
    """Console entry: click's errors as usual, KilnError as one message and exit status 1."""
    try:
        rc = cli.main(args=argv, prog_name="kiln", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KilnError as e:
        if _Debug.on:
            raise
        click.echo(f"error: {escape(str(e), keep=chr(10))}", err=True)
        sys.exit(1)
    except Exception as e:  # a bug in kiln: say so, keep the traceback one flag away
        if _Debug.on:
            raise
        click.echo(f"internal error (a bug in kiln): {type(e).__name__}: {escape(str(e), keep=chr(10))}\n"
                   "rerun with `kiln --debug ...` for the traceback", err=True)
        sys.exit(3)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
