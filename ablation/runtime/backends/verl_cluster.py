"""Before any verl cell is submitted: can every node of the cluster run one?

A verl job's workers land on any node, so each node's Python must have verl and what it needs
(`verl_job.REQUIREMENTS`), must import this package as the job ships it (``py_modules``), and must
reach the MLflow store the job logs into. Without this check the failures come late and quietly: a
node without TransferQueue fails the job after minutes of start-up, and a node that cannot open a
SQLite file on the driver's disk makes verl go on "without MLflow tracking" (it swallows the error),
train to the end, and leave nothing to read back.

`check_cluster` runs `node_problems` once on every alive node (a zero-CPU Ray task pinned to the
node, with the jobs' runtime environment) and raises one sentence naming the first node's problems.
"""

from __future__ import annotations

from typing import Any

from dapo_ablate.ablation.store.errors import ExecutorError

CHECK_TIMEOUT_S = 600.0
"""A node's check may have to download the shipped package and import torch and verl first."""


def node_problems(requirements: dict[str, str], tracking_uri: str, experiment: str, modules: list[str]) -> list[str]:
    """What keeps this node's Python from running a verl cell (empty when nothing does)."""
    problems = _missing_requirements(requirements)
    for module in modules:
        try:
            __import__(module)
        except Exception as err:  # noqa: BLE001 - any failure to import is the finding
            problems.append(f"`import {module}` fails ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})")
    problem = _tracking_problem(tracking_uri, experiment)
    if problem:
        problems.append(problem)
    return problems


def _missing_requirements(requirements: dict[str, str]) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems = []
    for name, spec in requirements.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            problems.append(f"{name} is not installed (need {name}{spec})")
            continue
        if not SpecifierSet(spec).contains(Version(found).public, prereleases=True):
            problems.append(f"{name} {found} is installed (need {name}{spec})")
    return problems


def _tracking_problem(uri: str, experiment: str) -> str | None:
    """None when this node can open the MLflow store and finds the experiment in it (a SQLite file
    is never created here: a missing one means the node does not see the driver's file)."""
    from pathlib import Path

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return (f"the MLflow store {uri} is not on this node's disk (a SQLite file the driver's node alone sees); "
                "use an MLflow server (tracking.uri: http://...) or a database every node reaches")
    if uri.startswith("file:"):
        return f"the MLflow store {uri} is a local folder; use an MLflow server or a database every node reaches"
    try:
        from mlflow.tracking import MlflowClient

        found = MlflowClient(uri).get_experiment_by_name(experiment)
    except Exception as err:  # noqa: BLE001 - unreachable, refused, wrong credentials: the finding
        return f"the MLflow store {uri} cannot be opened here ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})"
    if found is None:
        return f"the MLflow store {uri} seen from here has no experiment {experiment!r} (another store than the driver's)"
    return None


def _uploaded(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """`runtime_env` with its local py_modules folders uploaded to the cluster (a task's runtime
    environment takes only URIs; Ray keeps an upload for 10 minutes unless a job refers to it,
    which is enough for the check: the jobs upload the same copy themselves through the Job API)."""
    import tempfile

    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    return upload_py_modules_if_needed(dict(runtime_env), include_gitignore=False, scratch_dir=tempfile.gettempdir())


def check_placement(nnodes: int, gpus_per_node: int) -> None:
    """Raise ExecutorError (one sentence) unless the connected cluster has `nnodes` alive nodes with
    `gpus_per_node` GPUs each: verl's resource pool places one bundle of that many GPUs per node,
    and a job that cannot be placed would wait for nodes that never come."""
    import ray

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    fitting = sum(node.get("Resources", {}).get("GPU", 0) >= gpus_per_node for node in nodes)
    if fitting < nnodes:
        total = sum(node.get("Resources", {}).get("GPU", 0) for node in nodes)
        raise ExecutorError(
            f"a verl job of executor.gpus_per_run {nnodes * gpus_per_node:g} needs {nnodes} node(s) with "
            f"{gpus_per_node} GPUs each, and the Ray cluster has {fitting} such node(s) ({total:g} GPUs on {len(nodes)} "
            "node(s)); start the nodes first, or lower executor.gpus_per_run / gpus_per_node"
        )


def check_cluster(runtime_env: dict[str, Any], requirements: dict[str, str], tracking_uri: str, experiment: str,
                  modules: list[str]) -> None:
    """Run `node_problems` on every alive node of the connected Ray cluster; raise ExecutorError
    (one sentence) for the first node that has any."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    runtime_env = _uploaded(runtime_env)
    check = ray.remote(num_cpus=0, max_retries=0)(node_problems)
    refs = {
        node["NodeManagerAddress"] + (f" ({node['NodeID'][:8]})" if len(nodes) > 1 else ""): check.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False), runtime_env=runtime_env,
        ).remote(requirements, tracking_uri, experiment, modules)
        for node in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
    for where, ref in refs.items():
        if ref not in ready:
            raise ExecutorError(f"node {where} did not answer the verl check within {CHECK_TIMEOUT_S:.0f} s; is it alive?")
        try:
            problems = ray.get(ref)
        except Exception as err:  # noqa: BLE001 - e.g. the runtime environment could not be set up there
            problems = [f"the check could not run ({type(err).__name__}: {str(err).strip().splitlines()[-1][:200]})"]
        if problems:
            raise ExecutorError(
                f"the Ray cluster cannot run verl cells: on node {where}, {'; '.join(problems)}; install the cluster's "
                "Python as the README's 'Cluster scale on verl' says (pip install 'dapo-ablate[verl]' on every node)"
            )
