"""Design expansion: the cells (factor-level combinations) and runs (cell x seed) a spec needs.

A cell is a subset of the factors switched on (high). Orderings are paths through the lattice of
factor subsets, from the baseline (nothing on) to the full recipe, adding one factor per step, so
cells are shared between orderings: the paper's ordering of five techniques needs 6 cells, all
120 orderings need the 32 cells of the full factorial.

Designs (``spec.design``):

- ``full``: all 2^k cells.
- ``fractional``: a regular 2^(k-p) fraction (generators, aliases and the default choice live
  in `fractions.py`).
- ``one_at_a_time``: baseline, each factor alone, each factor left out of the full recipe, full.
- ``cumulative``: the union of the prefixes of each ordering (``paper``: DAPO's order).

Each cell x seed is one `PlannedRun` whose `run_id` hashes everything that determines its result
(factor levels, the fully resolved trainer config, the seed, the package version), so a rerun or
another experiment needing the same run finds it in the ledger instead of training it again.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.experiment.fractions import STANDARD_FRACTIONS, DesignError, Fraction, choose_fraction
from dapo_ablate.ablation.experiment.identity import RunSpec, make_run_id
from dapo_ablate.core.config import (
    BUILTIN,
    TrainerConfig,
    build_trainer_config,
    resolve_knob,
    set_dotted,
)
from dapo_ablate.core.contracts import SHORT_LABELS, TECHNIQUES

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

__all__ = [
    "STANDARD_FRACTIONS",
    "Calibration",
    "Cell",
    "ComputeEstimate",
    "DesignError",
    "Factor",
    "Fraction",
    "Plan",
    "PlannedRun",
    "calibrate",
    "choose_fraction",
    "estimate_run_seconds",
    "expand",
    "factors_of",
    "make_run_id",
    "paper_ordering",
]


MAX_LISTED_ORDERINGS = math.factorial(8)
"""Covered orderings are listed one by one up to this many (8 factors); beyond, only counted."""

REFERENCE_SECONDS = 36.0
"""Measured wall time of one built-in CPU quickstart cell on one CPU thread (32-36 s each in the
quickstart factorial, two at a time on 2 cores; 39.8 s alone with other work on the machine) ..."""
REFERENCE_WORK = 20 * 64 * 8 * 32
"""... which is 20 steps x 64 prompts x 8 samples x a 32-token ceiling (examples/dapo_cpu.yaml)."""


# ------------------------------------------------------------------------------------ factors
@dataclass(frozen=True)
class Factor:
    """One two-level factor: a technique (off/on) or a knob (low/high value)."""

    name: str
    """Technique name (`clip_higher`) or the knob's leaf name (`eps_high`); the results-table column."""
    path: str
    """Dotted TrainerConfig path the levels are written to (`algorithm.eps_high`)."""
    low: Any
    """Value at level 0 (False for a technique)."""
    high: Any
    """Value at level 1 (True for a technique)."""
    is_technique: bool

    @property
    def short(self) -> str:
        """OF, CH, SP, TL, DS for the techniques; the knob's leaf name otherwise."""
        return SHORT_LABELS[self.name] if self.is_technique else self.name

    def value(self, level: int) -> Any:
        return self.high if level else self.low

    def describe_levels(self) -> str:
        return "off / on" if self.is_technique else f"{self.low!r} / {self.high!r}"


def factors_of(spec: ExperimentSpec) -> list[Factor]:
    """The spec's factors (already validated and canonical) as `Factor`s, in spec order."""
    factors = []
    for entry in spec.factors:
        if isinstance(entry, str):
            factors.append(Factor(entry, f"techniques.{entry}", False, True, True))
        else:
            ((name, (low, high)),) = entry.items()
            factors.append(Factor(name, resolve_knob(name), low, high, False))
    return factors


def paper_ordering(factors: Sequence[Factor]) -> tuple[str, ...]:
    """DAPO's cumulative order restricted to these factors, knob factors appended in spec order."""
    names = [f.name for f in factors]
    return tuple([t for t in TECHNIQUES if t in names] + [f.name for f in factors if not f.is_technique])


