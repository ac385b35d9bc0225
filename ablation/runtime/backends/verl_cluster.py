"""Before any verl cell is submitted: can every node of the cluster run one?

A verl job's workers land on any node, so each node's Python must have verl and what it needs
(`verl_job.REQUIREMENTS`, plus flash-attn when the cells' config uses it: ``verl.needs_flash_attn``),
must import this package as the job ships it (``py_modules``), must be the Python the job's
entrypoint runs (its ``python3`` on that node's PATH), must see the model folder and the parquet
files at the paths the cells name, and must reach the MLflow store the job logs into. Without this
check the failures come late and quietly: a node without flash-attn or the model fails every cell
at model start-up after all its GPUs were allocated, and a node that cannot open a SQLite file on
the driver's disk makes verl go on "without MLflow tracking" (it swallows the error), train to the
end, and leave nothing to read back. A SQLite or file store is refused outright for a job on several
nodes (`check_shared_tracking`): SQLite's locking over NFS / Lustre is unreliable, and verl drops a
write that still fails after its retries.

Several verl jobs at once on one Ray cluster: verl 0.9.1's TransferQueue (0.1.11) would share one
controller between them (a fixed actor name in a fixed Ray namespace); `verl_isolation` gives each
job its own namespace in every process of the job. What a namespace cannot separate, a cell's
TransferQueue backend other than SimpleStorage (Mooncake's master at fixed addresses) or a fixed
metrics port, keeps those cells one at a time: `concurrent_jobs_problem` refuses a spec that asks for
more of them, and `jobs_at_once` caps the driver at one.

`check_cluster` runs `node_problems` once on every alive node (a zero-CPU Ray task pinned to the
node, with the jobs' runtime environment) and raises one sentence naming the first node's problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.runtime.backends.verl import ENTRYPOINT_PYTHON, LOSS_MODULE, needs_flash_attn
from dapo_ablate.ablation.runtime.backends.verl_data import data_file_problem, model_path_problem
from dapo_ablate.ablation.runtime.backends.verl_isolation import shared_transfer_queue_setting
from dapo_ablate.ablation.store.errors import ExecutorError

if TYPE_CHECKING:
    from dapo_ablate.core.config import TrainerConfig

CHECK_TIMEOUT_S = 600.0
"""A node's check may have to download the shipped package and import torch and verl first."""
FLASH_ATTN = {"flash-attn": ">=2.7"}
"""flash-attn's distribution (verl 0.9.1's fsdp extra pins 2.8.3); its module `flash_attn` must import too
(a wheel built for another torch or CUDA fails there)."""
INSTALL_HINT = "install the cluster's Python as the README's 'Cluster scale on verl' says (pip install 'dapo-ablate[verl]' on every node)"


@dataclass(frozen=True)
class NodeNeeds:
    """What every node must have for the experiment's verl cells (`node_needs` builds it)."""

    requirements: dict[str, str]
    """Distribution -> version specifier."""
    tracking_uri: str
    experiment: str
    modules: list[str] = field(default_factory=list)
    """Modules that must import there."""
    model_paths: list[str] = field(default_factory=list)
    data_files: dict[str, str] = field(default_factory=dict)
    """Path -> the spec field naming it (``data.train``, ``data.eval``)."""
    python: str | None = ENTRYPOINT_PYTHON
    """The interpreter the job's entrypoint runs (None: not checked)."""


def node_needs(configs: list[TrainerConfig], requirements: dict[str, str], tracking_uri: str, experiment: str) -> NodeNeeds:
    """The needs of the verl cells `configs` (settings may name other models or files)."""
    flash = any(needs_flash_attn(config) for config in configs)
    data: dict[str, str] = {}
    for config in configs:
        data.setdefault(config.data.train, "data.train")
        data.setdefault(config.data.eval, "data.eval")
    return NodeNeeds(
        requirements={**requirements, **(FLASH_ATTN if flash else {})}, tracking_uri=tracking_uri,
        experiment=experiment, modules=[LOSS_MODULE, *(["flash_attn"] if flash else [])],
        model_paths=sorted({config.model.path for config in configs}), data_files=data,
    )


def node_problems(needs: NodeNeeds) -> list[str]:
    """What keeps this node from running a verl cell (empty when nothing does)."""
    problems = _missing_requirements(needs.requirements)
    problems += [problem for module in needs.modules if (problem := _import_problem(module))]
    problems += [problem for path in needs.model_paths if (problem := model_path_problem(path))]
    problems += [problem for path, name in needs.data_files.items() if (problem := data_file_problem(name, path))]
    for problem in (_interpreter_problem(needs.python) if needs.python else None,
                    _tracking_problem(needs.tracking_uri, needs.experiment)):
        if problem:
            problems.append(problem)
    return problems


