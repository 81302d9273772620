"""Build the corpus: each model made in torch with seeded random weights, exported to ONNX
with symbolic dims, checked against ONNX Runtime, written with a small JSON sidecar.

Files live in $KILN_CORPUS_DIR (default ~/.cache/kiln-corpus): <name>.onnx and <name>.json
(inputs, cases, exporter, opset, the builder's source hash). A model whose sidecar matches
the current builder is not built again (--force rebuilds).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
import zlib

import numpy as np

from benchmarks.corpus.spec import Spec, concrete

VERSION = 1  # bump to rebuild everything (changes to this file's export logic)


def corpus_dir() -> str:
    d = os.environ.get("KILN_CORPUS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln-corpus")
    os.makedirs(d, exist_ok=True)
    return d


def paths(spec: Spec) -> tuple[str, str]:
    base = os.path.join(corpus_dir(), spec.name)
    return base + ".onnx", base + ".json"


def fingerprint(spec: Spec) -> str:
    """Changes when the spec or its family module's source changes: the cache key."""
    import sys
    src = inspect.getsource(sys.modules[spec.make.__module__])
    text = repr((VERSION, spec.name, spec.inputs, spec.trace, spec.exporter, spec.opset, spec.outputs, src))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_meta(spec: Spec) -> dict | None:
    onnx_path, meta_path = paths(spec)
    if not (os.path.exists(onnx_path) and os.path.exists(meta_path)):
        return None
    with open(meta_path) as f:
        return json.load(f)


def one_case(model: str, label: str, seed: int = 7) -> tuple[str, dict, dict]:
    """A built corpus model's file, the case `label` names (as `python -m benchmarks.corpus list`
    prints it: batch=1,samples=16000) and random inputs for it; exits naming the cases if none."""
    import sys  # noqa: PLC0415

    from benchmarks.corpus.spec import case_label  # noqa: PLC0415
    with open(os.path.join(corpus_dir(), model + ".json")) as f:
        meta = json.load(f)
    case = next((c for c in meta["cases"] if case_label(c) == label), None)
    if case is None:
        sys.exit(f"{model} has no case {label!r}: {[case_label(c) for c in meta['cases']]}")
    return os.path.join(corpus_dir(), model + ".onnx"), case, random_feeds(meta["inputs"], case, seed)


def random_feeds(spec_inputs, dims: dict, seed: int) -> dict[str, np.ndarray]:
    """Fresh inputs at a case's shape: normal floats, integers uniform in [low, high) (never all zeros)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in spec_inputs:
        i = i if isinstance(i, dict) else vars(i)
        shape = concrete(tuple(i["shape"]), dims)
        if i["dtype"].startswith("int"):
            feeds[i["name"]] = rng.integers(i["low"], i["high"], shape).astype(i["dtype"])
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(i["dtype"])
    return feeds


def randomize_norms(module, seed: int) -> None:
    """Non-trivial normalisation statistics and affine parameters (a fresh BatchNorm is the
    identity, which would let a wrong BN folding pass unnoticed)."""
    import torch
    from torch import nn
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)) and m.weight is not None:
                m.weight.copy_(0.6 + 0.8 * torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


def make_module(spec: Spec):
    import torch
    seed = zlib.crc32(spec.name.encode())
    torch.manual_seed(seed)
    m = spec.make()
    randomize_norms(m, seed)
    return m.eval()


def export(spec: Spec, path: str) -> None:
    """torch.onnx.export with the spec's exporter; every symbolic dim stays symbolic."""
    import torch
    model = make_module(spec)
    feeds = random_feeds(spec.inputs, spec.trace, seed=0)
    args = tuple(torch.from_numpy(feeds[i.name]) for i in spec.inputs)
    names = [i.name for i in spec.inputs]
    if spec.exporter == "torchscript":
        axes = {i.name: {k: d for k, d in enumerate(i.shape) if isinstance(d, str)} for i in spec.inputs}
        with torch.no_grad():
            torch.onnx.export(model, args, path, dynamo=False, opset_version=spec.opset, input_names=names,
                              output_names=list(spec.outputs), dynamic_axes=axes, do_constant_folding=True)
        return
    dims: dict = {}
    shapes = tuple({k: dims.setdefault(d, torch.export.Dim(d)) for k, d in enumerate(i.shape) if isinstance(d, str)}
                   for i in spec.inputs)
    with torch.no_grad():
        prog = torch.onnx.export(model, args, dynamo=True, opset_version=spec.opset, input_names=names,
                                 output_names=list(spec.outputs), dynamic_shapes=shapes, optimize=True,
                                 verify=False, external_data=False)
    prog.save(path, external_data=False)


def check_with_ort(spec: Spec, path: str) -> dict:
    """The exported file loads in ONNX Runtime at every case and keeps its symbols; returns
    output shapes per case (a failure here is an export bug, raised)."""
    import onnx
    import onnxruntime as ort
    m = onnx.load(path, load_external_data=False)
    want = {i.name: [d for d in i.shape] for i in spec.inputs}
    for vi in m.graph.input:
        if vi.name not in want:
            raise RuntimeError(f"{spec.name}: unexpected graph input {vi.name!r}")
        got = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        exp = want[vi.name]
        if [isinstance(d, str) for d in got] != [isinstance(d, str) for d in exp]:
            raise RuntimeError(f"{spec.name}: input {vi.name} exported with shape {got}, wanted {exp}")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    shapes = {}
    for case in spec.cases:
        outs = sess.run(None, random_feeds(spec.inputs, case, seed=1))
        for o in outs:
            if not np.isfinite(o).all():
                raise RuntimeError(f"{spec.name}: non-finite output at {case}")
        shapes[json.dumps(case)] = [list(o.shape) for o in outs]
    return shapes


def build(spec: Spec, force: bool = False, log=print) -> dict:
    """Export `spec` unless its cached file is current; returns the sidecar."""
    onnx_path, meta_path = paths(spec)
    fp = fingerprint(spec)
    meta = load_meta(spec)
    if meta is not None and meta.get("fingerprint") == fp and not force:
        return meta
    import onnx
    import torch
    t = time.perf_counter()
    tmp = onnx_path + ".tmp"
    export(spec, tmp)
    shapes = check_with_ort(spec, tmp)
    os.replace(tmp, onnx_path)
    m = onnx.load(onnx_path, load_external_data=False)
    meta = {"name": spec.name, "family": spec.family, "fingerprint": fp, "exporter": spec.exporter,
            "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
            "torch": torch.__version__, "inputs": [vars(i) for i in spec.inputs],
            "cases": list(spec.cases), "output_shapes": shapes, "nodes": len(m.graph.node),
            "bytes": os.path.getsize(onnx_path), "build_s": round(time.perf_counter() - t, 2), "note": spec.note}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    log(f"built {spec.name}: {meta['nodes']} nodes, {meta['bytes'] / 1e6:.1f} MB, opset {meta['opset']}, "
        f"{spec.exporter}, {meta['build_s']} s")
    return load_meta(spec)   # as a later cached call returns it (JSON: lists, not tuples)