# -------------------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class Cell:
    """One combination of factor levels (0 = off/low, 1 = on/high), in factor order."""

    levels: tuple[int, ...]

    @property
    def key(self) -> str:
        """The levels as a 0/1 string in factor order, e.g. "10110"."""
        return "".join(map(str, self.levels))

    def on(self, factors: Sequence[Factor]) -> list[Factor]:
        return [f for f, level in zip(factors, self.levels) if level]

    def label(self, factors: Sequence[Factor], baseline: str = "GRPO") -> str:
        """`OF+CH+eps_high=0.28` style; ``baseline`` when every factor is off/low."""
        parts = [f.short if f.is_technique else f"{f.name}={f.high}" for f in self.on(factors)]
        return "+".join(parts) or baseline


def _cell_of(on: Iterable[int], k: int) -> Cell:
    on = set(on)
    return Cell(tuple(int(i in on) for i in range(k)))


def _lattice_order(cell: Cell) -> tuple:
    """Baseline first, then by how many factors are on, earlier factors first."""
    return (sum(cell.levels), tuple(-level for level in cell.levels))


def full_cells(k: int) -> list[Cell]:
    return sorted((Cell(levels) for levels in itertools.product((0, 1), repeat=k)), key=_lattice_order)


def one_at_a_time_cells(k: int) -> list[Cell]:
    everything = range(k)
    wanted = [_cell_of((), k)]
    wanted += [_cell_of((i,), k) for i in everything]
    wanted += [_cell_of((j for j in everything if j != i), k) for i in everything]
    wanted.append(_cell_of(everything, k))
    return list(dict.fromkeys(wanted))


def cumulative_cells(orderings: Iterable[Sequence[int]], k: int) -> list[Cell]:
    """The union of every ordering's prefixes (baseline, +first, +first+second, ...), deduplicated."""
    cells: dict[Cell, None] = {}
    for ordering in orderings:
        for depth in range(len(ordering) + 1):
            cells.setdefault(_cell_of(ordering[:depth], k))
    return list(cells)



# -------------------------------------------------------------------------------- orderings
def count_paths(cells: set[Cell], k: int) -> int:
    """Complete orderings (baseline -> full, one factor per step) whose every prefix is a cell."""
    paths: dict[Cell, int] = {}
    for cell in sorted(cells, key=lambda c: sum(c.levels)):
        if not any(cell.levels):
            paths[cell] = 1
            continue
        paths[cell] = sum(
            paths.get(Cell(cell.levels[:i] + (0,) + cell.levels[i + 1 :]), 0) for i in range(k) if cell.levels[i]
        )
    return paths.get(Cell((1,) * k), 0)


def enumerate_paths(cells: set[Cell], k: int) -> list[tuple[int, ...]]:
    """Every complete ordering through the cells, as factor indices, in lexicographic order."""
    found: list[tuple[int, ...]] = []

    def walk(prefix: tuple[int, ...]) -> None:
        if len(prefix) == k:
            found.append(prefix)
            return
        for i in range(k):
            if i not in prefix and _cell_of(prefix + (i,), k) in cells:
                walk(prefix + (i,))

    if _cell_of((), k) in cells:
        walk(())
    return found


# -------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class PlannedRun:
    """One cell at one seed: the unit the executor trains and the ledger records."""

    run_id: str
    cell: Cell
    seed: int
    config: TrainerConfig
    """The fully resolved trainer config: the cell's levels applied and schedule.seed = seed."""
    name: str
    """Readable name for MLflow, e.g. "OF+CH+SP+TL+DS s0"."""
    factors: dict[str, int] = field(default_factory=dict)
    """Factor name -> level, in factor order."""
    setting: str = ""
    """Transfer study: the setting's name (its cell key in the ledger is ``setting/cell``)."""

    def to_run_spec(self) -> RunSpec:
        key = f"{self.setting}/{self.cell.key}" if self.setting else self.cell.key
        return RunSpec(self.run_id, key, dict(self.factors), self.seed, self.config.to_dict())