def _import_problem(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as err:  # noqa: BLE001 - any failure to import is the finding
        return f"`import {module}` fails ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})"
    return None


def _interpreter_problem(python: str) -> str | None:
    """None when `python`, as this node's PATH finds it, is the environment this check (and so
    verl's workers: the same Ray worker Python) runs in; else why not."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    found = shutil.which(python)
    here = Path(sys.prefix).resolve()
    if found is None:
        return f"the jobs' entrypoint runs `{python}`, which is not on this node's PATH; start Ray there with {Path(sys.executable).parent} first on PATH"
    try:
        answer = subprocess.run([found, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=120)
        prefix = Path(answer.stdout.strip().splitlines()[-1]).resolve() if answer.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the jobs' entrypoint runs `{python}` ({found}), which does not start here ({type(err).__name__})"
    if prefix != here:
        return (f"the jobs' entrypoint runs `{python}` = {found} (environment {prefix}), not the Python Ray runs verl's "
                f"workers in ({here}); start Ray on this node with {Path(sys.executable).parent} first on PATH")
    return None


def check_shared_tracking(uri: str, nnodes: int) -> None:
    """Raise ExecutorError (one sentence) for a SQLite or file MLflow store when one verl job spans
    several nodes (see the module docstring)."""
    problem = shared_tracking_problem(uri, nnodes)
    if problem:
        raise ExecutorError(problem)


def shared_tracking_problem(uri: str, nnodes: int) -> str | None:
    """The sentence `check_shared_tracking` raises, or None."""
    local = uri.startswith(("sqlite:", "file:")) or "://" not in uri
    if nnodes <= 1 or not local:
        return None
    kind = "a SQLite file" if uri.startswith("sqlite:") else "a local folder"
    return (f"tracking.uri {uri} is {kind}, which the {nnodes} nodes of one verl job cannot write safely (file "
            "locking over NFS or Lustre is unreliable, and verl drops a write that still fails after its retries); "
            "set tracking.uri to an MLflow tracking server (http://HOST:5000) or a database URI (postgresql://...)")


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


def shared_transfer_queue(configs: list[TrainerConfig]) -> str | None:
    """The first cell override that makes a job's TransferQueue shared by every job on its nodes
    (`verl_isolation.shared_transfer_queue_setting`), or None: each job's is its own."""
    return next(filter(None, (shared_transfer_queue_setting(list(config.verl.overrides)) for config in configs)), None)


def jobs_at_once(configs: list[TrainerConfig]) -> int | None:
    """Most of these verl cells one driver runs at once on one Ray cluster: 1 when a cell's
    TransferQueue cannot be isolated (`shared_transfer_queue`), else no limit of their own."""
    return 1 if shared_transfer_queue(configs) else None


def concurrent_jobs_problem(max_concurrent: int | None, configs: list[TrainerConfig]) -> str | None:
    """Why `executor.max_concurrent` cannot run that many of these verl cells at once on one
    cluster (None: it can; each job has its own TransferQueue, `verl_isolation`)."""
    setting = shared_transfer_queue(configs)
    if max_concurrent is None or max_concurrent <= 1 or setting is None:
        return None
    return (f"executor.max_concurrent ({max_concurrent}) would run verl jobs at once on one Ray cluster, and the "
            f"trainer.verl.overrides entry {setting} gives every job on a node the same TransferQueue store or port "
            "(a per-job Ray namespace cannot separate them); set executor.max_concurrent to 1, or keep TransferQueue's "
            "default SimpleStorage backend and metrics port 0")


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


def cluster_problems(runtime_env: dict[str, Any], needs: NodeNeeds) -> dict[str, list[str]]:
    """`node_problems` of every alive node of the connected Ray cluster, by node (its address, and
    its id's start when there are several)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    runtime_env = _uploaded(runtime_env)
    check = ray.remote(num_cpus=0, max_retries=0)(node_problems)
    refs = {
        node["NodeManagerAddress"] + (f" ({node['NodeID'][:8]})" if len(nodes) > 1 else ""): check.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False), runtime_env=runtime_env,
        ).remote(needs)
        for node in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
    found: dict[str, list[str]] = {}
    for where, ref in refs.items():
        if ref not in ready:
            found[where] = [f"the node did not answer the verl check within {CHECK_TIMEOUT_S:.0f} s (is it alive?)"]
            continue
        try:
            found[where] = ray.get(ref)
        except Exception as err:  # noqa: BLE001 - e.g. the runtime environment could not be set up there
            found[where] = [f"the check could not run ({type(err).__name__}: {str(err).strip().splitlines()[-1][:200]})"]
    return found


def check_cluster(runtime_env: dict[str, Any], needs: NodeNeeds) -> None:
    """Run `node_problems` on every alive node of the connected Ray cluster; raise ExecutorError
    (one sentence) for the first node that has any."""
    for where, problems in cluster_problems(runtime_env, needs).items():
        if problems:
            hint = INSTALL_HINT + (", with flash-attn: 'dapo-ablate[verl-gpu]'" if "flash-attn" in needs.requirements else "")
            raise ExecutorError(f"the Ray cluster cannot run verl cells: on node {where}, {'; '.join(problems)}; {hint}")
