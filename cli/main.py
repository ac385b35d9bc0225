"""The `dapo-ablate` command line.

Commands only parse options and call one library function each; a user's mistake (ConfigError,
SpecError, DataError, ...) is printed as one sentence on stderr with exit status 2, while a bug
keeps its traceback.

Start-up is lazy: a command's module (and with it torch, Ray, MLflow, pandas, scipy) is imported
only when that command runs or its own `--help` is asked for, so `dapo-ablate --help` and
`--version` answer in a fraction of a second (benchmarks/cli_startup.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

# command -> (module in dapo_ablate.cli, one-line help shown by `dapo-ablate --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train_cmd", "Train one configuration and write DIR/result.json."),
    "validate": ("run_cmd", "Check an experiment spec and print its plan, without running anything."),
    "run": ("run_cmd", "Run every pending run of an experiment on Ray (rerun to resume)."),
    "status": ("run_cmd", "Print the runs table of an experiment from its ledger."),
    "ui": ("run_cmd", "Serve the MLflow UI of an experiment's store on 127.0.0.1."),
    "report": ("report_cmd", "Causal-isolation tables, claims and figures from an experiment or a results CSV."),
    "plan-seeds": ("plan_seeds_cmd", "Seeds per cell for 80% power per claims family, before booking GPUs."),
    "sweep": ("sweep_cmd", "Run an Optuna study over the knobs, for each technique's cells."),
    "sweep-report": ("sweep_cmd", "Each technique's effect across a sweep's knob settings."),
}


class LazyCommands(TyperGroup):
    """A command group that imports a command's module only when the command is used."""

    listing = False  # True while the group's own help is formatted: list commands without importing them

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in COMMANDS:
            return None
        module_name, short = COMMANDS[name]
        if self.listing:
            return TyperCommand(name=name, help=short)
        module = importlib.import_module(f"dapo_ablate.cli.{module_name}")
        holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        module.register(holder)
        built = typer.main.get_command(holder)
        return built.get_command(ctx, name) if isinstance(built, TyperGroup) else built

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"dapo-ablate {version('dapo-ablate')}")
        raise typer.Exit()


app = typer.Typer(
    name="dapo-ablate",
    cls=LazyCommands,
    help="Factorial ablations of DAPO's five techniques: train, run a factorial on Ray, report, sweep.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Factorial ablations of DAPO's five techniques: train, run a factorial on Ray, report, sweep."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
