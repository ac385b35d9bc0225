"""The scheduler's own cost per run: Ray, the ledger and MLflow around a cell function that does
no work (it returns at once a result shaped like a quickstart run's: 20 steps of the trainer's
signals and 3 evaluations, so MLflow logs as much as for a real run).

    .venv/bin/python benchmarks/scheduler_overhead.py [--seeds 2] [--concurrency 2]

The full 2^5 design x --seeds (64 runs by default) is run with `run_experiment`, stores on
SQLite in a temporary folder. Printed: Ray start-up, the invocation's wall time (stores opened,
every run claimed, executed, recorded in the ledger and logged to MLflow), the overhead per run
with and without Ray's start-up, and the time of a rerun that finds everything done.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import tempfile
import time
from pathlib import Path

SIGNAL_KEYS = (
    "reward", "accuracy", "entropy", "response_length", "response_length_max", "truncation_rate",
    "overlong_rate", "penalty", "clipfrac_low", "clipfrac_high", "approx_kl", "groups_kept", "groups_mixed",
    "gen_rounds", "ds_exhausted", "tokens_generated", "tokens_discarded", "tokens_trained", "grad_norm", "lr",
    "time_rollout_s", "time_reward_s", "time_update_s",
)


def trivial_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """No training: a quickstart-shaped result at once."""
    evals = [{"step": step, "avg@32": 0.4, "pass@32": 0.9, "maj@32": 0.5, "response_length": 18.0,
              "truncation_rate": 0.01} for step in (0, 10, 20)]
    return {
        "metrics": {**{k: v for k, v in evals[-1].items() if k != "step"}, "tokens_trained": 1000},
        "eval_curve": evals,
        "signals": [{"step": step, **{key: 0.5 for key in SIGNAL_KEYS}} for step in range(1, 21)],
        "tokens_generated": 200_000, "tokens_discarded": 20_000, "wall_s": 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="Seeds of the 32-cell design (runs = 32 x seeds).")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1, help="Runs at a time.")
    args = parser.parse_args()

    import ray

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
    from dapo_ablate.ablation.experiment.spec import build_spec

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        spec = build_spec({
            "name": "overhead", "trainer": {}, "seeds": args.seeds, "output_dir": str(out),
            "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
            "executor": {"max_concurrent": args.concurrency},
        })
        plan = expand(spec)
        started = time.perf_counter()
        ray.init(address="local", num_cpus=os.cpu_count(), object_store_memory=256 * 2**20, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.ERROR)
        ray_s = time.perf_counter() - started
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # one line per run otherwise
                started = time.perf_counter()
                summary = run_experiment(spec, plan, cell_fn=trivial_cell, options=RunOptions(progress=False))
                wall_s = time.perf_counter() - started
                started = time.perf_counter()
                again = run_experiment(spec, plan, cell_fn=trivial_cell, options=RunOptions(progress=False))
                rerun_s = time.perf_counter() - started
            assert summary.exit_code == 0 and summary.finished == len(plan.runs), summary
            assert again.finished == 0 and again.already_done == len(plan.runs), again
        finally:
            ray.shutdown()
    runs = len(plan.runs)
    print(f"{runs} runs, {args.concurrency} at a time, on {os.cpu_count()} CPUs")
    print(f"Ray start-up                      {ray_s:6.1f} s")
    print(f"invocation (stores + {runs} runs)     {wall_s:6.1f} s")
    print(f"overhead per run                  {wall_s / runs:6.2f} s  ({(wall_s + ray_s) / runs:.2f} s with Ray's start-up)")
    print(f"rerun, everything done            {rerun_s:6.1f} s")


if __name__ == "__main__":
    main()
