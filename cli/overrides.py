"""`key=value` overrides after a config on the command line, as verl and Hydra users type them:

    dapo-ablate train examples/dapo_cpu.yaml schedule.total_steps=5 algorithm.eps_high=0.3

Values are read as YAML scalars (`5`, `0.3`, `1e-6`, `true`, `null`, `[a, b]`); the result is
validated exactly like the file, and an unknown key gets a "did you mean".
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml


class OverrideError(ValueError):
    """A malformed or unknown override, as one sentence."""


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """["a.b=1", "c=x"] -> {"a.b": 1, "c": "x"}, values as YAML scalars."""
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"override {item!r} is not key=value; write e.g. schedule.total_steps=5")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads 1e-6 as a string
            except ValueError:
                pass
        parsed[key.strip()] = value
    return parsed


def dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Every leaf path of a nested dict, dotted."""
    keys = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys.extend(dotted_keys(value, path + ".") if isinstance(value, dict) and value else [path])
    return keys


def unknown_key_sentence(key: str, known: list[str]) -> str:
    """One sentence for an override whose path does not exist, with the closest known paths."""
    close = difflib.get_close_matches(key, known, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; see the config's documented fields"
    return f"override {key!r} is not a config field{hint}"
