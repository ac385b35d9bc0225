"""Start-up of the command line: `dapo-ablate COMMAND --help` imports none of the heavy
libraries (the commands import the app layer inside their functions), and the help texts' copies
of the values the layers below check against are the same values. Wall-clock times are measured
by benchmarks/cli_startup.py, never asserted here."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

from dapo_ablate.ablation.app import texts
from dapo_ablate.cli.main import COMMANDS


HEAVY = ("torch", "ray", "mlflow", "pandas", "scipy", "statsmodels", "matplotlib", "transformers", "optuna",
         "sqlalchemy", "dapo_ablate.core.config", "dapo_ablate.ablation.experiment", "dapo_ablate.ablation.store",
         "dapo_ablate.ablation.runtime.executor", "dapo_ablate.reports")
"""Not pydantic: Typer's own option parsing imports it."""
MODULES = sorted({module for module, _ in COMMANDS.values()} | {"main", "common"})


def _loaded_in_a_fresh_process(code: str) -> dict[str, list[str]]:
    """Runs `code` (which fills `found`: a name -> what it did) in a new interpreter; `found` back."""
    program = (
        "import json, sys\n"
        f"HEAVY = {HEAVY!r}\n"
        "def heavy():\n"
        "    return sorted(name for name in HEAVY if name in sys.modules)\n"
        "found = {}\n" + code + "\nprint(json.dumps(found))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_a_command_module_imports_no_heavy_library():
    code = "\n".join(f"import dapo_ablate.cli.{module}\nfound[{module!r}] = heavy()" for module in MODULES)
    assert _loaded_in_a_fresh_process(code) == {module: [] for module in MODULES}


def test_every_commands_help_imports_no_heavy_library():
    code = (
        "import contextlib, io\n"
        "from dapo_ablate.cli.main import app\n"
        f"for name in {list(COMMANDS)!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            app([name, '--help'])\n"
        "        except SystemExit as stop:\n"
        "            assert stop.code == 0, (name, stop.code)\n"
        "    found[name] = heavy()\n"
    )
    assert _loaded_in_a_fresh_process(code) == {name: [] for name in COMMANDS}


def test_the_help_texts_values_are_the_ones_checked_below():
    from dapo_ablate.ablation.experiment.overrides import parse_overrides
    from dapo_ablate.reports.multiplicity import ADJUSTMENTS
    from dapo_ablate.reports.options import FORMATS

    assert texts.REPORT_FORMATS == FORMATS and texts.ADJUSTMENTS == ADJUSTMENTS
    line = texts.command_line("report", "my specs/mini.yaml", ["seeds=[0, 1]", "name=it's"], "--out", "DIR")
    assert line == "dapo-ablate report 'my specs/mini.yaml' 'seeds=[0, 1]' 'name=it'\"'\"'s' --out DIR"
    words = shlex.split(line)
    assert words[2] == "my specs/mini.yaml" and parse_overrides(words[3:5]) == {"seeds": [0, 1], "name": "it's"}
