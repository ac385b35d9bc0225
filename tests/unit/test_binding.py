"""`store/binding.py`: the refusal of a spec under a name bound to another design says how to
rename it in a form that pastes safely: the command-line hint is shell-quoted, so a name holding
`$(...)`, quotes or spaces stays a literal name in the shell."""

import re
import shlex
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.binding import check_binding, experiment_digest
from dapo_ablate.ablation.store.ledger import LedgerError, SQLLedger

from support import write_spec


@pytest.mark.parametrize("name", ["plain", "x$(touch pwned)", "it's here", "a`id`b"])
def test_the_rename_hint_pastes_as_the_literal_name(tmp_path: Path, name: str):
    first = load_spec(write_spec(tmp_path / "a", name=name))
    other = load_spec(write_spec(tmp_path / "b", name=name, factors=["clip_higher"]))
    ledger = SQLLedger(f"sqlite:///{tmp_path}/ledger.db")
    try:
        ledger.ensure_experiment(name, first.to_dict(), experiment_digest(first))
        with pytest.raises(LedgerError) as refused:
            check_binding(ledger.get_experiment(name), other, ledger.url)
    finally:
        ledger.close()
    command = re.search(r"`([^`]*)` on the command line", str(refused.value).replace("`id`", "<id>"))
    typed = command.group(1).replace("<id>", "`id`")
    assert shlex.split(typed) == [f"name={name}-2"], str(refused.value)


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_ui_refuses_a_port_outside_0_to_65535_before_anything(tmp_path: Path, port: str):
    """-1 and 70000 were an OverflowError."""
    from typer.testing import CliRunner

    from dapo_ablate.cli.main import app

    refused = CliRunner().invoke(app, ["ui", str(write_spec(tmp_path)), "--port", port])
    assert refused.exit_code == 2 and "Invalid value for '--port'" in refused.output, refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.parametrize("stored", ["{not json", "[1, 2]"])
def test_an_experiment_row_edited_by_hand_is_one_sentence_not_a_traceback(tmp_path: Path, stored: str):
    import sqlite3

    from typer.testing import CliRunner

    from dapo_ablate.cli.main import app

    spec_path = write_spec(tmp_path, name="edited")
    url = load_spec(spec_path).ledger
    SQLLedger(url).close()
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    with db:
        db.execute("INSERT INTO experiments (name, spec, created_at) VALUES ('edited', ?, '2026-01-01 00:00:00')", (stored,))
    db.close()
    for argv in (["status", str(spec_path)], ["run", str(spec_path), "--dry-run"]):
        refused = CliRunner().invoke(app, argv)
        assert refused.exit_code == 2, refused.output
        assert "holds experiment 'edited' with a recorded spec that does not read" in refused.output
        assert "Traceback" not in refused.output
