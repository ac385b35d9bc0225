"""Before any verl cell is submitted, every node is asked whether it can run one
(ablation/backends/verl_cluster.py): the Python it needs, our loss module importable there, the
MLflow store reachable from there and holding the experiment. Here the node is this machine's
local Ray, whose Python has no verl: the check names what is missing in one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl_cluster import NodeNeeds, check_cluster, node_problems
from dapo_ablate.ablation.runtime.backends.verl_job import REQUIREMENTS
from dapo_ablate.ablation.store.errors import ExecutorError


def store_with(tmp_path: Path, experiment: str | None) -> str:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    if experiment:
        client.create_experiment(experiment)
    else:
        client.search_experiments()  # the store exists, without the experiment
    return uri


def test_a_node_without_verl_a_store_it_cannot_see_or_another_store_is_named(tmp_path: Path):
    uri = store_with(tmp_path, "paper")
    def needs(requirements: dict, uri: str, modules: list) -> NodeNeeds:
        return NodeNeeds(requirements, uri, "paper", modules=modules, python=None)

    problems = node_problems(needs({"verl": "==0.9.1", "mlflow": ">=3.0"}, uri, ["dapo_ablate.ablation.runtime.backends.verl_loss"]))
    assert problems == ["verl is not installed (need verl==0.9.1)"]  # mlflow and our module are there
    assert node_problems(needs({"mlflow": "<1.0"}, uri, []))[0].startswith("mlflow 3.")
    assert "`import no_such_module_here` fails" in node_problems(needs({}, uri, ["no_such_module_here"]))[0]
    # a SQLite file this node does not have (a driver's local disk): named, and not created here
    missing = tmp_path / "elsewhere" / "mlflow.db"
    assert "is not on this node's disk" in node_problems(needs({}, f"sqlite:///{missing}", []))[0]
    assert not missing.exists()
    # a store that is there but is not the driver's (no such experiment)
    (tmp_path / "other").mkdir()
    other = store_with(tmp_path / "other", None)
    assert "has no experiment 'paper'" in node_problems(needs({}, other, []))[0]


def test_check_cluster_runs_on_every_node_and_refuses_in_one_sentence(local_ray, tmp_path: Path):
    uri = store_with(tmp_path, "paper")
    with pytest.raises(ExecutorError) as err:
        check_cluster({"env_vars": {}}, NodeNeeds(REQUIREMENTS, uri, "paper", modules=["dapo_ablate.ablation.runtime.backends.verl_loss"], python=None))
    message = str(err.value)
    assert message.startswith("the Ray cluster cannot run verl cells: on node ")
    assert "verl is not installed (need verl==0.9.1)" in message and "TransferQueue is not installed" in message
    assert "pip install 'dapo-ablate[verl]'" in message and "\n" not in message
    check_cluster({"env_vars": {}}, NodeNeeds({"mlflow": ">=3.0"}, uri, "paper", python=None))  # what this node has: no error