def cell_config(base: TrainerConfig, factors: Sequence[Factor], cell: Cell, seed: int) -> TrainerConfig:
    """The base config with this cell's factor values and schedule.seed = seed."""
    data = base.to_dict()
    for factor, level in zip(factors, cell.levels):
        set_dotted(data, factor.path, factor.value(level))
    set_dotted(data, "schedule.seed", seed)
    return build_trainer_config(data, source=f"cell {cell.key} seed {seed}")


# ----------------------------------------------------------------------------------- compute
def estimate_run_seconds(config: TrainerConfig) -> float:
    """Rough wall seconds of one run, scaled linearly from the built-in CPU quickstart
    (`REFERENCE_SECONDS` for `REFERENCE_WORK`) by steps x prompts x group size x ceiling.

    Only meaningful for the built-in model on CPU; a real model on a GPU differs by orders of
    magnitude, so measure one run and pass seconds_per_run to `Plan.estimate` instead.
    """
    work = (
        config.schedule.total_steps
        * config.batch.prompts_per_step
        * config.algorithm.group_size
        * config.rollout.max_response_len
    )
    return REFERENCE_SECONDS * work / REFERENCE_WORK * BUILTIN_SIZE_COST.get(config.model.builtin_size, 1.0)


BUILTIN_SIZE_COST = {"small": 1.0, "large": 3.0}
"""CPU time of a run of the built-in policy of that size relative to `small` (the quickstart's 20
steps: 97 s vs 33 s of CPU for `large`, 1.30M parameters, vs `small`, 0.31M, measured 2026-12-03)."""


def generated_tokens_bound(config: TrainerConfig) -> int:
    """Tokens generated if every response reached the ceiling, one sampling round per step
    (dynamic sampling generates gen_prompts_per_round prompts per round and may add rounds)."""
    return (
        config.schedule.total_steps
        * config.gen_prompts_per_round
        * config.algorithm.group_size
        * config.rollout.max_response_len
    )


@dataclass(frozen=True)
class Calibration:
    """Measured run times that rescale `estimate_run_seconds`: `runs` finished runs took
    `measured_s` seconds in all where the reference scaling said `scaled_s`."""

    runs: int
    measured_s: float
    scaled_s: float

    @property
    def factor(self) -> float:
        """Measured over scaled: what every scaled estimate is multiplied by."""
        return self.measured_s / self.scaled_s


def calibrate(finished: Iterable[tuple[TrainerConfig, float]]) -> Calibration | None:
    """A calibration from finished runs' (config, measured wall seconds); None without any.

    The scaling's shape (steps x prompts x group x ceiling) is kept and only its constant is
    measured, so runs of other cells (longer schedules, dynamic sampling) are estimated in
    proportion to the ones that finished."""
    pairs = [(config, float(wall_s)) for config, wall_s in finished if wall_s is not None and wall_s > 0]
    scaled = sum(estimate_run_seconds(config) for config, _ in pairs)
    if not pairs or scaled <= 0:
        return None
    return Calibration(runs=len(pairs), measured_s=sum(wall for _, wall in pairs), scaled_s=scaled)


@dataclass(frozen=True)
class ComputeEstimate:
    """A rough compute estimate for a plan (see `Plan.estimate`)."""

    runs: int
    cells: int
    seconds_per_run: float
    """Mean estimated (or given) seconds of one run."""
    measured: bool
    """True when seconds_per_run was given by the caller, False when scaled from the reference."""
    parallelism: int
    """Runs at a time: executor.max_concurrent, else the CPUs divided by cpus_per_run."""
    run_seconds: float
    """Sum over runs (CPU-side run time)."""
    wall_s: float
    """Estimated wall time: max(total / parallelism, the longest run)."""
    tokens_upper: int
    """Generated-token upper bound over all runs (see `generated_tokens_bound`)."""
    real_model: bool
    """True when some run uses a non-builtin model, for which the scaled estimate means little."""
    calibration: Calibration | None = None
    """The measured runs the scaled estimate was calibrated on (None: given, or the reference)."""


