"""README names real files: every `kiln/...`, `tests/...`, `benchmarks/...` or `examples/...`
path it quotes exists (a path with `<family>`/`<target>` or `*` must match at least one),
so a move that forgets the docs fails here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"`((?:kiln|tests|benchmarks|examples)/[^`\s]*)`", text))
    assert len(paths) > 20, "the README should name the files it describes"
    missing = [p for p in sorted(paths)
               if not list(ROOT.glob(re.sub(r"<[a-z]+>", "*", p).rstrip("/")))]
    assert not missing, f"README names paths that do not exist: {missing}"
