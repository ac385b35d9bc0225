"""The body of one ablation run: what a Ray task executes for a cell x seed.

A *cell function* has the signature ``cell_fn(config_dict, run_dir, eval_cache_dir) -> dict``
and returns the ledger's result dict (see `Ledger.finish`): ``metrics``, ``eval_curve``,
``signals``, ``tokens_generated``, ``tokens_discarded``, ``wall_s``. `run_cell` is the default;
tests and debugging substitute cheap ones (see `executor.CELL_FN_ENV`).

It runs in a Ray worker, so it takes and returns plain data only, and it imports the trainer
lazily: the driver never loads torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

COMPUTE_FIELDS = ("tokens_trained", "eval_tokens", "peak_rss_mb", "steps")
"""RunResult fields stored among a run's metrics besides its final evaluation."""


class CellFn(Protocol):
    def __call__(
        self, config_dict: dict[str, Any], run_dir: str, eval_cache_dir: str | None
    ) -> dict[str, Any]: ...


def run_cell(config_dict: dict[str, Any], run_dir: str, eval_cache_dir: str | None) -> dict[str, Any]:
    """Train one resolved configuration into `run_dir` and return its ledger result.

    ``resume=True``: a retried or re-queued run continues from its last checkpoint in `run_dir`
    (written every ``schedule.checkpoint_every`` steps) instead of starting over.
    `eval_cache_dir` is shared by all runs so the step-0 evaluation is computed once.
    """
    from dapo_ablate.core.config import build_trainer_config
    from dapo_ablate.core.trainer import train

    config = build_trainer_config(config_dict, source="run config")
    result = train(config, Path(run_dir), resume=True, eval_cache_dir=eval_cache_dir)
    return ledger_result(result)


def ledger_result(result: Any) -> dict[str, Any]:
    """A `RunResult` as the dict `Ledger.finish` stores.

    metrics: the final evaluation (avg@k, pass@k, maj@k, ...) plus `COMPUTE_FIELDS`.
    """
    metrics = {**result.final, **{name: getattr(result, name) for name in COMPUTE_FIELDS}}
    return {
        "metrics": metrics,
        "eval_curve": list(result.eval),
        "signals": list(result.signals),
        "tokens_generated": int(result.tokens_generated),
        "tokens_discarded": int(result.tokens_discarded),
        "wall_s": float(result.wall_s),
    }
