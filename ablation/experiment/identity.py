"""A run's identity: what makes two runs the same run, so a finished one is never trained twice.

A run id is the first 16 hex characters of sha256 over the canonical JSON (sorted keys, no
spaces) of exactly these:

- ``factors``: the cell's factor levels (name -> 0/1);
- ``config``: the resolved trainer config's values that differ from `TrainerConfig`'s defaults
  (`config_delta`), so a release that adds a field whose default keeps today's behaviour keeps
  every id;
- ``seed``;
- ``version``: `IDENTITY_VERSION`, not the package's version: upgrading dapo-ablate keeps the ids
  of finished runs; the identity version is bumped only by a change that makes earlier results
  stale (a trainer change that alters what the same config trains);
- ``setting``: a transfer study's setting name, only when there is one (two settings with equal
  configs stay two runs).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dapo_ablate.core.config import TrainerConfig

IDENTITY_VERSION = "0.1.0"
"""What run ids hash as ``version``. "0.1.0" is what every run id made so far hashed (the
package's version then), so ledgers written before it keep their ids."""


@dataclass(frozen=True)
class RunSpec:
    """One run an experiment needs: a design cell at one seed."""

    run_id: str
    """`make_run_id`: factor levels + non-default trainer config + seed + identity version (+ setting)."""
    cell_key: str
    """The factor levels as a 0/1 string in factor order, e.g. "10110"."""
    factors: dict[str, int]
    """Factor name -> level (0 = off/low, 1 = on/high)."""
    seed: int
    config: dict[str, Any]
    """The fully resolved trainer config (JSON-able), kept for audit and re-running."""


def config_delta(config: TrainerConfig) -> dict[str, Any]:
    """The config's values that differ from TrainerConfig's defaults, as a nested dict."""
    return _delta(config.to_dict(), _default_config_dict())


@lru_cache(maxsize=1)
def _default_config_dict() -> dict[str, Any]:
    return TrainerConfig().to_dict()


_MISSING = object()


def _delta(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        default = defaults.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(default, dict):
            inner = _delta(value, default)
            if inner:
                out[key] = inner
        elif value != default:
            out[key] = value
    return out


def identity_payload(levels: dict[str, int], config: TrainerConfig, seed: int, setting: str = "") -> dict[str, Any]:
    """Everything a run id hashes (see the module docstring)."""
    payload = {"factors": levels, "config": config_delta(config), "seed": seed, "version": IDENTITY_VERSION}
    return payload | ({"setting": setting} if setting else {})


def make_run_id(levels: dict[str, int], config: TrainerConfig, seed: int, setting: str = "") -> str:
    """First 16 hex characters of sha256 over the canonical JSON of `identity_payload`."""
    blob = json.dumps(identity_payload(levels, config, seed, setting), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
