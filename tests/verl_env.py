"""The verl environment's tests (``pytest -m verl``): verl 0.9.1 importable, else skip, or fail when
``DAPO_REQUIRE_VERL=1`` (.ci/run builds that environment and sets it: these tests must run there)."""

from __future__ import annotations

import os

import pytest


def require_verl() -> None:
    """Skip (or fail under DAPO_REQUIRE_VERL=1) unless verl is importable here."""
    try:
        import verl  # noqa: F401
    except ImportError as err:
        if os.environ.get("DAPO_REQUIRE_VERL") == "1":
            pytest.fail(f"verl is not importable ({err}) and DAPO_REQUIRE_VERL=1")
        pytest.skip(f"needs verl 0.9.1 ({err}); .ci/run runs these in its verl environment (pytest -m verl)",
                    allow_module_level=True)
