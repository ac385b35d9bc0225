"""Runtime patches to verl 0.9.1, applied in every process of a CPU job (``VERL_PLATFORM=cpu``)."""

from __future__ import annotations

import functools
import sys

import verl.utils.distributed as verl_distributed

_PATCHED = "_verl_cpu_plugin_patched"


def _gloo_process_group(original):
    """Blocker 4: ``initialize_global_process_group_ray`` builds the backend string
    ``cpu:gloo,{device}:{backend}``, which on the CPU platform is ``cpu:gloo,cpu:gloo`` and torch
    refuses it ("Duplicate device type cpu"). Default the backend to plain ``gloo``; an explicit
    backend (the checkpoint engine passes ``cpu:gloo``) is left alone."""

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    setattr(initialize_global_process_group_ray, _PATCHED, True)
    return initialize_global_process_group_ray


def _rebind(module, name: str, replacement) -> None:
    """Set ``module.name`` and every already-imported verl module's copy of it (``from x import
    name`` binds at import time; this plugin runs during ``import verl``, usually before them)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    for other in list(sys.modules.values()):
        if getattr(other, "__name__", "").startswith("verl.") and getattr(other, name, None) is original:
            setattr(other, name, replacement)


def apply() -> None:
    """Apply each patch once per process."""
    current = verl_distributed.initialize_global_process_group_ray
    if not getattr(current, _PATCHED, False):
        _rebind(verl_distributed, "initialize_global_process_group_ray", _gloo_process_group(current))
