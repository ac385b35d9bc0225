"""What a stopped driver left behind, put right before the next driver of its experiment or sweep
starts. Both owners of a run's life (`experiment_run` for a factorial, `sweeps.runner` for a sweep)
call this one sequence:

- done runs whose stored result an older version wrote unusable go back to pending;
- runs a dead driver on this machine left running go back to pending (`hosts.release_orphans`);
- results a driver kept on disk when its ledger write failed are recorded, and one this product
  did not seal for its run is set aside, its run trained again (`kept_results.record_kept`)."""

from __future__ import annotations

from typing import Callable

from dapo_ablate.ablation.runtime.hosts import release_orphans
from dapo_ablate.ablation.store.kept_results import ResultKeeper, record_kept
from dapo_ablate.ablation.store.ledger import Ledger


def recover_left_behind(ledger: Ledger, keeper: ResultKeeper, experiment: str, host: str,
                        undone: Callable[[], list[str]], label: Callable[[str], str | None]) -> list[str]:
    """Put right what a stopped driver of `experiment` left (the module's docstring); the console
    notes, one per run put back or recorded and one per kept result set aside. `host`: this
    driver's holder string; `undone`: the runs not done, read once the runs are put back; `label`:
    how a note names a run (None: a run the caller does not plan, put back without a note)."""
    notes = [f"{label(run_id)}: its stored result was unusable; it trains again"
             for run_id in ledger.reopen_malformed(experiment) if label(run_id) is not None]
    release_orphans(ledger, experiment, host)

    def name(run_id: str) -> str:
        return label(run_id) or run_id

    kept = record_kept(ledger, keeper, undone(), name, host)
    return notes + [f"{name(run_id)}: recorded its kept result (not retrained)" for run_id in kept.recorded] + kept.notes
