"""Ray clusters started by ``ray start --head``, as a user's machine has them.

A head is started with token authentication on (``RAY_AUTH_MODE=token`` and a token file, what
Ray 2.60's ``ray start --head`` does when a token exists) in a private ``RAY_TMPDIR``, so that its
current-cluster file is this test's and no other Ray on the machine is touched. Then:

- ``dapo-ablate run --address`` trains a tiny built-in experiment on it with the token from the
  environment, and without the token (or with a wrong one in ``executor.auth_token_file``) exits 2
  with one sentence about the token, writing nothing;
- with ``executor.address`` null, ``dapo-ablate run`` starts its own Ray although the head's
  current-cluster file names a running cluster, or a stale file names a dead one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.runtime.reaper import kill_session

from tiny_configs import TINY_TRAINER
from support import HANG_GUARD_S, free_port, pythonpath_with_tests


BIN = Path(sys.executable).parent


def own_ports() -> list[str]:
    """`ray start` options giving every port a head listens on a free one: a default port another
    Ray on this machine holds (the dashboard agent's 52365 under pytest-xdist) leaves this head's
    Job API without its agent, and every job submission then hangs."""
    return [f"--{name}={free_port()}" for name in ("ray-client-server-port", "dashboard-agent-listen-port",
                                                   "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")]


class Head:
    """A `ray start --head --block` in its own session; stopped by killing that session only."""

    def __init__(self, root: Path, dashboard: bool = False, **env: str) -> None:
        self.root = root
        self.token_file = root / "head_token"
        self.token_file.write_text(secrets.token_hex(32))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_TMPDIR": str(root), "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(self.token_file), **env}
        self.env.pop("RAY_AUTH_TOKEN", None)
        self.dashboard_port = free_port() if dashboard else None
        board = ([f"--dashboard-port={self.dashboard_port}", "--dashboard-host=127.0.0.1"] if dashboard
                 else ["--include-dashboard=false"])
        self.process = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", f"--port={self.port}", "--node-ip-address=127.0.0.1",
             "--num-cpus=2", *board, *own_ports(), "--disable-usage-stats"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = HANG_GUARD_S) -> None:
        """Until the head has written its current-cluster file and its GCS answers."""
        address_file = self.root / "ray" / "ray_current_cluster"
        deadline = time.time() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"ray start --head exited: {self.process.stderr.read()[-2000:]}")
            if address_file.is_file():
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                    if self.dashboard_port:
                        socket.create_connection(("127.0.0.1", self.dashboard_port), timeout=2).close()
                    return
                except OSError:
                    pass
            if time.time() > deadline:
                raise AssertionError("ray start --head did not come up")
            time.sleep(0.2)

    def stop(self) -> None:
        kill_session(self.process.pid)
        self.process.wait(timeout=HANG_GUARD_S)


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A short folder (Ray's unix socket paths must stay under ~100 characters)."""
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def head(short_root: Path) -> Iterator[Head]:
    cluster = Head(short_root)
    try:
        yield cluster
    finally:
        cluster.stop()


def write_spec(folder: Path, trainer: dict | None = None, **executor: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    spec = {
        "name": "ray-cluster", "trainer": trainer or TINY_TRAINER, "factors": ["clip_higher"], "seeds": 1,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"max_concurrent": 2, "lease_s": 600, **executor},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def dapo_ablate_run(spec: Path, *args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        [str(BIN / "dapo-ablate"), "run", str(spec), "--no-progress", *args], cwd=spec.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        kill_session(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def client_env(head: Head, **extra: str) -> dict[str, str]:
    """A user's shell: the head's RAY_TMPDIR, no token settings unless given."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    env.pop("RAY_ADDRESS", None)
    return {**env, "RAY_TMPDIR": str(head.root), **extra}


def done_runs(spec: Path) -> int:
    with SQLLedger(f"sqlite:///{spec.parent / 'out' / 'ledger.db'}") as ledger:
        return sum(row["status"] == "done" for row in ledger.runs_table("ray-cluster"))


@pytest.mark.slow
def test_run_address_joins_a_token_cluster_with_the_token_and_exits_2_without_it(head: Head, tmp_path: Path):
    # no token anywhere (an empty HOME hides ~/.ray/auth_token): exit 2, a sentence about the token
    home = tmp_path / "home"
    home.mkdir()
    spec = write_spec(tmp_path)
    result = dapo_ablate_run(spec, "--address", head.address, env=client_env(head, HOME=str(home)))
    assert result.returncode == 2, result.stderr
    assert "uses token authentication and no token was found" in result.stderr
    assert "executor.auth_token_file" in result.stderr and "Traceback" not in result.stderr
    assert "check executor.address" not in result.stderr
    assert not (tmp_path / "out").exists()

    # a wrong token in the spec: exit 2, the token was refused
    wrong = tmp_path / "wrong_token"
    wrong.write_text(secrets.token_hex(32))
    spec = write_spec(tmp_path, auth_token_file=str(wrong))
    result = dapo_ablate_run(spec, "--address", head.address, env=client_env(head))
    assert result.returncode == 2, result.stderr
    assert f"refused the authentication token from executor.auth_token_file ({wrong})" in result.stderr
    assert not (tmp_path / "out").exists()

    # the head's token through RAY_AUTH_TOKEN_PATH: the tiny built-in experiment trains on the cluster
    spec = write_spec(tmp_path)
    result = dapo_ablate_run(spec, "--address", head.address, env=client_env(head, RAY_AUTH_TOKEN_PATH=str(head.token_file)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert done_runs(spec) == 2
    assert head.process.poll() is None  # joined, not replaced


@pytest.mark.slow
def test_local_run_starts_its_own_ray_beside_a_ray_start_cluster_and_a_stale_address_file(head: Head, tmp_path: Path):
    env = {**client_env(head), "DAPO_ABLATE_CELL_FN": "test_run_cli_e2e:sleepy_cell", "CELL_SLEEP_S": "0",
           "PYTHONPATH": pythonpath_with_tests()}
    # the running head's current-cluster file is where a bare ray.init() would look
    spec = write_spec(tmp_path / "beside")
    result = dapo_ablate_run(spec, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert done_runs(spec) == 2

    # a crashed cluster's file naming a dead address
    stale = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    try:
        (stale / "ray").mkdir()
        (stale / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
        spec = write_spec(tmp_path / "stale")
        result = dapo_ablate_run(spec, env={**env, "RAY_TMPDIR": str(stale)})
        assert result.returncode == 0, result.stderr[-3000:]
        assert done_runs(spec) == 2
    finally:
        shutil.rmtree(stale, ignore_errors=True)
