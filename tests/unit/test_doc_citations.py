"""Every document the code cites is in the repository: a docstring, comment or README under the
package folders, tests, benchmarks or .ci that points a reader at a Markdown document names one
this repository holds (facts the code relies on live in docs/, README.md or benchmarks/README.md),
and none cites a planning document or issue tracker that a clone does not have."""

from __future__ import annotations

import os
import re
from pathlib import Path

from support import ROOT

SCANNED = ("core", "ablation", "sweeps", "cli", "reports", "tests", "benchmarks", ".ci")
TEXT_SUFFIXES = {".py", ".sh", ".j2", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", ""}

MD_PATH = re.compile(r"(?<![\w./-])((?:\.\.?/)*(?:[\w.-]+/)*[\w.-]+\.md)(?![\w.])")
"""A Markdown file name or path (not ``report.md.j2``, a template)."""
TOP_FOLDERS = tuple(f"{name}/" for name in ("docs", "benchmarks", "examples", *SCANNED))
OUTSIDE = re.compile(r"\.\./shared|\b(?:DESIGN|FINDINGS|STYLE|NOTES)\b|\b(?i:design|project) card\b")
"""Documents this project was planned from, which a clone does not hold (by name, with or without
``.md``). The bare names in upper case only: ``design`` is a word of this domain."""
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+\b|\b[Ii]ssue \"")
"""An issue of the project's tracker cited as if it were a document (code files; the README's
history of measurements may name the issue that asked for them)."""

PENDING: dict[str, str] = {}
"""Files another change is editing right now, and the citation each still holds (none now): each
entry fails this test once the citation is gone, so that it is removed from here."""


def _scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info") and not d.startswith(".")]
            files += [Path(folder) / n for n in names if Path(n).suffix in TEXT_SUFFIXES]
    return sorted(files)


def _is_citation(name: str) -> bool:
    """A path into the repository's folders, a relative path, or an upper-case document name
    (README.md); not an output a command writes (``report.md``, ``OUT/looks.md``)."""
    base = name.rsplit("/", 1)[-1]
    return name.startswith(("../", "./", *TOP_FOLDERS)) or bool(re.fullmatch(r"[A-Z][A-Z0-9_-]*\.md", base))


def _held(name: str, citing: Path) -> bool:
    candidates = [ROOT / name, citing.parent / name]
    if "/" not in name:  # README.md: the citing file's folder or one above it, up to the root
        candidates += [folder / name for folder in citing.parents if ROOT in (folder, *folder.parents)]
    return any(path.resolve().is_file() and ROOT.resolve() in path.resolve().parents for path in candidates)


def _problems(path: Path) -> list[str]:
    relative = path.relative_to(ROOT).as_posix()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{relative}:{number}"
        found += [f"{where}: cites {m.group(1)}, not in the repository" for m in MD_PATH.finditer(line)
                  if _is_citation(m.group(1)) and not _held(m.group(1), path)]
        if relative not in PENDING:
            found += [f"{where}: cites {m.group(0)!r}, a document outside the repository" for m in OUTSIDE.finditer(line)]
        if path.suffix != ".md":
            found += [f"{where}: cites {m.group(0)!r} of the issue tracker" for m in ISSUE.finditer(line)]
    return found


def test_the_scan_sees_the_code_and_its_readmes():
    files = {p.relative_to(ROOT).as_posix() for p in _scanned_files()}
    assert {"core/algorithms.py", "sweeps/study.py", ".ci/run", "benchmarks/README.md", "tests/verl_cpu/README.md"} <= files
    assert not [f for f in files if "__pycache__" in f]


def test_every_cited_document_is_in_the_repository():
    problems = [p for path in _scanned_files() if path != Path(__file__).resolve() for p in _problems(path)]  # this file names them
    assert problems == [], "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert OUTSIDE.search("(see DESIGN: results table)") and OUTSIDE.search("its schema (FINDINGS).")
    assert OUTSIDE.search("the Design card's folders") and OUTSIDE.search("../shared/DESIGN.md")
    assert not OUTSIDE.search("DESIGN_FIELDS = ANOTHER_DESIGN") and not OUTSIDE.search("a full design")
    assert ISSUE.search("(issue 23, item 4)") and ISSUE.search('(issue "Real models")')
    assert [m.group(1) for m in MD_PATH.finditer("docs/contracts.md, README.md and report.md.j2")] == [
        "docs/contracts.md", "README.md"]
    assert _is_citation("docs/none.md") and _is_citation("CHANGELOG.md") and _is_citation("../x/y.md")
    assert not _is_citation("report.md") and not _is_citation("OUTPUT_DIR/NAME/looks.md")
    citing = ROOT / "benchmarks" / "chaos.py"
    assert _held("README.md", citing) and _held("benchmarks/README.md", citing) and _held("docs/contracts.md", citing)
    assert not _held("docs/none.md", citing) and not _held("CHANGELOG.md", citing)


def test_each_pending_file_still_holds_its_citation():
    for relative, citation in PENDING.items():
        assert citation in (ROOT / relative).read_text(encoding="utf-8"), (
            f"{relative} no longer cites {citation}: remove it from PENDING in this file")
