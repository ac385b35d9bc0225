"""A spec's `factors:` and `orderings:` entries made canonical: technique names (or their short
labels) and `{knob: [low, high]}` levels, their file paths resolved and every combination of knob
levels built into a valid trainer config."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dapo_ablate.ablation.experiment.spec_errors import SpecProblem
from dapo_ablate.core.config import TrainerConfig, knob_paths, resolve_relative_paths, set_dotted
from dapo_ablate.core.config_errors import shown_value
from dapo_ablate.core.contracts import SHORT_LABELS, TECHNIQUES

MAX_COMBINED_KNOBS = 10
"""Knob factors up to this many have every combination of their levels validated (2^10 builds)."""
FILE_KNOBS = ("model.path", "data.train", "data.eval")
TECHNIQUE_LIST = ", ".join(TECHNIQUES)


def canonical_factor(entry: Any) -> str | dict[str, list[Any]]:
    """A technique name (or its short label) -> the name; {knob: [low, high]} -> {leaf: [low, high]}."""
    by_short = {short: name for name, short in SHORT_LABELS.items()}
    knobs = knob_paths()
    if isinstance(entry, str):
        if entry in TECHNIQUES or entry in by_short:
            return by_short.get(entry, entry)
        if entry in knobs or entry in knobs.values():
            raise SpecProblem(f"{entry} is a knob, not a technique; give its two levels, e.g. {{{entry}: [low, high]}}", "factors")
        raise SpecProblem(
            f"unknown factor {shown_value(entry)}; use a technique ({TECHNIQUE_LIST}) or a two-level knob such as {{eps_high: [0.2, 0.28]}}",
            "factors",
        )
    if not (isinstance(entry, dict) and len(entry) == 1):
        raise SpecProblem(f"{shown_value(entry)} is not a factor; write a technique name or one knob as {{eps_high: [0.2, 0.28]}}", "factors")
    ((knob, levels),) = entry.items()
    leaf = {path: name for name, path in knobs.items()}.get(knob, knob)
    if leaf not in knobs:
        raise SpecProblem(f"unknown knob {shown_value(knob)}; use a TrainerConfig field such as eps_high or algorithm.eps_high", "factors")
    if knobs[leaf].startswith("techniques."):
        raise SpecProblem(f"{knob} is a technique; list it by name ({leaf}) without levels", "factors")
    if not isinstance(levels, list) or len(levels) != 2:
        raise SpecProblem(f"knob {leaf} needs exactly two levels [low, high], got {shown_value(levels)}", "factors")
    return {leaf: list(levels)}


def resolve_level_paths(entry: dict[str, list[Any]], base: Path) -> dict[str, list[Any]]:
    """Levels of model.path, data.train and data.eval are files: relative to the spec, like the trainer's."""
    ((leaf, levels),) = entry.items()
    if knob_paths()[leaf] not in FILE_KNOBS:
        return entry
    section, key = knob_paths()[leaf].split(".")
    return {leaf: [resolve_relative_paths({section: {key: level}}, base)[section][key] for level in levels]}


def validated_knob_levels(trainer: TrainerConfig, entries: list) -> list:
    """Build the trainer at every combination of the knobs' levels (each cell's knob settings),
    so invalid levels fail here rather than mid-run; values become the config's coerced ones.

    Levels are checked together because knobs constrain each other (eps_low <= eps_high): with
    eps_low [0.2, 0.3] and eps_high [0.3, 0.4] every cell is valid though eps_low = 0.3 is not
    on a base with eps_high = 0.28. Past MAX_COMBINED_KNOBS knobs, each level is checked alone.
    """
    knobs = knob_paths()
    found = [(i, leaf, knobs[leaf], levels) for i, e in enumerate(entries) if isinstance(e, dict) for leaf, levels in e.items()]
    if not found:
        return entries
    if len(found) <= MAX_COMBINED_KNOBS:
        combos = itertools.product(*[[(leaf, path, which, v) for which, v in (("low", lo), ("high", hi))] for _, leaf, path, (lo, hi) in found])
    else:
        combos = ([(leaf, path, which, v)] for _, leaf, path, (lo, hi) in found for which, v in (("low", lo), ("high", hi)))
    coerced: dict[tuple[str, str], Any] = {}
    for combo in combos:
        values = built_values(trainer, combo)
        coerced.update({(leaf, which): value for (leaf, _, which, _), value in zip(combo, values)})
    out = list(entries)
    for i, leaf, _, _ in found:
        low, high = coerced[(leaf, "low")], coerced[(leaf, "high")]
        if low == high:
            raise SpecProblem(f"knob {leaf} has the same value {shown_value(low)} at both levels; give two different levels", "factors")
        out[i] = {leaf: [low, high]}
    return out


def built_values(trainer: TrainerConfig, combo: Sequence[tuple[str, str, str, Any]]) -> list[Any]:
    """The values of (leaf, path, which, value) knob settings as a trainer built with them holds them."""
    data = trainer.to_dict()
    for _, path, _, value in combo:
        set_dotted(data, path, value)
    try:
        built = TrainerConfig(**data).to_dict()
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        detail = first["msg"].removeprefix("Value error, ")
        if len(combo) == 1:
            (leaf, _, which, value), = combo
            what = f"knob {leaf} at its {which} level {shown_value(value)}"
        else:
            what = "the knob levels " + ", ".join(f"{leaf}={shown_value(value)}" for leaf, _, _, value in combo)
        where = f"{loc}: " if loc else ""
        raise SpecProblem(f"with {what} the trainer config is invalid ({where}{detail}); choose other levels", "factors") from None
    out = []
    for _, path, _, _ in combo:
        node: Any = built
        for key in path.split("."):
            node = node[key]
        out.append(node)
    return out


# -------------------------------------------------------------------------------- orderings
def canonical_ordering(i: int, ordering: list[Any], factors: list) -> list[str]:
    """Factor names, short labels or dotted knob paths -> canonical factor names; a permutation."""
    names = [f if isinstance(f, str) else next(iter(f)) for f in factors]
    knobs = knob_paths()
    alias = {n: n for n in names}
    alias.update({SHORT_LABELS[n]: n for n in names if n in SHORT_LABELS})
    alias.update({knobs[n]: n for n in names if n in knobs})
    out = []
    for entry in ordering:
        if not isinstance(entry, str) or entry not in alias:
            raise SpecProblem(f"orderings[{i}] names {shown_value(entry)}, which is not among the factors ({', '.join(names)}); use those names", "orderings")
        if alias[entry] in out:
            raise SpecProblem(f"orderings[{i}] lists {alias[entry]} twice; list each factor once", "orderings")
        out.append(alias[entry])
    missing = [n for n in names if n not in out]
    if missing:
        raise SpecProblem(f"orderings[{i}] leaves out {', '.join(missing)}; list every factor once", "orderings")
    return out
