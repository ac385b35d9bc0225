"""Ctrl-C and SIGTERM stop the driver even when a library swallows their KeyboardInterrupt.

A Ctrl-C landing while `import ray` initialises ray._raylet is raised inside Cython's set-up of
that module, which discards it ("Exception ignored in: <module 'collections.abc'>"); the driver
then ran the whole experiment (the chaos campaign's driver alive 90 s after Ctrl-C). The
signal itself is remembered and the driver stops at its next step. Here the swallowing is done
by the test, around a real signal sent to this process. A Ctrl-C while Ray starts is held until
it has started (cut short, it crashed the driver), and what an interrupted ray.init had started
does not outlive it.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_stop_signals_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dapo_ablate.ablation.runtime import executor as executor_module
from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
from dapo_ablate.ablation.runtime.ray_connect import connect_ray
from dapo_ablate.ablation.runtime.signals import Interrupted
from dapo_ablate.ablation.experiment.spec import load_spec

from support import write_spec


def ctrl_c_swallowed() -> None:
    """Ctrl-C arrives, and its KeyboardInterrupt is swallowed as Cython's module set-up does."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)  # the handler interrupts this sleep
    except KeyboardInterrupt:
        return
    raise AssertionError("SIGINT did not interrupt the sleep")


def alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_ctrl_c_swallowed_while_ray_starts_stops_before_anything_is_written(tmp_path, monkeypatch):
    def swallowed_while_starting(address, spec):
        ctrl_c_swallowed()
        return False  # Ray "started" as if nothing had happened

    monkeypatch.setattr(executor_module, "connect_ray", swallowed_while_starting)
    spec = load_spec(write_spec(tmp_path))
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as caught:
        run_experiment(spec, expand(spec), options=RunOptions(progress=False))
    assert caught.value.exit_code == 130
    assert not (tmp_path / "out" / "ledger.db").exists()  # nothing claimed or recorded
    assert {signum: signal.getsignal(signum) for signum in before} == before  # the caller's handlers are back


@pytest.mark.parametrize("handler", ["ours", "ray's"])
def test_a_sigterm_while_ray_starts_exits_143_with_nothing_written(tmp_path, monkeypatch, handler):
    def terminated_while_starting(address, spec):
        if handler == "ray's":  # what ray.init puts in place while it runs: sys.exit(15)
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the handler interrupts this sleep
        raise AssertionError("SIGTERM did not interrupt Ray's start")

    monkeypatch.setattr(executor_module, "connect_ray", terminated_while_starting)
    spec = load_spec(write_spec(tmp_path))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        run_experiment(spec, expand(spec), options=RunOptions(progress=False))
    assert caught.value.exit_code == 143  # (under Ray's handler: not 15 without a word)
    assert not (tmp_path / "out" / "ledger.db").exists()  # nothing claimed or recorded
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back


def test_a_sigterm_while_the_driver_opens_its_stores_exits_143_with_a_sentence(tmp_path, monkeypatch):
    def terminated_while_opening(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the handler interrupts this sleep
        raise AssertionError("SIGTERM did not interrupt the driver")

    monkeypatch.setattr(executor_module, "connect_ray", lambda address, spec: False)
    monkeypatch.setattr(ExperimentRun, "_open_stores", terminated_while_opening)
    spec = load_spec(write_spec(tmp_path))
    with pytest.raises(Interrupted) as caught:  # not a bare KeyboardInterrupt (Typer: a silent 130)
        run_experiment(spec, expand(spec), options=RunOptions(progress=False))
    assert caught.value.exit_code == 143 and "nothing was run" in str(caught.value)


def test_what_an_interrupted_ray_init_started_does_not_outlive_it(tmp_path, monkeypatch):
    import ray

    if ray.is_initialized():
        pytest.skip("needs a process without Ray (this module's local_ray starts after this test)")
    started = []

    def interrupted_init(**kwargs):
        """ray.init as far as a Ctrl-C lets it go: a process (the raylet) that has started one
        of its own (an agent, which outlives its orphaned parent), then the interrupt."""
        raylet = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                   "agent = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                                   "print(agent.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        started.extend([raylet, int(raylet.stdout.readline())])
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "init", interrupted_init)
    with pytest.raises(KeyboardInterrupt):
        connect_ray(None, load_spec(write_spec(tmp_path)))
    raylet, agent = started
    assert raylet.wait(timeout=60) == -signal.SIGKILL  # (a safety net for a live one, not a time budget)
    deadline = time.monotonic() + 60  # the same safety net: the agent, not this process's child, is polled
    while alive(agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(agent)


@pytest.mark.parametrize("presses", [1, 2])
def test_a_ctrl_c_while_ray_starts_is_held_until_it_has_started_and_a_second_one_is_not(tmp_path, monkeypatch, presses):
    import ray

    if ray.is_initialized():
        pytest.skip("needs a process without Ray (this module's local_ray starts after this test)")
    steps = []

    def init(**kwargs):
        """ray.init: a Ctrl-C (or two) while it starts its core worker, which must not be cut short."""
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("ctrl-c")
        steps.append("started")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(KeyboardInterrupt):
        connect_ray(None, load_spec(write_spec(tmp_path)))
    assert steps == (["ctrl-c", "started"] if presses == 1 else ["ctrl-c"])
