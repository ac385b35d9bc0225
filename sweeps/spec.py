"""SweepSpec: one YAML naming the base trainer, the knobs to search, the objective and the study.

All validation of a sweep happens here, once: a user's mistake raises `SpecError` with one
sentence naming the file, the field and the fix (the CLI exits with status 2).

```yaml
name: quickstart-sweep            # the Optuna study, the MLflow experiment, the ledger experiment
trainer: dapo_cpu.yaml            # base TrainerConfig (techniques included); a file or a mapping
space:                            # knobs by leaf or dotted name
  eps_high: {type: float, low: 0.2, high: 0.4}
  lr: {type: float, low: 2.0e-4, high: 1.0e-3, log: true}
  overlong_cache: {type: categorical, choices: [4, 8, 12]}
  group_size: {type: int, low: 4, high: 16, step: 4}
metric: avg@32                    # default avg@<eval_k>; direction: maximize (or minimize)
n_trials: 12                      # finished trials (complete + pruned + failed) wanted in all
sampler: {type: tpe, seed: 0, n_startup_trials: 4}   # or just `tpe`, `random`, `grid`
pruner: {type: median, n_startup_trials: 2}          # or `successive_halving`, `none`
seeds_per_trial: 1                # each trial trains seeds 0..n-1; its value is their mean
factors: [clip_higher]            # optional robustness mode (see below)
```

`type` may be left out: `choices` make a categorical knob, otherwise the knob's own type in
TrainerConfig (int or float) is used.

Robustness mode (``factors:``, the factorial spec's syntax): each sampled knob setting runs the
factors' cells: ``factor_design: pairs`` (default) the full-on cell plus, per factor, the cell
with only that factor off (k + 1 cells); ``full`` every combination (2^k cells, k <= 4). The
trial's value is the objective of the full-on cell; each factor's effect (on - off, paired by
seed, mean over seeds) is stored with the trial (see `sweeps.robustness`).
"""

from __future__ import annotations

import itertools
import math
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from dapo_ablate.ablation.experiment.sections import Section
from dapo_ablate.ablation.experiment.spec import (
    DEFAULT_LEDGER,
    DEFAULT_OUTPUT_DIR,
    MAX_SEEDS,
    ExecutorSpec,
    ExperimentSpec,
    SpecError,
    SpecProblem,
    TrackingSpec,
    TrainerBasedSpec,
    load_spec_file,
    validate_spec,
)
from dapo_ablate.core.config import (
    MAX_SEED,
    TrainerConfig,
    format_validation_error,
    knob_paths,
    set_dotted,
)
from dapo_ablate.core.config_errors import shown_key, shown_value

__all__ = [
    "MAX_FULL_FACTORS",
    "MAX_GRID_POINTS",
    "Dimension",
    "HeartbeatSpec",
    "PrunerSpec",
    "SamplerSpec",
    "SpecError",
    "SweepSpec",
    "build_sweep",
    "grid_count",
    "grid_values",
    "load_sweep",
]

MAX_FULL_FACTORS = 4
"""``factor_design: full`` runs 2^k cells per trial; beyond 16 cells a trial is a factorial of its own."""
MAX_GRID_POINTS = 10_000
"""A grid larger than this is almost surely a mistake (a float step far too fine)."""
MAX_CORNER_COMBINATIONS = 4096
"""Bounds are checked together with other knobs' bounds up to this many combinations."""


class Dimension(Section):
    """One knob's search range (stored canonically: `type` always filled in)."""

    type: Literal["float", "int", "categorical"]
    """float / int: a range from low to high; categorical: one of `choices`."""
    low: float | int | None = None
    """Smallest value (float and int)."""
    high: float | int | None = None
    """Largest value, included (float and int)."""
    log: bool = False
    """Sample on a log scale (both bounds must be positive; not with a step)."""
    step: float | int | None = None
    """Spacing of the values (float and int; int defaults to 1). The grid sampler needs it for floats."""
    choices: list[Any] | None = None
    """The values of a categorical knob (None, bool, int, float or str)."""

    def corner_values(self) -> list[Any]:
        """The values whose validity stands for the whole range: the bounds, or every choice."""
        return list(self.choices) if self.type == "categorical" else [self.low, self.high]


