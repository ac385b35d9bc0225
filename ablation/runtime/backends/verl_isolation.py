"""Each verl job its own TransferQueue, so several jobs can run at once on one Ray cluster.

verl 0.9.1's V1 trainer starts TransferQueue (0.1.11) with ``tq.init(config.transfer_queue)`` in its
TaskRunner, and every other process of the job (the FSDP workers, the agent-loop and reward workers)
attaches to it with ``tq.init()``. TransferQueue finds its controller by a fixed name in a fixed Ray
namespace: the actor ``TransferQueueController`` in the namespace ``transfer_queue``
(``transfer_queue/interface.py``: ``init`` creates it, ``_init_from_existing`` looks it up), and the
``RayStore`` backend's ``RayObjectRefStorage`` likewise (``storage/clients/ray_storage_client.py``).
Neither verl's ``transfer_queue`` config group nor TransferQueue's own config has a key that changes
them. Ray names are cluster-wide within a namespace, so without this module a second job's
``tq.init`` would attach to the first job's controller (its own config ignored) and the first job's
``tq.close`` would kill it under the second.

`isolate_transfer_queue` rewrites, in the process it runs in, the namespace those two modules pass
to Ray: ``transfer_queue`` becomes ``transfer_queue-<Ray job id>`` (`job_namespace`). Every process
of one verl job belongs to the job's Ray job (the entrypoint's driver; the actors it and they start
inherit its id), so all of them meet in one namespace and no other job's process ever looks there.
It runs in every verl process of a product job: `verl_loss`, which verl imports in each of them at
``import verl`` (the job's ``VERL_USE_EXTERNAL_MODULES``), calls it, before verl's code reaches
TransferQueue. The names stay as TransferQueue writes them; a job's controller is found in Ray's
actor list by its namespace (`controllers`).

What it cannot isolate (`shared_transfer_queue_setting`): TransferQueue's ``MooncakeStore`` backend
starts one Mooncake master at fixed addresses (``localhost:50123/50124`` in verl's config) and may
stop any other master on the node, and a fixed metrics port (``transfer_queue.metrics.port``) binds
once per node; a spec that runs such cells several at a time is refused. The default, SimpleStorage,
binds free ports of its own and is isolated here.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

NAMESPACE = "transfer_queue"
"""TransferQueue 0.1.11's fixed Ray namespace."""
CONTROLLER = "TransferQueueController"
PATCHED = {
    "transfer_queue.interface": ("TransferQueueController",),
    "transfer_queue.storage.clients.ray_storage_client": ("RayObjectRefStorage",),
}
"""TransferQueue's modules that name Ray actors in `NAMESPACE` -> the actor classes they start there."""
STORAGE_KEY = "transfer_queue.backend.storage_backend"
METRICS_PORT_KEY = "transfer_queue.metrics.port"


def job_namespace(job_id: str) -> str:
    """The Ray namespace of one job's TransferQueue actors (`job_id`: Ray's hex job id)."""
    return f"{NAMESPACE}-{job_id}"


def _own(namespace: str | None) -> str | None:
    """TransferQueue's fixed namespace -> this process's job's; any other left as it is."""
    if namespace != NAMESPACE:
        return namespace
    import ray

    return job_namespace(ray.get_runtime_context().get_job_id())


class _JobRay:
    """The ``ray`` module as a patched TransferQueue module sees it: ``get_actor`` in the job's namespace."""

    def __init__(self, ray: Any):
        self._ray = ray

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)

    def get_actor(self, name: str, namespace: str | None = None) -> Any:
        return self._ray.get_actor(name, namespace=_own(namespace))


class _JobActorClass:
    """A TransferQueue actor class whose ``options(namespace=...)`` is the job's namespace."""

    def __init__(self, actor_class: Any):
        self._actor_class = actor_class

    def __getattr__(self, name: str) -> Any:
        return getattr(self._actor_class, name)

    def options(self, **options: Any) -> Any:
        if "namespace" in options:
            options["namespace"] = _own(options["namespace"])
            print(f"dapo-ablate: TransferQueue's {options.get('name')} in this job's Ray namespace {options['namespace']}",
                  flush=True)
        return self._actor_class.options(**options)


def _patch(module: Any) -> None:
    """Point `module`'s ``ray`` and its actor classes (`PATCHED`) at the job's namespace (once)."""
    if not isinstance(module.ray, _JobRay):
        module.ray = _JobRay(module.ray)
    for name in PATCHED[module.__name__]:
        actor_class = getattr(module, name, None)
        if actor_class is not None and not isinstance(actor_class, _JobActorClass):
            setattr(module, name, _JobActorClass(actor_class))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each module of `PATCHED` right after it is imported (TransferQueue is imported by
    verl's V1 code; importing it here first would cost every verl process its import time)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHED or fullname in sys.modules:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def isolate_transfer_queue() -> None:
    """In this process, TransferQueue's actors go to the job's own namespace: the modules of
    `PATCHED` already imported are patched now, the others when they are imported."""
    for name in PATCHED:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def controllers(actors: list[dict[str, Any]]) -> dict[str, str]:
    """Ray's actor list (``ray.util.state.list_actors``' dicts) -> namespace of each
    TransferQueue controller -> the Ray job id that started it."""
    return {actor["ray_namespace"]: actor["job_id"] for actor in actors if actor.get("class_name") == CONTROLLER}


def shared_transfer_queue_setting(overrides: list[str]) -> str | None:
    """The override of a cell (``trainer.verl.overrides``) that makes its TransferQueue a node's
    shared resource whatever its namespace, or None."""
    for override in overrides:
        key, _, value = override.partition("=")
        key, value = key.strip().lstrip("+~").split("@", 1)[0].strip(), value.strip()
        if key == STORAGE_KEY and value.strip("'\"") != "SimpleStorage":
            return override
        if key == METRICS_PORT_KEY and value.strip("'\"") not in ("0", "null", ""):
            return override
    return None
