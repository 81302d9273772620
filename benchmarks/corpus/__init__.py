"""The model corpus: real architectures built locally (plain torch and `transformers` configs,
seeded random weights), exported to ONNX with symbolic dims, benchmarked against ONNX Runtime
and OpenVINO. See README.md; `python -m benchmarks.corpus build|run|list`."""

from __future__ import annotations

from benchmarks.corpus.spec import FAMILIES, Input, Spec  # noqa: F401


def specs() -> list:
    """Every corpus model (imports torch's builders lazily: listing needs torch, running does not)."""
    from benchmarks.corpus import cnn, rnn, small, transformer
    out = cnn.MODELS + transformer.MODELS + rnn.MODELS + small.MODELS
    assert len({s.name for s in out}) == len(out), "duplicate corpus model names"
    return out


def select(all_specs: list, only: str | None = None, family: str | None = None) -> list:
    """Models (Specs or sidecar dicts) named in `only` and/or of `family` (both comma-separated)."""
    names = {n.strip() for n in only.split(",")} if only else None
    fams = {f.strip() for f in family.split(",")} if family else None
    def get(s, key):
        return s[key] if isinstance(s, dict) else getattr(s, key)
    if names:
        unknown = names - {get(s, "name") for s in all_specs}
        if unknown:
            raise SystemExit(f"unknown corpus model(s) {sorted(unknown)}; see `python -m benchmarks.corpus list`")
    if fams and fams - set(FAMILIES):
        raise SystemExit(f"unknown family {sorted(fams - set(FAMILIES))}; choose from {FAMILIES}")
    return [s for s in all_specs
            if (names is None or get(s, "name") in names) and (fams is None or get(s, "family") in fams)]
