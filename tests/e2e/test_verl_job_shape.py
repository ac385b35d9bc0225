"""The paper's verl job shape on a multi-node Ray cluster with no GPUs: ``ray.cluster_utils.Cluster``
with a head (2 CPUs, the Job API) and two nodes of 8 fake GPUs each, all on this machine.

``dapo-ablate run --address`` submits each cell as a Ray job of ``executor.gpus_per_run: 16`` on
nodes of 8. verl needs GPUs, so the job's ``verl.trainer.main_ppo`` here is a stand-in (in a
folder on every node's PYTHONPATH, with verl 0.9.1's distribution metadata so the cluster check
passes) that does what verl does with the shape: it reads ``trainer.nnodes`` and
``trainer.n_gpus_per_node``, reserves one bundle of that many GPUs per node as a STRICT_SPREAD
placement group (verl's resource pool), records where the bundles landed and what it was given,
checks from a task on a GPU node that our package is the copy the job shipped, and logs verl's
validation metric into the cell's MLflow run. Everything else is the product: the driver, the
cluster check, the job's submission, the read-back.

- Each job receives exactly the entrypoint ``run --dry-run`` printed for its cell, and its bundles
  land on the two GPU nodes.
- The task that submits and watches a job holds no GPU: the cluster has 16 GPUs and the job's
  placement group takes all 16 (a watcher holding GPUs, as before, would never be scheduled, or
  would starve the job).
- A job of 24 GPUs (3 nodes of 8) cannot be placed: exit 2 with one sentence, nothing submitted.
- A job on two nodes logging into a SQLite store is refused the same way (the preflight): the
  experiment runs on a PostgreSQL MLflow store, and its model folder and parquet files exist (the
  cluster check looks for them on every node), as does a flash-attn stand-in (verl's defaults need it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.store.ledger import SQLLedger

from test_ray_cluster import dapo_ablate_run, free_port, short_root  # noqa: F401 - fixture
from support import HANG_GUARD_S, pythonpath_with_tests
from test_verl_preflight import model_folder, write_parquet


BIN = Path(sys.executable).parent

MAIN_PPO = textwrap.dedent('''
    """Stand-in for verl's main_ppo: the job shape as verl's resource pool uses it (see the test)."""
    import json, os, sys
    from pathlib import Path

    import mlflow
    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    args = sys.argv[1:]
    overrides = dict(arg.lstrip("+").split("=", 1) for arg in args)
    nnodes, per_node = int(overrides["trainer.nnodes"]), int(overrides["trainer.n_gpus_per_node"])
    ray.init()  # the job's own cluster
    group = placement_group([{"GPU": per_node}] * nnodes, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=600)
    nodes = sorted(set(placement_group_table(group)["bundles_to_node_id"].values()))

    @ray.remote(num_gpus=1, num_cpus=0)
    def shipped():
        import dapo_ablate.ablation.runtime.backends.verl_loss as loss
        return loss.__file__

    loss_file = ray.get(shipped.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)).remote())
    folder = Path(overrides["trainer.default_local_dir"]).parent
    folder.mkdir(parents=True, exist_ok=True)
    record = {"args": args, "nodes": nodes, "loss_file": loss_file,
              "env": {key: os.environ.get(key) for key in ("VERL_USE_EXTERNAL_MODULES", "DAPO_ABLATE_MAX_RESPONSE_LEN")}}
    (folder / "stand-in.json").write_text(json.dumps(record))
    total, k = int(overrides["trainer.total_training_steps"]), int(overrides["actor_rollout_ref.rollout.val_kwargs.n"])
    with mlflow.start_run():  # MLFLOW_RUN_ID: the cell's child run
        for step in range(1, total + 1):
            mlflow.log_metric("response_length/mean", 10.0, step=step)
        for step in (0, total):
            mlflow.log_metric(f"val-core/test/acc/mean_at_{k}", 0.25 + 0.1 * step, step=step)
''')


def fake_verl(site: Path) -> None:
    """verl's main_ppo stand-in, and the distributions the cluster check asks for."""
    (site / "verl" / "trainer").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    (site / "verl" / "trainer" / "__init__.py").write_text("")
    (site / "verl" / "trainer" / "main_ppo.py").write_text(MAIN_PPO)
    (site / "flash_attn").mkdir()
    (site / "flash_attn" / "__init__.py").write_text("")
    for name, version in (("verl", "0.9.1"), ("TransferQueue", "0.1.11"), ("vllm", "0.32.0"), ("flash_attn", "2.8.3")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def verl_spec(folder: Path, gpus_per_run: int, tracking_uri: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    model = model_folder(folder / "models" / "Qwen2.5-32B")
    train = write_parquet(folder / "dapo-math-17k.parquet", ["1+1", "2+2", "3+3", "4+4"])
    trainer = {
        "backend": "verl", "model": {"path": str(model)},
        "data": {"train": str(train), "eval": str(write_parquet(folder / "aime-2024.parquet", ["1+2"]))},
        "rollout": {"engine": "vllm", "max_response_len": 64, "eval_k": 4},
        "algorithm": {"group_size": 4, "overlong_cache": 16},
        "batch": {"prompts_per_step": 4, "mini_batch_size": 16},
        "schedule": {"total_steps": 2, "eval_every": 2},
    }
    spec = {
        "name": "shape", "trainer": trainer, "factors": ["overlong_filter"], "seeds": 1, "metric": "avg@4",
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": tracking_uri or f"sqlite:///{out}/mlflow.db"},
        "executor": {"gpus_per_run": gpus_per_run, "gpus_per_node": 8, "cpus_per_run": 0, "max_concurrent": 1,
                     "retries": 0, "run_timeout_s": 1800},  # a bound for a broken build only
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


SUBMITTED = (
    "import json, sys\n"
    "from ray.job_submission import JobSubmissionClient\n"
    "jobs = JobSubmissionClient(sys.argv[1]).list_jobs()\n"
    "print(json.dumps([{'sid': j.submission_id, 'entrypoint': j.entrypoint} for j in jobs if j.submission_id]))\n"
)


def submitted_jobs(cluster: "GpuCluster") -> list[dict]:
    result = subprocess.run([sys.executable, "-c", SUBMITTED, f"http://127.0.0.1:{cluster.dashboard_port}"],
                            env=cluster.env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def own_ports() -> dict[str, int]:
    return {name: free_port() for name in ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port",
                                           "runtime_env_agent_port", "node_manager_port", "object_manager_port")}


class GpuCluster:
    """A head and `nodes` nodes of `gpus` fake GPUs (ray.cluster_utils.Cluster: its own ports per
    node) in a private Ray temp folder, with `python_path` on every node's PYTHONPATH."""

    def __init__(self, root: Path, nodes: int, gpus: int, python_path: str) -> None:
        from ray.cluster_utils import Cluster

        self.saved = {key: os.environ.get(key) for key in
                      ("RAY_TMPDIR", "PYTHONPATH", "PATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN", "RAY_ADDRESS")}
        # what the nodes' processes inherit; a job's `python3` is this environment's, as on a cluster's image;
        # token authentication explicitly off: Ray 2.60 turns it on by itself when ~/.ray/auth_token
        # exists, while this process's Ray client keeps the mode it read at import (tokens are
        # tested on a `ray start` head in tests/e2e/test_ray_cluster.py)
        for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
            os.environ.pop(key, None)
        os.environ.update(RAY_TMPDIR=str(root), PYTHONPATH=python_path, PATH=os.pathsep.join([str(BIN), os.environ["PATH"]]),
                          RAY_AUTH_MODE="disabled")
        self.dashboard_port = free_port()
        self.cluster = Cluster(shutdown_at_exit=True)
        try:
            # every port a node listens on is a free one: other Ray clusters may run on this machine
            # (a dashboard agent's default 52365, taken, leaves the Job API without its agent)
            self.cluster.add_node(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1",
                                  dashboard_port=self.dashboard_port, **own_ports())
            for _ in range(nodes):
                self.cluster.add_node(num_cpus=1, num_gpus=gpus, **own_ports())
            self.cluster.wait_for_nodes()
        except BaseException:
            self.shutdown()
            raise
        self.address = self.cluster.address
        self.env = dict(os.environ)  # a client's

    def shutdown(self) -> None:
        self.cluster.shutdown()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
def test_the_paper_job_shape_is_placed_on_two_nodes_with_the_entrypoint_the_dry_run_printed(
        short_root: Path, tmp_path: Path, postgres_mlflow_url: str):
    site = tmp_path / "site"
    fake_verl(site)
    cluster = GpuCluster(short_root, nodes=2, gpus=8,
                         python_path=pythonpath_with_tests(str(site)))
    try:
        env = cluster.env
        on_sqlite = verl_spec(tmp_path / "sqlite", gpus_per_run=16)
        refused = dapo_ablate_run(on_sqlite, "--address", cluster.address, env=env)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "is a SQLite file, which the 2 nodes of one verl job cannot write safely" in refused.stderr
        assert not (tmp_path / "sqlite" / "out" / "ledger.db").exists()

        too_big = verl_spec(tmp_path / "big", gpus_per_run=24, tracking_uri=postgres_mlflow_url)
        refused = dapo_ablate_run(too_big, "--address", cluster.address, env=env)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "needs 3 node(s) with 8 GPUs each, and the Ray cluster has 2 such node(s)" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (tmp_path / "big" / "out" / "ledger.db").exists()  # no run recorded, no job submitted

        spec = verl_spec(tmp_path / "paper", gpus_per_run=16, tracking_uri=postgres_mlflow_url)
        dry = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--dry-run"], cwd=spec.parent, env=env,
                             capture_output=True, text=True, timeout=600)
        assert dry.returncode == 0, dry.stderr[-3000:]
        printed = dict(re.findall(r"^  \[(.+?)\] (.*)$", dry.stdout, flags=re.M))
        assert len(printed) == 2 and "2 node(s) x 8 GPU(s)" in dry.stdout

        result = dapo_ablate_run(spec, "--address", cluster.address, env=env, timeout=3600)
        assert result.returncode == 0, result.stderr[-3000:]

        jobs = {job["sid"]: job for job in submitted_jobs(cluster)}
        with SQLLedger(f"sqlite:///{tmp_path / 'paper' / 'out' / 'ledger.db'}") as ledger:
            rows = ledger.runs_table("shape")
            results = ledger.results("shape")
        assert len(rows) == 2 and all(row["status"] == "done" for row in rows)
        assert sorted(r["metrics"]["avg@4"] for r in results) == pytest.approx([0.45, 0.45])  # read back from MLflow
        gpu_nodes = set()
        for row in rows:
            run_dir = tmp_path / "paper" / "out" / "shape" / row["run_id"]
            job = jobs[json.loads((run_dir / "job.json").read_text())["submission_id"]]
            name = next(name for name in printed if (run_dir / "checkpoints").as_posix() in printed[name])
            assert job["entrypoint"] == printed[name]  # exactly what the dry run printed
            record = json.loads((run_dir / "stand-in.json").read_text())
            assert record["args"] == shlex.split(printed[name])[3:]
            assert {"trainer.nnodes=2", "trainer.n_gpus_per_node=8"} <= set(record["args"])
            assert len(record["nodes"]) == 2  # one bundle of 8 GPUs on each GPU node
            gpu_nodes |= set(record["nodes"])
            assert record["env"] == {"VERL_USE_EXTERNAL_MODULES": "dapo_ablate.ablation.runtime.backends.verl_loss",
                                     "DAPO_ABLATE_MAX_RESPONSE_LEN": "64"}
            assert "runtime_resources" in record["loss_file"]  # the shipped copy, not this checkout
        assert len(gpu_nodes) == 2
    finally:
        cluster.shutdown()