class SamplerSpec(Section):
    """How trials' knob settings are chosen (Optuna samplers)."""

    type: Literal["tpe", "grid", "random"] = "tpe"
    """tpe: Tree-structured Parzen Estimator (Bergstra et al. 2011), Optuna's default; grid: every
    combination of the knobs' values (floats need a step); random: independent uniform draws."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed of the sampler's draws (and of the grid's order); 0..2^32-1, numpy's range, which Optuna seeds."""
    n_startup_trials: int = Field(10, ge=0)
    """tpe: random trials before the model takes over (Optuna's default 10)."""


class PrunerSpec(Section):
    """Stopping unpromising trials early on their intermediate evaluations (Optuna pruners)."""

    type: Literal["median", "successive_halving", "none"] = "median"
    """median: stop a trial whose value at a step is worse than the median of earlier trials at
    that step; successive_halving: asynchronous successive halving (Li et al. 2020); none."""
    n_startup_trials: int = Field(5, ge=0)
    """median: no pruning until this many trials have finished (Optuna's default 5)."""
    n_warmup_steps: int = Field(0, ge=0)
    """median: no pruning of a trial before this rollout step."""
    min_resource: int | Literal["auto"] = "auto"
    """successive_halving: rollout steps before the first rung (`auto`: from the first trial)."""
    reduction_factor: int = Field(4, ge=2)
    """successive_halving: 1 / reduction_factor of the trials go on at each rung."""


class HeartbeatSpec(Section):
    """Optuna's heartbeat: how trials left *running* by a crashed driver are recovered."""

    interval_s: int = Field(10, ge=1)
    """The driver records each running trial's heartbeat this often (seconds)."""
    grace_period_s: int = Field(120, ge=2)
    """A running trial without a heartbeat for this long is stale: failed and queued again."""
    max_retry: int = Field(3, ge=0)
    """A stale trial is queued again at most this many times (then it stays failed)."""


