"""verl jobs at once on one Ray cluster, each with its own TransferQueue.

verl 0.9.1 starts TransferQueue 0.1.11 with ``tq.init(config.transfer_queue)``, whose controller is the
Ray actor ``TransferQueueController`` in the namespace ``transfer_queue``, both fixed in its code. The
product gives each job its own namespace (``backends/verl_isolation.py``, in every verl process of the
job: tests/e2e/test_verl_real.py runs two real jobs at once), so a spec may ask for verl jobs at once;
only a cell whose TransferQueue a namespace cannot separate (a Mooncake store, a fixed metrics port) keeps
its spec one job at a time: refused in one sentence above 1, and the driver's limit capped at one.
Here: the spec's checks, the plan's limit and `validate`'s line; the namespace rewrite itself, with
Ray's real ``get_actor`` and actor ``options`` on a local Ray, on a module laid out as TransferQueue's
``interface`` (TransferQueue is not installed in this environment).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends import verl_isolation
from dapo_ablate.ablation.runtime.backends.registry import backend_named, jobs_at_once
from dapo_ablate.ablation.runtime.backends.verl_cluster import concurrent_jobs_problem
from dapo_ablate.ablation.runtime.backends.verl_isolation import (
    NAMESPACE,
    controllers,
    job_namespace,
    shared_transfer_queue_setting,
)
from dapo_ablate.cli.main import app

from support import ROOT, write_spec

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"
MOONCAKE = "transfer_queue.backend.storage_backend=MooncakeStore"


def _example(tmp_path: Path, max_concurrent: int, extra_override: str | None = None) -> Path:
    text = EXAMPLE.read_text().replace("  max_concurrent: 1\n", f"  max_concurrent: {max_concurrent}\n", 1)
    if extra_override:
        text = text.replace("    max_checkpoints: 2\n", f"    max_checkpoints: 2\n    overrides: [{extra_override}]\n", 1)
    path = tmp_path / "paper_verl.yaml"
    path.write_text(text)
    return path


def test_verl_jobs_at_once_are_allowed_and_validate_says_each_has_its_own_transfer_queue(tmp_path: Path, monkeypatch):
    spec_path = _example(tmp_path, 4)
    assert jobs_at_once(expand(load_spec(spec_path))) is None  # no cap of verl's own: max_concurrent / the GPUs decide
    assert jobs_at_once(expand(load_spec(write_spec(tmp_path / "cpu")))) is None
    assert backend_named("builtin").jobs_at_once([]) is None
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert ("jobs at once on one Ray cluster: up to executor.max_concurrent (or as many as its GPUs fit), each with its own "
            "TransferQueue (Ray namespace transfer_queue-<the job's Ray job id>)") in " ".join(result.output.split())


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"], ["run"]])
def test_a_cell_whose_transfer_queue_is_shared_by_a_node_is_refused_at_once_in_one_sentence_before_anything_is_written(
        command, tmp_path: Path, monkeypatch):
    spec_path = _example(tmp_path, 4, MOONCAKE)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 2, result.output
    problem = concurrent_jobs_problem(4, [run.config for run in expand(load_spec(spec_path)).runs])
    assert problem and MOONCAKE in problem and problem in " ".join(result.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_verl.yaml"]


def test_such_a_cell_runs_one_at_a_time_and_validate_says_why(tmp_path: Path, monkeypatch):
    spec_path = _example(tmp_path, 1, MOONCAKE)
    assert jobs_at_once(expand(load_spec(spec_path))) == 1  # also when --max-concurrent asks for more
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "one job at a time on one Ray cluster: a cell's TransferQueue backend or metrics port" in " ".join(result.output.split())


@pytest.mark.parametrize(("override", "shared"), [
    ("transfer_queue.backend.storage_backend=MooncakeStore", True),
    ("++transfer_queue.backend.storage_backend='Yuanrong'", True),
    ("transfer_queue.backend.storage_backend=SimpleStorage", False),
    ("transfer_queue.metrics.port=9100", True),
    ("transfer_queue.metrics.port=0", False),
    ("transfer_queue.metrics.enabled=true", False),
    ("transfer_queue.backend.SimpleStorage.num_data_storage_units=1", False),
])
def test_which_overrides_make_a_jobs_transfer_queue_shared_by_the_node(override: str, shared: bool):
    assert (shared_transfer_queue_setting(["trainer.device=cpu", override]) == override) is shared


def test_controllers_are_read_from_rays_actor_list_by_namespace():
    actors = [{"class_name": "TransferQueueController", "ray_namespace": "transfer_queue-01000000", "job_id": "01000000"},
              {"class_name": "SimpleStorageUnit", "ray_namespace": "x", "job_id": "01000000"},
              {"class_name": "TransferQueueController", "ray_namespace": "transfer_queue-02000000", "job_id": "02000000"}]
    assert controllers(actors) == {job_namespace("01000000"): "01000000", job_namespace("02000000"): "02000000"}


def test_transfer_queues_fixed_namespace_becomes_the_jobs_own_on_a_real_ray(local_ray, monkeypatch):
    """A module laid out as TransferQueue 0.1.11's ``interface`` (``ray`` and an actor class it starts
    with ``options(name=..., namespace="transfer_queue")``, found again with ``ray.get_actor``),
    patched as `isolate_transfer_queue` patches it on import: the actor lands in this job's
    namespace, is found there through the module's ``ray``, and not in the shared one."""
    import ray

    @ray.remote(num_cpus=0)
    class Controller:
        def ping(self) -> str:
            return "pong"

    interface = types.ModuleType("transfer_queue.interface")
    interface.ray, interface.TransferQueueController = ray, Controller
    monkeypatch.setitem(sys.modules, "transfer_queue.interface", interface)
    verl_isolation.isolate_transfer_queue()
    verl_isolation.isolate_transfer_queue()  # idempotent: wrapped once
    assert isinstance(interface.ray, verl_isolation._JobRay) and not isinstance(interface.ray._ray, verl_isolation._JobRay)
    try:
        own = job_namespace(ray.get_runtime_context().get_job_id())
        handle = interface.TransferQueueController.options(name="TransferQueueController", namespace=NAMESPACE).remote()
        assert ray.get(handle.ping.remote()) == "pong"  # (kept: an actor whose handles are all gone ends)
        found = interface.ray.get_actor("TransferQueueController", namespace=NAMESPACE)
        assert ray.get(found.ping.remote()) == "pong"
        assert ray.get(ray.get_actor("TransferQueueController", namespace=own).ping.remote()) == "pong"
        with pytest.raises(ValueError):
            ray.get_actor("TransferQueueController", namespace=NAMESPACE)
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, verl_isolation._PatchOnImport)]
