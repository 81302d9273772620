"""`kiln bench model.py`: time a torch module compiled by kiln against eager torch and Inductor.

The Python file defines `model` (a torch.nn.Module) and `example_inputs` (a
tuple of tensors), optionally `dynamic_shapes` (torch.export's). kiln compiles
the module through `kiln.compile` (torch.export → kiln), cold and warm; peers
run the same module: "torch" is eager PyTorch under inference_mode,
"inductor" is `torch.compile` with its default backend, "openvino" `torch.compile(backend=
"openvino")` in f32 (where openvino is installed). Outputs are checked
against each peer, and runs are interleaved as for ONNX models (kiln.bench).
"""

from __future__ import annotations

import os
import runpy
from contextlib import nullcontext

import numpy as np

from kiln.bench import BenchResult, compare, compile_cold_warm, stats, time_interleaved
from kiln.errors import KilnError
from kiln.targets.target import host_cores

TORCH_PEERS = ("torch", "inductor", "openvino")


def torch_peer(name: str, model, threads: int):
    """The callable a torch peer runs: the module itself (eager), or torch.compile'd with
    Inductor, kiln or OpenVINO's backend (each compiles on its first call)."""
    import torch
    if name in ("torch", "eager"):
        return model
    if name == "inductor":
        return torch.compile(model)
    if name == "kiln":
        return torch.compile(model, backend="kiln")
    if name == "openvino":
        import openvino.torch  # noqa: F401  (registers the backend)
        return torch.compile(model, backend="openvino",
                             options={"device": "CPU", "config": {"INFERENCE_NUM_THREADS": str(threads),
                                                                  "INFERENCE_PRECISION_HINT": "f32"}})
    raise KilnError(f"unknown torch peer {name!r}; choose from {list(TORCH_PEERS)}")


def load_module_file(path: str):
    """(model, example_inputs, dynamic_shapes) defined by the Python file at `path`."""
    if not os.path.isfile(path):
        raise KilnError(f"model file not found: {path}")
    try:
        ns = runpy.run_path(path, run_name="kiln_bench_model")
    except Exception as e:
        raise KilnError(f"{path} failed to run: {type(e).__name__}: {e}") from e
    import torch
    model, inputs = ns.get("model"), ns.get("example_inputs")
    if not isinstance(model, torch.nn.Module) or inputs is None:
        raise KilnError(f"{path} must define `model` (a torch.nn.Module) and `example_inputs` (a tuple "
                        f"of tensors); it defines {sorted(k for k in ns if not k.startswith('_'))[:20]}")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return model.eval(), inputs, ns.get("dynamic_shapes")


def _flat(out) -> dict:
    import torch
    leaves = torch.utils._pytree.tree_leaves(out)
    return {f"output_{i}": np.asarray(x.detach().numpy() if isinstance(x, torch.Tensor) else x)
            for i, x in enumerate(leaves)}


def bench_torch_file(path: str, *, peers=("torch",), threads: int | None = None, runs: int = 50,
                     target: str = "cpu", options: dict | None = None,
                     step=lambda what: nullcontext()) -> BenchResult:
    """Compile the module defined in `path` with kiln (cold, warm), check and time it against peers."""
    import torch
    import kiln
    bad = [p for p in peers if p not in TORCH_PEERS]
    if bad:
        raise KilnError(f"peer(s) {bad} do not run a torch module; choose from {list(TORCH_PEERS)}")
    threads = threads or host_cores()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    with step(f"loading {path}"):
        model, inputs, dyn = load_module_file(path)

    def build():
        m = kiln.compile(model, target=target, example_inputs=inputs, dynamic_shapes=dyn, **(options or {}))
        return m, m(*inputs)
    with step(f"compiling with kiln for {target}, cold then warm"):
        stages = []
        (compiled, got), cold, warm = compile_cold_warm(build, stages)
    compiled.wait_optimized()   # the runs timed below run the -O3 build (kiln.codegen.tiers)
    res = BenchResult(target, threads, runs, cold, warm, cold_stages=stages[0], warm_stages=stages[1])
    got = _flat(got)
    fns = {"kiln": lambda: compiled(*inputs)}
    for name in peers:
        with step(f"loading {name}"):
            try:
                fn = torch_peer(name, model, threads)
                with torch.inference_mode():
                    want = _flat(fn(*inputs))  # (Inductor compiles here)
            except Exception as e:  # Inductor needs a C++ toolchain, openvino may be absent: report
                res.skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                continue
        res.checks[name] = compare(got, want)
        fns[name] = (lambda f: lambda: _infer(torch, f, inputs))(fn)
    with step(f"timing {runs} runs of {', '.join(fns)}, interleaved"):
        times = time_interleaved(fns, {k: runs for k in fns}, rounds=max(1, min(10, runs)))
    res.times = {k: stats(v) for k, v in times.items()}
    return res


def _infer(torch, fn, inputs):
    with torch.inference_mode():
        return fn(*inputs)
