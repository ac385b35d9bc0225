"""The slower cases of tests/unit/test_verl_transfer_queue.py (a real local Ray): in this tree so the
fast tier stays near a minute."""

from __future__ import annotations

import sys
import types

import pytest

from dapo_ablate.ablation.runtime.backends import verl_isolation
from dapo_ablate.ablation.runtime.backends.verl_isolation import (
    NAMESPACE,
    job_namespace,
)


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
