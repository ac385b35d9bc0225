"""The verl environment's tests (``pytest -m verl``): verl 0.9.1 importable, else skip, or fail in the
verl environment itself when ``DAPO_REQUIRE_VERL=1``.

.ci/run builds that environment, exports ``DAPO_VERL_PYTHON`` (its python) and
``DAPO_REQUIRE_VERL=1``, runs the README's test command in the main environment (where these tests
skip: verl's pins clash with it) and then ``pytest -m verl`` with the verl environment's python,
where a verl that does not import is a failure, not a skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def in_verl_environment() -> bool:
    """This interpreter is the environment ``DAPO_VERL_PYTHON`` names."""
    python = os.environ.get("DAPO_VERL_PYTHON", "")
    return bool(python) and Path(python).parent.parent.resolve() == Path(sys.prefix).resolve()


def require_verl() -> None:
    """Skip unless verl is importable here (fail instead in the verl environment under DAPO_REQUIRE_VERL=1)."""
    try:
        import verl  # noqa: F401
    except ImportError as err:
        if os.environ.get("DAPO_REQUIRE_VERL") == "1" and in_verl_environment():
            pytest.fail(f"verl is not importable in the verl environment ({err}) and DAPO_REQUIRE_VERL=1")
        pytest.skip(f"needs verl 0.9.1 ({err}); .ci/run runs these in its verl environment (pytest -m verl)",
                    allow_module_level=True)
