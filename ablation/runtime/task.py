"""The Ray task of every run (`execute_run`), which cell function it runs (`resolve_cell_fn`), and
how a run's error becomes one ledger line (`describe_error`)."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.core.atomic import own_folder

CELL_FN_ENV = "DAPO_ABLATE_CELL_FN"
STARTED = "started"
"""The event every task sends first, once a Ray worker runs it: its run's time limit counts from
there (`pool.RunPool`), so time spent waiting for a worker on a loaded machine is not the run's."""
"""Test/debug hook: ``module:function`` replacing `run_cell` as every task's body."""
_ERROR_CHARS = 2000


def resolve_cell_fn(cell_fn: Callable[..., dict[str, Any]] | None) -> Callable[..., dict[str, Any]]:
    """The given cell function, else ``$DAPO_ABLATE_CELL_FN`` (module:function), else `run_cell`."""
    if cell_fn is not None:
        return cell_fn
    target = os.environ.get(CELL_FN_ENV)
    if not target:
        return run_cell
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ExecutorError(f"{CELL_FN_ENV}={target!r} does not name a function ({err}); use module:function") from None
    return fn


def describe_error(err: BaseException) -> str:
    """One line for the ledger: ``Type: message (at file:line in function)``; for an error
    raised inside a task, the type, message and last frame of the remote traceback."""
    from ray.exceptions import RayTaskError

    cause, where = err, ""
    if isinstance(err, RayTaskError):
        # Ray raises a subclass of both RayTaskError and the cause's type; str() holds the
        # remote traceback.
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(err))
        if frames:
            path, line, function = frames[-1]
            where = f" (at {Path(path).name}:{line} in {function})"
        inner = getattr(err, "cause", None)
        cause = inner if isinstance(inner, BaseException) else err
    lines = str(cause).strip().splitlines() if cause is not err or not isinstance(err, RayTaskError) else []
    message = lines[0].strip() if lines else ""
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    return (text + where)[:_ERROR_CHARS]


def execute_run(cell_fn: Callable[..., dict[str, Any]], config: dict[str, Any], run_dir: str, eval_cache_dir: str,
             events: Any = None, run_id: str = "", env: dict[str, str] | None = None) -> dict[str, Any]:
    """The Ray task of every run (`ablation.pool`): one run, with `env` set in its environment.
    A cell function taking ``on_event`` sends its training steps, evaluations and job ids to the
    driver through `events` (a Ray queue) while it trains (live MLflow, a sweep's pruner); one
    taking only ``on_eval`` sends its evaluations."""
    import inspect

    from dapo_ablate.ablation.runtime.quiet import silence_third_party_output

    silence_third_party_output()  # the driver's display owns the terminal
    os.environ.update(env or {})
    own_folder(run_dir)  # a link planted as the run's folder is replaced: nothing the run writes lands outside
    if events is not None:  # the run's time limit counts from here, not from its wait in Ray's queue
        _send(events, (run_id, STARTED, 0, {}))
    try:
        accepted = set(inspect.signature(cell_fn).parameters)
    except (TypeError, ValueError):
        accepted = set()
    if events is None or not accepted & {"on_event", "on_eval"}:
        return cell_fn(config, run_dir, eval_cache_dir)

    def on_event(kind: str, step: int, data: dict[str, Any]) -> None:
        _send(events, (run_id, kind, int(step), dict(data)))

    if "on_event" in accepted:
        return cell_fn(config, run_dir, eval_cache_dir, on_event=on_event)
    return cell_fn(config, run_dir, eval_cache_dir, on_eval=lambda step, metrics: on_event("eval", step, metrics))


def _send(events: Any, event: tuple[str, str, int, dict[str, Any]]) -> None:
    try:
        events.put_nowait(event)
    except Exception:  # noqa: BLE001 - a driver gone or a full queue never stops the training
        pass
