"""Stop signals: Ctrl-C and SIGTERM as one clean cancel (exit 130 / 143), remembered where a
library swallowed their KeyboardInterrupt, and held back while Ray cannot be interrupted."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143  # 128 + SIGTERM, what schedulers and `kill` expect


def stopped_at_start(stopped: BaseException, stop: StopSignals, started_ray: bool,
                     kind: type[Interrupted] | None = None) -> Interrupted:
    """The `Interrupted` (or `kind`) for a Ctrl-C or SIGTERM that came before a driver started,
    once the Ray it had started is shut down. A SystemExit is Ray's own SIGTERM handler (sys.exit,
    in place while ray.init runs) only with code 15; any other is raised again as it is."""
    by_ray = isinstance(stopped, SystemExit)
    if by_ray and stopped.code != signal.SIGTERM:
        raise stopped
    if started_ray:
        import ray

        ray.shutdown()
    return (kind or Interrupted)(bool(stop.received) or by_ray)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM before any run started (during the checks, Ray's start, or while the
    driver opened its stores: `written`): nothing was claimed or trained. `exit_code`: 130, or
    143 for SIGTERM."""

    def __init__(self, terminated: bool, written: bool = False) -> None:
        super().__init__("interrupted before any run started; nothing was run" + ("" if written else " or written"))
        self.exit_code = TERMINATED_EXIT if terminated else INTERRUPTED_EXIT


class StopSignals:
    """SIGTERM, and Ctrl-C (SIGINT) where Python's default handler has it, raising
    KeyboardInterrupt in the main thread while installed, and remembered: `received` lists the
    SIGTERMs that came (the exit status is then 143), `signals` every stop signal.

    Remembered because a KeyboardInterrupt can be swallowed before it reaches the driver: a Ctrl-C
    landing while `import ray` initialises ray._raylet is raised inside Cython's set-up of that
    module, which discards it ("Exception ignored in: <module 'collections.abc'>", "Cython module
    failed to patch module with custom type"), and the driver then ran the whole experiment.
    `check()`, once Ray has started and at every step of the driver's loop, raises it again."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.signals: list[int] = []
        self.previous: dict[int, Any] = {}
        """Signal -> the handler in place before the first `install()`."""

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if signum == signal.SIGTERM:
            self.received.append(signum)
        raise KeyboardInterrupt

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(signum)
            if signum == signal.SIGINT and current not in (signal.default_int_handler, self._on_signal):
                continue  # ignored (a background job: Ctrl-C is not for it) or the caller's own handler
            previous = signal.signal(signum, self._on_signal)
            self.previous.setdefault(signum, previous)

    def restore(self) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stop signal came (its own KeyboardInterrupt may have been
        swallowed on the way)."""
        if self.signals:
            raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[StopSignals]:
    """Within the block, SIGTERM is a clean cancel exactly like Ctrl-C: it raises
    KeyboardInterrupt in the main thread (runs in flight go back to pending, the summary is
    printed, the MLflow parent is KILLED; before the driver starts, `Interrupted`), and both are
    remembered for `check()`. Ray's start-up installs its own SIGTERM handler (which aborts the
    process with a stack dump): call ``install()`` again after it. Outside the main thread (no
    signals there) it does nothing."""
    stop = StopSignals()
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Within the block a Ctrl-C is held back and raised as the block ends (a second one
    interrupts at once). Ray cannot be interrupted safely while it is imported or starts: a
    KeyboardInterrupt inside ray.init's connect() leaves a half-built core worker whose io thread
    then crashes the driver (SIGSEGV in CoreWorker::RecordMetrics, after the "interrupted"
    sentence), and one while ray._raylet initialises is discarded by Cython. An ignored SIGINT (a
    background job) or one outside the main thread is left alone."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        previous(signal.SIGINT, None)  # the caller's handler: KeyboardInterrupt, remembered by a stop handler
