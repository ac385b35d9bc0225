"""The verl preflight asks every node, not the driver's: a Ray cluster of two nodes on this machine
(``ray.cluster_utils.Cluster``) whose environments differ as a real cluster's can. The head is set
up as a cluster image should be: flash-attn importable (a stand-in package with its distribution
metadata, on that node's PYTHONPATH) and this environment's ``python3`` first on PATH. The second
node has no flash-attn and a PATH whose ``python3`` is the system interpreter (another environment
than the one Ray runs its workers in). Both see the same model folder, parquet files and MLflow
store (one machine's disk, as shared storage).

`cluster_problems` must report nothing for the head and exactly the second node's three problems
under that node's id; `check_cluster` refuses in one sentence naming that node and the fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl_cluster import FLASH_ATTN, NodeNeeds, check_cluster, cluster_problems
from dapo_ablate.ablation.store.errors import ExecutorError

from test_ray_cluster import short_root  # noqa: F401 - fixture
from test_verl_job_shape import own_ports
from test_verl_preflight import model_folder, write_parquet

BIN = Path(sys.executable).parent
NODE_ENV = ("PYTHONPATH", "PATH", "RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


def fake_flash_attn(site: Path) -> Path:
    (site / "flash_attn").mkdir(parents=True)
    (site / "flash_attn" / "__init__.py").write_text("__version__ = '2.8.3'\n")
    info = site / "flash_attn-2.8.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\n")
    return site


def system_python3(folder: Path) -> Path:
    folder.mkdir()
    system = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists()), None)
    if system is None or Path(system).resolve() == Path(sys.executable).resolve():
        pytest.skip("no system python3 other than this environment's")
    (folder / "python3").symlink_to(system)
    return folder


@pytest.mark.slow
def test_each_node_is_checked_in_its_own_environment(short_root: Path, tmp_path: Path):
    import mlflow
    import ray
    from ray.cluster_utils import Cluster

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment("paper")
    needs = NodeNeeds({"mlflow": ">=3.0", **FLASH_ATTN}, uri, "paper", modules=["flash_attn"],
                      model_paths=[str(model_folder(tmp_path / "Qwen2.5-0.5B"))],
                      data_files={str(write_parquet(tmp_path / "aime.parquet", ["p1", "p2"])): "data.eval"})
    site = fake_flash_attn(tmp_path / "site")
    other_bin = system_python3(tmp_path / "other-bin")
    saved = {key: os.environ.get(key) for key in NODE_ENV}
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        os.environ.pop(key, None)
    cluster = Cluster(shutdown_at_exit=True)
    try:
        # what each node's raylet, and so its workers, inherit from this process when it is added
        os.environ.update(RAY_TMPDIR=str(short_root), RAY_AUTH_MODE="disabled", PYTHONPATH=str(site),
                          PATH=os.pathsep.join([str(BIN), saved["PATH"] or ""]))
        good = cluster.add_node(num_cpus=1, include_dashboard=False, **own_ports())
        os.environ.update(PYTHONPATH="", PATH=os.pathsep.join([str(other_bin), saved["PATH"] or ""]))
        bad = cluster.add_node(num_cpus=1, **own_ports())
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        found = cluster_problems({"env_vars": {}}, needs)
        by_node = {where: problems for where, problems in found.items()}
        assert len(by_node) == 2
        assert next(p for w, p in by_node.items() if good.node_id[:8] in w) == []
        problems = next(p for w, p in by_node.items() if bad.node_id[:8] in w)
        assert problems[0] == "flash-attn is not installed (need flash-attn>=2.7)"
        assert problems[1].startswith("`import flash_attn` fails (ModuleNotFoundError")
        assert problems[2].startswith(f"the jobs' entrypoint runs `python3` = {other_bin / 'python3'} (environment ")
        assert len(problems) == 3
        with pytest.raises(ExecutorError) as refused:
            check_cluster({"env_vars": {}}, needs)
        message = str(refused.value)
        assert bad.node_id[:8] in message and good.node_id[:8] not in message and "\n" not in message
        assert message.endswith("with flash-attn: 'dapo-ablate[verl-gpu]'")
    finally:
        ray.shutdown()
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
