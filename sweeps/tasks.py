"""What a sweep's Ray task runs: the cell function, with its evaluations streamed to the driver.

The executor's task (`ablation.executor._execute`) returns a run's result only at the end; a
pruner needs the evaluations as they happen. `run_streaming` is a Ray generator task that passes
``on_eval(step, metrics)`` to the cell function and yields each evaluation, then the result.
`ablation.cell.run_cell` takes that callback. A cell function without an ``on_eval`` parameter
(the executor's `CellFn` signature) still works: its curve reaches the pruner only when it finishes.
"""

from __future__ import annotations

import inspect
import queue
import threading
from typing import Any, Callable


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