class SweepSpec(TrainerBasedSpec):
    """A knob sweep: the base trainer, the search space, the objective and the study settings.

    Build it with `load_sweep(path)` or `build_sweep(dict)`."""

    name: str = Field(min_length=1)
    """Sweep name: the Optuna study, the MLflow experiment and the ledger experiment, and the folder of
    its runs in output_dir; the same rules as an experiment's name (`TrainerBasedSpec`)."""
    trainer: TrainerConfig
    """The base TrainerConfig every trial starts from: a mapping, or a YAML file relative to the spec."""
    space: dict[str, Dimension]
    """Knob (leaf or dotted name) -> its range; stored by leaf name."""
    metric: str = Field(None, validate_default=True)  # type: ignore[assignment]
    """The objective: avg@k, pass@k or maj@k with k = trainer.rollout.eval_k (default avg@k)."""
    direction: Literal["maximize", "minimize"] = "maximize"
    n_trials: int | None = Field(None, ge=1)
    """Finished trials (complete, pruned and failed) wanted in all; grid: defaults to the grid's size."""
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    seeds_per_trial: int = Field(1, ge=1, le=MAX_SEEDS)
    """Seeds 0..n-1 per knob setting; a trial's value (and each intermediate value) is their mean."""
    factors: list[str | dict[str, list[Any]]] | None = None
    """Robustness mode: technique names or two-level knobs, as in the factorial spec."""
    factor_design: Literal["pairs", "full"] = "pairs"
    """pairs: the full-on cell and each factor's leave-one-out cell; full: all 2^k cells."""
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    executor: ExecutorSpec = ExecutorSpec()
    tracking: TrackingSpec = TrackingSpec()
    ledger: str = Field(DEFAULT_LEDGER, min_length=1)
    """Database URL of the ledger and of the Optuna study: SQLite by default, PostgreSQL for clusters."""
    output_dir: str = Field(DEFAULT_OUTPUT_DIR, min_length=1)
    """Folder for per-run outputs and the shared step-0 evaluation cache."""

    # ------------------------------------------------------------------------------ fields
    @field_validator("space", mode="before")
    @classmethod
    def _canonical_space(cls, value: Any) -> Any:
        example = "e.g. eps_high: {type: float, low: 0.2, high: 0.4}"
        if not isinstance(value, dict):
            raise SpecProblem(f"must be a mapping of knob -> range, got {shown_value(value)}; write it as {example}", "space")
        if not value:
            raise SpecProblem(f"is empty; name at least one knob to search, {example}", "space")
        space: dict[str, Dimension] = {}
        for knob, entry in value.items():
            leaf = _leaf(knob)
            if leaf in space:
                raise SpecProblem(f"knob {leaf} is listed twice; list each knob once", "space")
            space[leaf] = _dimension(leaf, entry)
        return space

    @field_validator("sampler", "pruner", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value

    # ------------------------------------------------------------------------- cross-field
    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "SweepSpec":
        _check_space_values(self.trainer, self.space)
        if self.factors is not None:
            object.__setattr__(self, "factors", _canonical_factors(self, info.context))
        self._check_sampler()
        self._check_pruner()
        return self

    def _check_sampler(self) -> None:
        if self.sampler.type == "grid":
            for leaf, dim in self.space.items():
                if dim.type == "float" and dim.step is None:
                    raise SpecProblem(
                        f"the grid sampler cannot enumerate the continuous range of {leaf}; "
                        "give it a step or choices, or use sampler: tpe or random",
                        f"space.{leaf}",
                    )
            size = self.grid_size  # counted, not enumerated: a step of 1e-11 would be 10^10 values
            if size > MAX_GRID_POINTS:
                leaf, dim = max(self.space.items(), key=lambda item: grid_count(item[1]))
                raise SpecProblem(
                    f"the grid has {_how_many(size)} points, above {MAX_GRID_POINTS:,} ({leaf} alone has "
                    f"{_how_many(grid_count(dim))} values); "
                    "use coarser steps or fewer knobs",
                    "space",
                )
            if self.n_trials is None:
                object.__setattr__(self, "n_trials", size)
            elif self.n_trials > size:
                raise SpecProblem(
                    f"{self.n_trials} trials exceed the grid's {size} points; set n_trials to at most {size} or leave it out",
                    "n_trials",
                )
        elif self.n_trials is None:
            raise SpecProblem(f"is required with sampler {self.sampler.type}; give the number of trials, e.g. n_trials: 20", "n_trials")
        if "n_startup_trials" in self.sampler.model_fields_set and self.sampler.type != "tpe":
            raise SpecProblem(f"n_startup_trials only applies to sampler type tpe (this is {self.sampler.type}); remove it", "sampler")

    def _check_pruner(self) -> None:
        applies = {"n_startup_trials": "median", "n_warmup_steps": "median",
                   "min_resource": "successive_halving", "reduction_factor": "successive_halving"}
        for name in self.pruner.model_fields_set - {"type"}:
            if applies[name] != self.pruner.type:
                raise SpecProblem(f"{name} only applies to pruner type {applies[name]} (this is {self.pruner.type}); remove it", "pruner")

    # ------------------------------------------------------------------------------ helpers
    @property
    def knob_paths(self) -> dict[str, str]:
        """Leaf name -> dotted TrainerConfig path of each searched knob."""
        paths = knob_paths()
        return {leaf: paths[leaf] for leaf in self.space}

    @property
    def grid_size(self) -> int | float:
        """Points of the grid sampler's grid (the product of each knob's `grid_count`; inf when a
        step is too small to count), computed without listing any value."""
        return math.prod(grid_count(dim) for dim in self.space.values())

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seeds_per_trial))

    @property
    def robustness(self) -> bool:
        return bool(self.factors)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep YAML, raising SpecError with one sentence."""
    return load_spec_file(SweepSpec, path, kind="sweep")


def build_sweep(data: dict[str, Any], source: str = "sweep spec", base: str | Path = ".") -> SweepSpec:
    """Validate a plain dict; a relative `trainer:` file is read from ``base``."""
    return validate_spec(SweepSpec, data, source, base)


def grid_count(dim: Dimension) -> int | float:
    """How many values `grid_values` lists for a knob, by arithmetic alone: the choices, or
    floor((high - low) / step) + 1 (inf when the quotient overflows a float)."""
    if dim.type == "categorical":
        return len(dim.choices or [])
    step = dim.step if dim.step is not None else 1
    if dim.type == "int":
        return (int(dim.high) - int(dim.low)) // int(step) + 1
    quotient = (dim.high - dim.low) / step
    return math.floor(quotient + 1e-9) + 1 if math.isfinite(quotient) else math.inf


def _how_many(count: int | float) -> str:
    """A count for a sentence: exact up to a billion (a product of counts may not fit a float)."""
    return f"{int(count):,}" if count < 10**9 else "more than 10^9"


def grid_values(dim: Dimension) -> list[Any]:
    """Every value of a knob the grid sampler visits: the choices, or low, low + step, ... <= high
    (a grid is checked against MAX_GRID_POINTS by `grid_count` before any is listed)."""
    if dim.type == "categorical":
        return list(dim.choices or [])
    step = dim.step if dim.step is not None else 1
    count = grid_count(dim)
    if dim.type == "int":
        return [int(dim.low + i * step) for i in range(count)]
    return [round(dim.low + i * step, 12) for i in range(count)]


# ------------------------------------------------------------------------------------ space
def _leaf(knob: Any) -> str:
    paths = knob_paths()
    leaf = {path: name for name, path in paths.items()}.get(knob, knob) if isinstance(knob, str) else None
    if leaf not in paths:
        raise SpecProblem(f"unknown knob {shown_value(knob)}; use a TrainerConfig field such as eps_high or algorithm.eps_high", "space")
    return leaf


def _knob_kind(leaf: str) -> str | None:
    """`int` or `float` for a numeric knob (Optional allowed), None for anything else."""
    section, name = knob_paths()[leaf].split(".")
    annotation = TrainerConfig.model_fields[section].annotation.model_fields[name].annotation  # type: ignore[union-attr]
    kinds = {arg for arg in (typing.get_args(annotation) or (annotation,)) if arg is not type(None)}
    if kinds == {int}:
        return "int"
    if kinds == {float}:
        return "float"
    return None


def _dimension(leaf: str, entry: Any) -> Dimension:
    """Validate one knob's range into a canonical `Dimension`."""
    field = f"space.{leaf}"
    if not isinstance(entry, dict):
        raise SpecProblem(f"must be a mapping such as {{type: float, low: 0.2, high: 0.4}} or {{choices: [4, 8]}}, not {shown_value(entry)}", field)
    unknown = [key for key in entry if key not in Dimension.model_fields]  # keys may mix types (1, "low")
    if unknown:
        raise SpecProblem(f"unknown key `{shown_key(unknown[0])}`; use type, low, high, log, step or choices", field)
    kind = _knob_kind(leaf)
    dim_type = entry.get("type") or ("categorical" if "choices" in entry else kind)
    if dim_type not in ("float", "int", "categorical"):
        if dim_type is None:
            raise SpecProblem(f"knob {leaf} is not numeric; list its values as choices: [...]", field)
        raise SpecProblem(f"type {shown_value(dim_type)} is not one of float, int, categorical; fix it", field)
    if dim_type == "categorical":
        return _categorical(entry, field)
    if kind is None:
        raise SpecProblem(f"knob {leaf} is not numeric, so it has no {dim_type} range; list its values as choices: [...]", field)
    if dim_type == "float" and kind == "int":
        raise SpecProblem(f"knob {leaf} takes integers; use type: int", field)
    return _range(dim_type, entry, field)


