"""The docs, the README and the code's comments name files of this repository that exist, and no design
document kept outside it: a renamed or moved module fails here until every mention follows it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("planner", "runtime", "cli", "docs", "tests", "bench", "templates", "scripts")
# `runtime/train/step.py`, `docs/data.md`, `tests/slurm/`: a path from the repository root. Generated output
# (bench/out/) is not in the repository.
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w./-]*\w)")
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|\bshared/")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("planner", "runtime", "cli"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def _exists(path: str) -> bool:
    return path.startswith("bench/out") or any((ROOT / p).exists() for p in (path, path + ".py"))


def stale_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text) if not _exists(m.group(1))]


def test_the_scan_finds_a_path_that_does_not_exist():
    assert stale_paths("cut on the whole model (runtime/train/build.py); see docs/data.md") == [
        "runtime/train/build.py"
    ]


def test_every_path_named_in_docs_and_code_exists():
    stale = [f"{f.relative_to(ROOT)}: {p}" for f in _texts() for p in stale_paths(f.read_text())]
    assert stale == []


def test_no_design_document_outside_the_repository_is_cited():
    cited = [
        f"{f.relative_to(ROOT)}:{i}"
        for f in _texts()
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == []
