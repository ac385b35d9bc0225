"""What a sweep's Ray task runs: the cell function, with its evaluations streamed to the driver.

The executor's task (`ablation.executor._execute`) returns a run's result only at the end; a
pruner needs the evaluations as they happen. `run_streaming` is a Ray generator task that passes
``on_eval(step, metrics)`` to the cell function and yields each evaluation, then the result.
`run_cell_with_evals` is `ablation.cell.run_cell` with that callback. A cell function without an
``on_eval`` parameter (the executor's `CellFn` signature) still works: its curve reaches the
pruner only when it finishes. `release_orphans` is the executor driver's orphan release.
These are the glue the executor could offer itself (see the sweep's hand-over notes).
"""

from __future__ import annotations

import inspect
import os
import queue
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.cell import ledger_result
from dapo_ablate.ablation.executor import CELL_FN_ENV, pid_alive, resolve_cell_fn
from dapo_ablate.ablation.ledger import RUNNING, Ledger


def sweep_cell_fn(cell_fn: Callable[..., dict[str, Any]] | None) -> Callable[..., dict[str, Any]]:
    """The given cell function, else ``$DAPO_ABLATE_CELL_FN``, else `run_cell_with_evals`."""
    if cell_fn is not None or os.environ.get(CELL_FN_ENV):
        return resolve_cell_fn(cell_fn)
    return run_cell_with_evals


def run_cell_with_evals(
    config_dict: dict[str, Any], run_dir: str, eval_cache_dir: str | None,
    on_eval: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`ablation.cell.run_cell`, calling ``on_eval(step, metrics)`` after each evaluation."""
    from dapo_ablate.core.config import build_trainer_config
    from dapo_ablate.core.trainer import train

    def callback(kind: str, step: int, data: dict[str, Any]) -> None:
        if kind == "eval" and on_eval is not None:
            on_eval(step, data)

    config = build_trainer_config(config_dict, source="run config")
    result = train(config, Path(run_dir), callbacks=[callback], resume=True, eval_cache_dir=eval_cache_dir)
    return ledger_result(result)


def accepts_on_eval(cell_fn: Callable[..., Any]) -> bool:
    try:
        return "on_eval" in inspect.signature(cell_fn).parameters
    except (TypeError, ValueError):
        return False


def run_streaming(cell_fn, config: dict[str, Any], run_dir: str, eval_cache_dir: str):
    """The Ray task (a generator): yields ``("eval", step, metrics)`` as the run evaluates, then
    ``("result", result)``. A cell function without an ``on_eval`` parameter yields only the result.

    The cell function runs in a thread so that its callback can hand evaluations to this
    generator; an exception in it is re-raised here, so the driver sees the run's own error."""
    if not accepts_on_eval(cell_fn):
        yield ("result", cell_fn(config, run_dir, eval_cache_dir))
        return
    events: queue.Queue = queue.Queue()
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = cell_fn(config, run_dir, eval_cache_dir,
                                        on_eval=lambda step, metrics: events.put((int(step), dict(metrics))))
        except BaseException as err:  # handed to the generator, which raises it in the task
            outcome["error"] = err
        finally:
            events.put(None)

    thread = threading.Thread(target=body, name="cell", daemon=True)
    thread.start()
    while (event := events.get()) is not None:
        yield ("eval", *event)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    yield ("result", outcome["result"])


def release_orphans(ledger: Ledger, experiment: str) -> int:
    """Runs left *running* by a dead driver process on this host go back to pending now; how many."""
    hostname, released = socket.gethostname(), 0
    for row in ledger.runs_table(experiment):
        holder, _, pid = (row["host"] or "").rpartition(":")
        if row["status"] == RUNNING and holder == hostname and pid.isdigit():
            if int(pid) != os.getpid() and not pid_alive(int(pid)):
                released += ledger.release(row["run_id"], host=row["host"])
    return released
