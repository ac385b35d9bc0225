"""The body of one ablation run: what a Ray task executes for a cell x seed.

A *cell function* has the signature ``cell_fn(config_dict, run_dir, eval_cache_dir) -> dict``
and returns the ledger's result dict (see `Ledger.finish`): ``metrics``, ``eval_curve``,
``signals``, ``tokens_generated``, ``tokens_discarded``, ``wall_s``. `run_cell` is the default;
tests and debugging substitute cheap ones (see `executor.CELL_FN_ENV`). A cell function may also
take ``on_eval=`` (as `run_cell` does); a sweep then sees its evaluations as they happen; and
``on_event=`` (kind "step" or "eval", step, data): the executor then logs them to MLflow live;
a cell run as a Ray job also sends ("job", 0, {"submission_id", "address"}), which the driver
writes to the ledger.

It runs in a Ray worker, so it takes and returns plain data only, and it imports the trainer
lazily: the driver never loads torch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Protocol

from dapo_ablate.ablation.runtime.backends.registry import backend_of
from dapo_ablate.ablation.runtime.jobs import CONFIG_ENV, RESULT_MARKER, job_cell, seal_key
from dapo_ablate.core.contracts import RunRecord

COMPUTE_FIELDS = ("tokens_trained", "eval_tokens", "peak_rss_mb", "steps")
"""RunResult fields stored among a run's metrics besides its final evaluation."""


class CellFn(Protocol):
    def __call__(
        self, config_dict: dict[str, Any], run_dir: str, eval_cache_dir: str | None
    ) -> dict[str, Any]: ...


def run_cell(
    config_dict: dict[str, Any], run_dir: str, eval_cache_dir: str | None,
    on_eval: Callable[[int, dict[str, Any]], None] | None = None,
    on_event: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train one resolved configuration into `run_dir` and return its ledger result.

    ``resume=True``: a retried or re-queued run continues from its last checkpoint in `run_dir`
    (written every ``schedule.checkpoint_every`` steps) instead of starting over, if it carries the
    seal of the experiment's worker key in ``$DAPO_ABLATE_SEAL_KEY`` (`seal_key`); an unsealed one
    is ignored with a note (a "note" event) and the run trains from the start.
    `eval_cache_dir` is shared by all runs so the step-0 evaluation is computed once.
    ``on_eval(step, metrics)``, if given, is called after each evaluation (a sweep streams them
    to its pruner: `sweeps.tasks.run_streaming`). ``on_event(kind, step, data)``, if given, is
    called after each training step ("step", its signals) and evaluation ("eval").
    """
    if backend_of(config_dict).runs_as_job:  # e.g. a verl job on the Ray cluster (runtime/jobs.py)
        return job_cell(config_dict, run_dir, eval_cache_dir, on_event=on_event)
    from dapo_ablate.core.config import build_trainer_config
    from dapo_ablate.core.trainer import train

    def eval_callback(kind: str, step: int, data: dict[str, Any]) -> None:
        if kind == "eval":
            on_eval(step, data)  # type: ignore[misc]  # only registered with an on_eval

    config = build_trainer_config(config_dict, source="run config")
    callbacks = ([eval_callback] if on_eval is not None else []) + ([on_event] if on_event is not None else [])
    result = train(config, Path(run_dir), callbacks=callbacks, resume=True, eval_cache_dir=eval_cache_dir,
                   seal_key=seal_key())
    return ledger_result(result)


def ledger_result(result: Any) -> dict[str, Any]:
    """A `RunResult` as the dict `Ledger.finish` stores.

    metrics: the final evaluation (avg@k, pass@k, maj@k, ...) plus `COMPUTE_FIELDS`.
    """
    metrics = {**result.final, **{name: getattr(result, name) for name in COMPUTE_FIELDS}}
    record = RunRecord(metrics, tuple(result.eval), tuple(result.signals), int(result.tokens_generated),
                       int(result.tokens_discarded), float(result.wall_s))
    return record.result_dict()


def main(argv: list[str]) -> int:
    """The built-in trainer as a Ray job's entrypoint (``python -m dapo_ablate.ablation.runtime.cell``): the
    cell's config from $DAPO_ABLATE_JOB_CONFIG,
    its result printed as one marked JSON line."""
    run_dir, cache = argv[0], argv[1] if len(argv) > 1 else ""
    config = json.loads(os.environ[CONFIG_ENV])
    result = run_cell(config, run_dir, cache or None)
    print(RESULT_MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