def _categorical(entry: dict[str, Any], field: str) -> Dimension:
    extra = [key for key in ("low", "high", "log", "step") if key in entry]
    if extra:
        raise SpecProblem(f"a categorical knob takes only choices, not {extra[0]}; remove it", field)
    choices = entry.get("choices")
    if not isinstance(choices, list) or not choices:
        raise SpecProblem(
            f"a categorical knob needs a non-empty list of choices, e.g. choices: [4, 8, 12], got {shown_value(choices)}", field
        )
    for value in choices:
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise SpecProblem(f"choice {shown_value(value)} is not a number, string, boolean or null; list plain values", field)
        if sum(type(v) is type(value) and v == value for v in choices) > 1:
            raise SpecProblem(f"choice {shown_value(value)} is listed twice; list each choice once", field)
    return Dimension(type="categorical", choices=list(choices))


def _range(dim_type: str, entry: dict[str, Any], field: str) -> Dimension:
    if "choices" in entry:
        raise SpecProblem(f"a {dim_type} range takes low and high, not choices; remove choices or use type: categorical", field)
    for key in ("low", "high"):
        if key not in entry:
            raise SpecProblem(f"a {dim_type} range needs `{key}`; give both low and high", field)
    low, high, log, step = entry["low"], entry["high"], entry.get("log", False), entry.get("step")
    for key, value in (("low", low), ("high", high), ("step", step)):
        if value is None and key == "step":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpecProblem(f"{key} {shown_value(value)} is not a finite number; give a number", field)
        if dim_type == "int" and not float(value).is_integer():
            raise SpecProblem(f"{key} {shown_value(value)} is not an integer; an int range takes integer bounds and step", field)
    if not isinstance(log, bool):
        raise SpecProblem(f"log {shown_value(log)} is not true or false; fix it", field)
    if low > high:
        raise SpecProblem(f"low ({low}) is above high ({high}); swap them", field)
    if log and low <= 0:
        raise SpecProblem(f"a log scale needs positive bounds but low is {low}; raise low above 0 or drop log", field)
    if step is not None and step <= 0:
        raise SpecProblem(f"step {step} is not positive; give a step above 0", field)
    if log and step is not None and not (dim_type == "int" and step == 1):
        raise SpecProblem("a log scale cannot have a step (Optuna samples log ranges continuously); drop one of them", field)
    if dim_type == "int":
        low, high, step = int(low), int(high), None if step is None else int(step)
    else:
        low, high, step = float(low), float(high), None if step is None else float(step)
    return Dimension(type=dim_type, low=low, high=high, log=log, step=step)  # type: ignore[arg-type]


