"""The command line itself: lazy start-up, --version, key=value overrides on `train`.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_cli_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli.main import COMMANDS, app
from dapo_ablate.ablation.experiment.overrides import OverrideError, parse_overrides

from tiny_configs import TINY_TRAINER


HEAVY = ("torch", "ray", "mlflow", "pandas", "scipy", "transformers", "sqlalchemy", "matplotlib")


@pytest.fixture()
def tiny_yaml(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_TRAINER))
    return path


def test_top_level_help_and_version_import_no_heavy_library():
    code = (
        "import sys\n"
        "from dapo_ablate.cli.main import app\n"
        "for args in (['--help'], ['--version']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "train" in out and "plan-seeds" in out and "dapo-ablate 0." in out
    assert out.strip().splitlines()[-1] == "[]"


def test_every_listed_command_resolves_to_its_module():
    runner = CliRunner()
    for name in COMMANDS:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage: " in result.output and name in result.output


def test_parse_overrides_reads_yaml_scalars():
    assert parse_overrides(["a.b=5", "c=1e-6", "d=true", "e=null", "f=[x, y]", "g=text"]) == {
        "a.b": 5, "c": 1e-6, "d": True, "e": None, "f": ["x", "y"], "g": "text",
    }  # fmt: skip
    with pytest.raises(OverrideError, match="not key=value"):
        parse_overrides(["schedule.total_steps"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("schedule.total_stepz=5", "did you mean schedule.total_steps"),
        ("schedule.total_steps=0", "schedule.total_steps"),
        ("total_steps", "is not key=value"),
    ],
)
def test_bad_overrides_are_one_sentence_and_exit_2(tiny_yaml, tmp_path, override, message):
    result = CliRunner().invoke(app, ["train", str(tiny_yaml), override, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o" / "config.json").exists()
