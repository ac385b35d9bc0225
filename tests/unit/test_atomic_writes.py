"""Files the product writes into a folder someone else may have touched (--out) land whole and are
never written through a link already there."""

from __future__ import annotations

import json
from pathlib import Path

from dapo_ablate.core.atomic import write_text
from dapo_ablate.core.result import RunResult


def test_a_link_at_the_target_is_replaced_and_its_target_untouched(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").symlink_to(victim)
    write_text(out / "config.json", "{}")
    assert victim.read_text() == "keep me"
    assert not (out / "config.json").is_symlink() and (out / "config.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # no temporary file left


def test_a_result_is_saved_past_planted_links(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("result.json", "result.tmp"):  # the old fixed temporary name too
        (out / name).symlink_to(victim)
    result = RunResult(config={"name": "x"})
    result.save(out / "result.json")
    assert victim.read_text() == "keep me" and not (out / "result.json").is_symlink()
    assert RunResult.from_dict(json.loads((out / "result.json").read_text())) == result
