"""Loaded by verl's ``verl.plugins`` entry point during ``import verl`` (verl imports the module and
calls nothing, so the work happens at import). verl logs a failing plugin at DEBUG level only, and
the job then dies far away ("Unknown platform 'cpu'"); the traceback is printed here first."""

import traceback

from verl_cpu_plugin import selected

if selected():
    try:
        from verl_cpu_plugin import platform, verl_patches  # noqa: F401  (registers the platform)

        verl_patches.apply()
    except Exception:
        traceback.print_exc()
        raise
