"""The slower cases of tests/unit/test_reports_cli.py (figures written as PDF and SVG, and reports
through the CLI): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

from test_reports_cli import app, invoke, results_csv  # noqa: F401, F811 - shared with the fast part


def test_figures_as_pdf_and_svg_for_papers(app, results_csv, tmp_path):
    out = tmp_path / "o"
    result = invoke(app, "--results", str(results_csv), "--out", str(out), "--format", "csv,pdf,svg")
    assert result.exit_code == 0, result.output
    assert (out / "cumulative.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (out / "effects.svg").read_bytes()[:2000]
    assert not list(out.glob("*.png"))  # only the formats asked for


def test_report_files_replace_links_in_out_and_never_write_through_them(app, results_csv, tmp_path):
    """A symbolic link already in --out under a report file's name is replaced by the file; the
    file it pointed at is untouched. Every file lands whole, with no staging folder left over."""
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me")
    (out / "report.md").symlink_to(victim)
    (out / "shapley.csv").symlink_to(tmp_path / "nowhere.csv")
    result = invoke(app, "--results", str(results_csv), "--out", str(out), "--format", "csv,md,html,png")
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "keep me" and not (tmp_path / "nowhere.csv").exists()
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text().startswith("#")
    assert not (out / "shapley.csv").is_symlink()
    assert not [p for p in out.iterdir() if p.name.startswith(".writing-")]
    assert ".writing-" not in (out / "report.html").read_text()
