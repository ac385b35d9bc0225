"""The `dapo-ablate` command line.

Commands only parse options and call one library function each; a user's mistake (ConfigError,
SpecError, DataError, ...) is printed as one sentence on stderr with exit status 2, while a bug
keeps its traceback.
"""

from __future__ import annotations

import typer

from . import plan_seeds_cmd, report_cmd, run_cmd, sweep_cmd, train_cmd

app = typer.Typer(
    name="dapo-ablate",
    help="Factorial ablations of DAPO's five techniques: train, run a factorial on Ray, report, sweep.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

train_cmd.register(app)
report_cmd.register(app)
run_cmd.register(app)
sweep_cmd.register(app)
plan_seeds_cmd.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