def _check_space_values(trainer: TrainerConfig, space: dict[str, Dimension]) -> None:
    """Every bound and choice must give a valid trainer with at least one setting of the other
    knobs' bounds: eps_low in [0.2, 0.3] with eps_high in [0.3, 0.4] is fine although
    eps_low = 0.3 is not on a base with eps_high = 0.28. A sampled setting the trainer still
    refuses (eps_low 0.29, eps_high 0.28) fails its trial with the config error recorded."""
    paths = knob_paths()
    for leaf, dim in space.items():
        others = [(paths[other], d.corner_values()) for other, d in space.items() if other != leaf]
        for value in dim.corner_values():
            error = _error_at_every_corner(trainer, (paths[leaf], value), others)
            if error is not None:
                which = "choice" if dim.type == "categorical" else ("low bound" if value == dim.low else "high bound")
                raise SpecProblem(
                    f"with {leaf} at its {which} {shown_value(value)} the trainer config is invalid ({error}); choose another range",
                    f"space.{leaf}",
                )


def _error_at_every_corner(
    trainer: TrainerConfig, setting: tuple[str, Any], others: list[tuple[str, list[Any]]]
) -> str | None:
    """None if the trainer builds with `setting` alone or with some combination of the other
    knobs' corner values (at most MAX_CORNER_COMBINATIONS tried), else the first error."""
    combos = itertools.product(*[[(path, value) for value in values] for path, values in others])
    first = None
    for combo in itertools.chain([()], itertools.islice(combos, MAX_CORNER_COMBINATIONS)):
        error = _build_error(trainer, [setting, *combo])
        if error is None:
            return None
        first = first or error
    return first


def _build_error(trainer: TrainerConfig, settings: list[tuple[str, Any]]) -> str | None:
    """None if the trainer builds with these (dotted path, value) settings, else its error."""
    data = trainer.to_dict()
    for path, value in settings:
        set_dotted(data, path, value)
    try:
        TrainerConfig(**data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        detail = first["msg"].removeprefix("Value error, ")
        return f"{loc}: {detail}" if loc else detail
    return None


# ---------------------------------------------------------------------------------- factors
def _canonical_factors(spec: SweepSpec, context: dict[str, Any] | None) -> list[str | dict[str, list[Any]]]:
    """The factors validated exactly as the factorial spec validates them (names, knob levels
    against the base trainer), and kept apart from the searched knobs."""
    factors = spec.factors
    if isinstance(factors, list) and not factors:
        raise SpecProblem("the list is empty; name at least one factor, or leave factors out for a plain sweep", "factors")
    if spec.factor_design == "full" and isinstance(factors, list) and len(factors) > MAX_FULL_FACTORS:
        raise SpecProblem(
            f"factor_design full with {len(factors)} factors runs {2 ** len(factors)} cells per trial; "
            f"use at most {MAX_FULL_FACTORS} factors or factor_design: pairs",
            "factors",
        )
    try:
        shadow = ExperimentSpec.model_validate(
            {"name": spec.name, "trainer": spec.trainer, "factors": factors}, context=context
        )
    except ValidationError as err:
        problem = (err.errors()[0].get("ctx") or {}).get("error")
        if isinstance(problem, SpecProblem):
            raise problem from None
        raise SpecProblem(format_validation_error(err, "factors").split(": ", 1)[-1], "factors") from None
    for entry in shadow.factors:
        name = entry if isinstance(entry, str) else next(iter(entry))
        if name in spec.space:
            raise SpecProblem(f"{name} is both a factor and a searched knob; keep it in one of factors and space", "factors")
    return shadow.factors