# -------------------------------------------------------------------------------------- plan
@dataclass
class Plan:
    """What an experiment needs and what it lets the reports estimate."""

    spec: ExperimentSpec
    factors: list[Factor]
    cells: list[Cell]
    runs: list[PlannedRun]
    orderings: list[tuple[str, ...]]
    """Complete orderings (factor names) whose every prefix is a cell; the paper's and the
    requested ones first. Listed in full up to MAX_LISTED_ORDERINGS, else only those."""
    supports: list[str]
    """Which statistics the design supports, and what it cannot give, in plain words."""
    aliases: list[str] = field(default_factory=list)
    """Fractional designs: the defining relation and the alias chains of main effects and
    two-factor interactions."""
    orderings_count: int = 0
    """How many complete orderings the cells cover (len(orderings) unless too many to list)."""
    resolution: int | None = None
    generators: list[str] = field(default_factory=list)
    requested_orderings: list[tuple[str, ...]] = field(default_factory=list)
    """Cumulative designs: the orderings the spec asked for (for `all`: empty, see orderings)."""

    @property
    def design(self) -> str:
        return self.spec.design

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.seeds)

    @property
    def settings(self) -> list[str]:
        """Transfer study: the settings' names in spec order (empty without settings)."""
        return [setting.name for setting in self.spec.settings]

    @property
    def paper_ordering(self) -> tuple[str, ...]:
        return paper_ordering(self.factors)

    @property
    def baseline_label(self) -> str:
        return baseline_label(self.spec.trainer, self.factors)

    def label(self, cell: Cell) -> str:
        return cell.label(self.factors, self.baseline_label)

    def ordering_name(self, ordering: Sequence[str]) -> str:
        """``paper`` for the paper's ordering, else short names joined by '>' (OF>CH>SP>TL>DS)."""
        if tuple(ordering) == self.paper_ordering:
            return "paper"
        short = {f.name: f.short for f in self.factors}
        return ">".join(short[name] for name in ordering)

    def orderings_through(self, cell: Cell) -> list[str]:
        """Names of the listed orderings that pass through this cell (for MLflow tags)."""
        on = {f.name for f in cell.on(self.factors)}
        depth = len(on)
        return [self.ordering_name(o) for o in self.orderings if set(o[:depth]) == on]

    def run_specs(self) -> list[RunSpec]:
        return [run.to_run_spec() for run in self.runs]

    def estimate(self, seconds_per_run: float | None = None, calibration: Calibration | None = None) -> ComputeEstimate:
        """Runs, unique cells, wall time at the executor's parallelism, and a token bound.

        Seconds per run: `seconds_per_run` if given; else the reference scaling, multiplied by
        `calibration`'s factor when measured runs exist."""
        executor = self.spec.executor
        cpus = os.cpu_count() or 1
        by_cpu = max(1, int(cpus // executor.cpus_per_run)) if executor.cpus_per_run > 0 else cpus
        if executor.max_concurrent is None:
            parallelism = by_cpu
        elif executor.address is None:  # a local Ray cannot run more than its CPUs allow
            parallelism = min(executor.max_concurrent, by_cpu)
        else:
            parallelism = executor.max_concurrent
        if seconds_per_run is None:
            factor = calibration.factor if calibration is not None else 1.0
            each = [estimate_run_seconds(run.config) * factor for run in self.runs]
        else:
            calibration = None
            each = [float(seconds_per_run)] * len(self.runs)
        total = sum(each)
        return ComputeEstimate(
            runs=len(self.runs),
            cells=len(self.cells),
            seconds_per_run=total / len(each) if each else 0.0,
            measured=seconds_per_run is not None,
            parallelism=parallelism,
            run_seconds=total,
            wall_s=max(total / parallelism, max(each, default=0.0)),
            tokens_upper=sum(generated_tokens_bound(run.config) for run in self.runs),
            real_model=any(run.config.model.path != BUILTIN for run in self.runs),
            calibration=calibration,
        )


def expand(spec: ExperimentSpec, grown: Sequence[tuple[str, int]] = ()) -> Plan:
    """The plan of a validated spec: its factors, deduplicated cells, runs and what they support.

    design: adaptive: stage 1 (its first design x `seeds`) plus `grown`, the (cell key, seed)
    runs its looks added so far (`runtime.adaptive`; a cell outside stage 1 is a fold-over)."""
    factors = factors_of(spec)
    k = len(factors)
    names = [f.name for f in factors]
    fraction = None
    requested: list[tuple[str, ...]] = []
    if spec.design == "adaptive":
        return _adaptive_plan(spec, factors, grown)
    if spec.design == "full" or (spec.design == "cumulative" and spec.orderings == "all"):
        cells = full_cells(k)
    elif spec.design == "fractional":
        fraction = choose_fraction(k, spec.resolution, spec.generators)
        cells = sorted((Cell(levels) for levels in fraction.level_rows()), key=_lattice_order)
    elif spec.design == "one_at_a_time":
        cells = one_at_a_time_cells(k)
    else:
        requested = [paper_ordering(factors)] if spec.orderings == "paper" else [tuple(o) for o in spec.orderings]
        cells = cumulative_cells(([names.index(n) for n in o] for o in requested), k)

    orderings, count = _covered_orderings(set(cells), names, [paper_ordering(factors), *requested])
    baseline = baseline_label(spec.trainer, factors)
    plan = Plan(
        spec=spec,
        factors=factors,
        cells=cells,
        runs=[
            _planned_run(trainer, factors, cell, seed, baseline, setting)
            for setting, trainer in spec.setting_trainers()
            for cell in cells
            for seed in spec.seeds
        ],
        orderings=orderings,
        supports=[],
        aliases=fraction.alias_chains([f.short for f in factors]) if fraction else [],
        orderings_count=count,
        resolution=fraction.resolution if fraction else None,
        generators=fraction.generator_text() if fraction else [],
        requested_orderings=requested,
    )
    plan.supports = _supports(plan, fraction)
    return plan


def _adaptive_plan(spec: ExperimentSpec, factors: list[Factor], grown: Sequence[tuple[str, int]]) -> Plan:
    """Stage 1 (the first design's cells x the spec's seeds) and the runs the looks added."""
    from dapo_ablate.ablation.experiment.spec import first_stage_fraction

    k = len(factors)
    fraction = first_stage_fraction(k, spec.resolution, spec.generators)
    first = full_cells(k) if fraction is None else [Cell(levels) for levels in fraction.level_rows()]
    pairs = dict.fromkeys([(cell, seed) for cell in first for seed in spec.seeds])
    pairs.update(dict.fromkeys((Cell(tuple(int(c) for c in key)), seed) for key, seed in grown))
    cells = sorted({cell for cell, _ in pairs}, key=_lattice_order)
    if len(cells) == 2**k:
        fraction = None  # folded over: the full factorial
    baseline = baseline_label(spec.trainer, factors)
    order = {cell: i for i, cell in enumerate(cells)}
    runs = [_planned_run(spec.trainer, factors, cell, seed, baseline)
            for cell, seed in sorted(pairs, key=lambda pair: (order[pair[0]], pair[1]))]
    orderings, count = _covered_orderings(set(cells), [f.name for f in factors], [paper_ordering(factors)])
    plan = Plan(spec=spec, factors=factors, cells=cells, runs=runs, orderings=orderings, supports=[],
                aliases=fraction.alias_chains([f.short for f in factors]) if fraction else [], orderings_count=count,
                resolution=fraction.resolution if fraction else None,
                generators=fraction.generator_text() if fraction else [])
    plan.supports = _supports(plan, fraction)
    return plan


def baseline_label(base: TrainerConfig, factors: Sequence[Factor]) -> str:
    """`GRPO` when the all-off cell has no technique on (every technique outside the factors is
    off in the base trainer), `baseline` otherwise (as the reports label it)."""
    names = {f.name for f in factors}
    return "baseline" if any(getattr(base.techniques, t) for t in TECHNIQUES if t not in names) else "GRPO"


def _planned_run(
    base: TrainerConfig, factors: Sequence[Factor], cell: Cell, seed: int, baseline: str, setting: str = ""
) -> PlannedRun:
    config = cell_config(base, factors, cell, seed)
    levels = {f.name: level for f, level in zip(factors, cell.levels)}
    name = f"{setting + ' ' if setting else ''}{cell.label(factors, baseline)} s{seed}"
    return PlannedRun(make_run_id(levels, config, seed, setting), cell, seed, config, name, levels, setting)


def _covered_orderings(
    cells: set[Cell], names: list[str], first: list[tuple[str, ...]]
) -> tuple[list[tuple[str, ...]], int]:
    """The complete orderings through the cells (``first`` ones first, when covered) and their count."""
    k = len(names)
    covered_first = [
        o for o in dict.fromkeys(first) if set(cumulative_cells([[names.index(n) for n in o]], k)) <= cells
    ]
    count = count_paths(cells, k)
    if count > MAX_LISTED_ORDERINGS:
        return covered_first, count
    every = [tuple(names[i] for i in path) for path in enumerate_paths(cells, k)]
    return covered_first + [o for o in every if o not in covered_first], count


def _supports(plan: Plan, fraction: Fraction | None) -> list[str]:
    k, cells, count = len(plan.factors), set(plan.cells), plan.orderings_count
    if len(cells) == 2**k:
        out = ["main effects of every factor"]
        if k >= 2:
            out.append(f"all interactions (two-factor up to {k}-factor)" if k > 2 else "the two-factor interaction")
        out += [
            "exact Shapley and Banzhaf values",
            f"order dependence across all {count} orderings (every cumulative path, the paper's included)",
        ]
        return out
    if fraction is not None:
        return _fraction_supports(plan, fraction)
    if plan.design == "one_at_a_time":
        out = [
            "add-one effects: each factor alone against the baseline",
            "leave-one-out effects: the full recipe against the full recipe without each factor",
            "interactions only as a signal (a gap between a factor's add-one and leave-one-out effects), not estimated",
            "no main effects averaged over the other factors, no exact Shapley values",
        ]
        out.append(f"order dependence across {count} orderings" if count else "no cumulative path or order dependence")
        return out
    if count == 1:
        return [
            f"one cumulative path ({plan.ordering_name(plan.orderings[0])}): each factor's gain given those before it",
            "no main effects, interactions, exact Shapley values or order dependence",
        ]
    return [
        f"{count} cumulative paths: each factor's gain given those before it, along each",
        f"order dependence across these {count} orderings only",
        "no main effects, interactions or exact Shapley values",
    ]


_ORDER_WORDS = {2: "two-factor", 3: "three-factor", 4: "four-factor", 5: "five-factor", 6: "six-factor"}


def _order_word(order: int) -> str:
    return _ORDER_WORDS.get(order, f"{order}-factor")


def _fraction_supports(plan: Plan, fraction: Fraction) -> list[str]:
    r = fraction.resolution  # >= 3, parse_generators refuses less
    if r == 3:
        out = [
            "main effects, each aliased with two-factor interactions (assumes those are negligible)",
            "no two-factor interactions (aliased with main effects)",
        ]
    elif r == 4:
        out = [
            "main effects (aliased with three-factor interactions)",
            "two-factor interactions only in aliased sums (aliased with each other), not separately",
        ]
    else:
        out = [
            f"main effects (aliased with {_order_word(r - 1)} interactions)",
            f"two-factor interactions (aliased with {_order_word(r - 2)} interactions)",
        ]
    out.append("Shapley values only from a fitted model (main effects + two-factor interactions), not exact")
    count = plan.orderings_count
    out.append(f"order dependence across {count} orderings" if count else "no cumulative path or order dependence (no complete path is run)")
    k, cells = len(plan.factors), set(plan.cells)
    missing = [what for what, levels in (("the baseline", (0,) * k), ("the full recipe", (1,) * k)) if Cell(levels) not in cells]
    if missing:
        out.append(f"{' and '.join(missing)} not run (a fitted model predicts {'them' if len(missing) > 1 else 'it'})")
    return out
