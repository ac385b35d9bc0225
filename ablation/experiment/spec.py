"""ExperimentSpec: one YAML naming the base trainer, the factors, the design and where results go.

All validation of an experiment happens here, once, so that `design.expand` can trust the spec.
A user's mistake raises `SpecError` with one sentence naming the file, the field and the fix.

```yaml
name: quickstart-factorial
trainer: dapo_cpu.yaml            # or an inline TrainerConfig mapping; relative to this file
factors:                          # default: the five techniques, in the paper's order
  - overlong_filter
  - clip_higher
  - eps_high: [0.2, 0.28]         # a two-level knob: {leaf or dotted path: [low, high]}
design: fractional                # full | fractional | one_at_a_time | cumulative
resolution: 4                     # fractional only (or generators: ["E=ABCD"])
seeds: 2                          # a count (seeds 0, 1) or a list
```
Relative SQLite paths in `ledger` and `tracking.uri`, and `output_dir`, are relative to the
current working directory (like the README's `dapo-runs/`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from dapo_ablate.ablation.experiment.factor_entries import (
    TECHNIQUE_LIST,
    canonical_factor,
    canonical_ordering,
    resolve_level_paths,
    validated_knob_levels,
)
from dapo_ablate.ablation.experiment.adaptive_spec import AdaptiveSpec
from dapo_ablate.ablation.experiment.fractions import DesignError, Fraction, choose_fraction, roman
from dapo_ablate.ablation.experiment.sections import DEFAULT_TRACKING_URI, ExecutorSpec, TrackingSpec, Section
from dapo_ablate.ablation.experiment.setting_info import SettingAttributes, setting_info
from dapo_ablate.ablation.experiment.spec_errors import SpecError, SpecProblem, format_spec_error
from dapo_ablate.core.config import (
    MAX_SEED,
    ConfigError,
    TrainerConfig,
    build_trainer_config,
    read_yaml,
    resolve_relative_paths,
    set_dotted,
    shown_value,
)
from dapo_ablate.core.contracts import MAX_FACTORS, METRIC_PATTERN, TECHNIQUES, SettingInfo, metric_name

__all__ = [
    "DEFAULT_LEDGER",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_TRACKING_URI",
    "MAX_CELLS",
    "ExecutorSpec",
    "ExperimentSpec",
    "SpecError",
    "SpecProblem",
    "TrackingSpec",
    "TrainerBasedSpec",
    "format_spec_error",
    "load_spec",
]

DEFAULT_LEDGER = "sqlite:///dapo-runs/ledger.db"
DEFAULT_OUTPUT_DIR = "dapo-runs"
MAX_CELLS = 4096
"""Largest design accepted (2^12 cells); a bigger one is almost surely a mistake: use a fraction."""
MAX_SEEDS = 1000
"""Most seeds per cell (or per trial of a sweep); a power analysis (`dapo-ablate plan-seeds`) never asks for more."""
MAX_NAME_CHARS = 200
"""Longest experiment or sweep name: the ledger's experiment name column (MLflow's holds 256)."""
MAX_SETTING_CHARS = 32
"""Longest setting name: it prefixes its runs' cell keys in the ledger (64 characters with the levels)."""


def _from_folder(value: str, base: Path, *, url: bool) -> str:
    """A relative path (or the path of a relative ``sqlite:///`` URL) read from `base`; anything
    else as given (an absolute path, a server URL, ``~``)."""
    if url:
        if not value.startswith("sqlite:///") or value.startswith("sqlite:////"):
            return value
        path = value[len("sqlite:///"):]
        if not path or path.startswith(("~", ":memory:")) or Path(path).is_absolute():
            return value
        return f"sqlite:///{(base / path).resolve()}"
    if value.startswith("~") or Path(value).is_absolute():
        return value
    return str((base / value).resolve())


class TrainerBasedSpec(Section):
    """What the experiment and sweep specs share: a `trainer` read from a YAML file or a mapping,
    a `metric` checked against that trainer's eval_k, and the spec's dump and digest.

    Each spec declares its fields itself: pydantic puts inherited fields first, and a spec's field
    order is its dump's order and decides which of several errors is reported."""

    @model_validator(mode="before")
    @classmethod
    def _stores_from_the_spec_folder(cls, data: Any, info: ValidationInfo) -> Any:
        """One rule for relative paths: a spec file's relative paths (its `trainer` file, a SQLite
        `ledger` or `tracking.uri`, `tracking.artifact_location`, `output_dir`, and their defaults
        under dapo-runs/) are read from the spec file's folder, whatever folder the command runs
        in. A spec built in code (no file) keeps them relative to the current folder."""
        base = (info.context or {}).get("spec_folder")
        if not isinstance(data, dict) or base is None:
            return data
        data = {"ledger": DEFAULT_LEDGER, "output_dir": DEFAULT_OUTPUT_DIR, **data}  # the defaults follow the rule too
        if isinstance(data.get("ledger"), str):
            data["ledger"] = _from_folder(data["ledger"], base, url=True)
        if isinstance(data.get("output_dir"), str) and data["output_dir"].strip():
            data["output_dir"] = _from_folder(data["output_dir"], base, url=False)
        tracking = {"uri": DEFAULT_TRACKING_URI, **data["tracking"]} if isinstance(data.get("tracking"), dict) else data.get("tracking")
        if tracking is None:
            tracking = {"uri": DEFAULT_TRACKING_URI}
        if isinstance(tracking, dict):
            tracking = dict(tracking)
            if isinstance(tracking.get("uri"), str):
                tracking["uri"] = _from_folder(tracking["uri"], base, url=True)
            if isinstance(tracking.get("artifact_location"), str) and "://" not in tracking["artifact_location"]:
                tracking["artifact_location"] = _from_folder(tracking["artifact_location"], base, url=False)
            data["tracking"] = tracking
        return data

    @field_validator("trainer", mode="before", check_fields=False)
    @classmethod
    def _load_trainer(cls, value: Any, info: ValidationInfo) -> Any:
        base = Path((info.context or {}).get("base", "."))
        if isinstance(value, (str, Path)):
            path = base / Path(value).expanduser()
            try:
                data = read_yaml(path)
            except ConfigError as err:
                raise SpecProblem(str(err).replace("config file", "trainer file", 1), "trainer") from None
            try:
                return build_trainer_config(resolve_relative_paths(data, path.parent), source=str(path))
            except ConfigError as err:  # already names the trainer file and its field
                raise SpecProblem(str(err)) from None
        if isinstance(value, dict):
            return resolve_relative_paths(value, base)
        return value

    @field_validator("metric", mode="before", check_fields=False)
    @classmethod
    def _metric_matches_eval_k(cls, value: Any, info: ValidationInfo) -> Any:
        trainer = info.data.get("trainer")
        k = trainer.rollout.eval_k if isinstance(trainer, TrainerConfig) else None
        if value is None:
            return metric_name("avg", k or 32)
        match = METRIC_PATTERN.match(value) if isinstance(value, str) else None
        if not match:
            raise SpecProblem(f"{shown_value(value)} is not a metric; use avg@k, pass@k or maj@k", "metric")
        if k is not None and int(match.group(2)) != k:
            raise SpecProblem(
                f"{value} needs rollout.eval_k = {match.group(2)} but the trainer has eval_k = {k}; "
                f"use avg@{k}, pass@{k} or maj@{k}, or set trainer.rollout.eval_k: {match.group(2)}",
                "metric",
            )
        return value

    @field_validator("name", check_fields=False)
    @classmethod
    def _name_stays_inside(cls, value: str) -> str:
        # run folders are output_dir / <name with other characters as _>: "." or ".." would escape it;
        # a control or invisible character splits a report's table row or hides what a name says
        if not value.strip(". ") or "\x00" in value:
            raise SpecProblem(
                f"{shown_value(value)} cannot name run folders inside output_dir; use letters, digits, '-', '_' or '.'", "name"
            )
        hidden = next((char for char in value if not char.isprintable()), None)
        if hidden is not None:
            raise SpecProblem(
                f"{shown_value(value)} holds the control or invisible character U+{ord(hidden):04X}; "
                "use letters, digits, spaces, '-', '_' or '.'",
                "name",
            )
        if len(value) > MAX_NAME_CHARS:
            raise SpecProblem(
                f"is {len(value)} characters long, above the {MAX_NAME_CHARS} the ledger holds for a name; "
                f"shorten it to at most {MAX_NAME_CHARS}",
                "name",
            )
        return value

    @field_validator("ledger", check_fields=False)
    @classmethod
    def _shared_ledger(cls, value: str) -> str:
        if value.strip().lower().startswith("memory:"):
            raise SpecProblem(
                f"{shown_value(value)} keeps runs inside one process only, so status, report and a resumed run would not see them; "
                "use a SQLite path (sqlite:///dapo-runs/ledger.db) or a PostgreSQL URL",
                "ledger",
            )
        return value

    def to_dict(self) -> dict[str, Any]:
        """JSON-able and self-contained: the trainer fully resolved, every default explicit."""
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """A stable content hash of the whole spec."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


class SettingSpec(Section):
    """One setting of a transfer study: a name and partial TrainerConfig overrides of the base."""

    name: str = Field(min_length=1)
    """Short name: the ``setting`` column of results, a prefix of MLflow child run names."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Sections or dotted keys over the base trainer, e.g. ``{rollout.max_response_len: 48}``."""
    attributes: SettingAttributes | None = None
    """What the setting is (model family, size, type, task, length ceiling); what is left out comes
    from the spec's ``attributes`` or the setting's trainer (``setting_info``). Not part of the design."""


class ConfirmSpec(Section):
    """Confirm the predictions another experiment's report wrote (``predictions.yaml``)."""

    predictions: str = Field(min_length=1)
    """The predictions file, relative to the spec's folder."""
    terms: list[str] | None = Field(None, min_length=1)
    """``design: adaptive`` (confirm mode): the predicted terms its looks watch and decide, as the
    file names them (``clip_higher``, ``clip_higher:dynamic_sampling``); None: every main effect and
    two-factor interaction the file predicts away from zero."""

    @field_validator("predictions")
    @classmethod
    def _from_the_spec_folder(cls, value: str, info: ValidationInfo) -> str:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else Path((info.context or {}).get("base", ".")) / path)


def _merge(base: dict[str, Any], overrides: dict[str, Any], setting: str) -> dict[str, Any]:
    """The base trainer dict with a setting's overrides (nested mappings merged, dotted keys set)."""
    data = json.loads(json.dumps(base))
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = _merge(data[key], value, setting)
            continue
        try:
            set_dotted(data, str(key), value)
        except (KeyError, TypeError):
            raise SpecProblem(
                f"setting '{setting}' overrides unknown key '{key}'; use a TrainerConfig field such as rollout.max_response_len",
                "settings",
            ) from None
    return data


SETTING_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A setting's name, whole (`fullmatch`: `$` alone would let a trailing newline through)."""


class ExperimentSpec(TrainerBasedSpec):
    """A factorial ablation: the base trainer, the factors, the design, the seeds, and the stores.

    Build it with `load_spec(path)`, or `ExperimentSpec.model_validate(dict)` (paths relative to
    the current folder, or to ``context={"base": folder}``)."""

    name: str = Field(min_length=1)
    """Experiment name: the MLflow experiment and the ledger's experiment, and the folder of its runs
    in output_dir (at most MAX_NAME_CHARS characters, none a control character; `preflight` checks
    that the folder name fits the file system)."""
    trainer: TrainerConfig
    """The base TrainerConfig every cell starts from: a mapping, or a YAML file relative to the spec."""
    factors: list[str | dict[str, list[Any]]] = Field(default_factory=lambda: list(TECHNIQUES))
    """Technique names, or two-level knobs `{eps_high: [0.2, 0.28]}`; default: the five, paper order.
    Stored canonically: technique names, knobs by leaf name with their validated values."""
    design: Literal["full", "fractional", "one_at_a_time", "cumulative", "adaptive"] = "full"
    """full: 2^k cells; fractional: 2^(k-p); one_at_a_time: 2k+2; cumulative: the orderings' prefixes;
    adaptive: a first stage (the resolution V fraction) grown look by look (see `adaptive`)."""
    resolution: int | None = None
    """fractional (and adaptive's first stage): the least resolution wanted (3..; III, IV, V
    accepted); the fewest runs reaching it."""
    generators: list[str] | None = None
    """fractional (and adaptive's first stage): explicit generators over factor letters A, B, ... in
    spec order, e.g. ["E=ABCD"]."""
    adaptive: AdaptiveSpec | None = None
    """design: adaptive: how the design grows (defaults when left out); `seeds` are stage 1's."""
    orderings: Literal["paper", "all"] | list[list[str]] = "paper"
    """cumulative: `paper` (DAPO's order), `all` (every permutation) or lists of factor names."""
    seeds: list[int] = Field(default_factory=lambda: [0])
    """Seeds of every cell: a count n (seeds 0..n-1, stored as the list) or a list of unique seeds."""
    metric: str = Field(None, validate_default=True)  # type: ignore[assignment]
    """The headline metric: avg@k, pass@k or maj@k with k = trainer.rollout.eval_k (default avg@k)."""
    executor: ExecutorSpec = ExecutorSpec()
    tracking: TrackingSpec = TrackingSpec()
    ledger: str = Field(DEFAULT_LEDGER, min_length=1)
    """Ledger database URL (SQLAlchemy): SQLite by default, PostgreSQL for clusters."""
    output_dir: str = Field(DEFAULT_OUTPUT_DIR, min_length=1)
    """Folder for per-run outputs and the shared step-0 evaluation cache."""
    settings: list[SettingSpec] = Field(default_factory=list)
    """Transfer study: named partial trainer overrides; the design is expanded in every setting."""
    attributes: SettingAttributes | None = None
    """What the experiment's setting is (every setting's, unless a setting says otherwise): model
    family, size and type, task, length ceiling; read from the trainer where left out."""
    confirm: ConfirmSpec | None = None
    """Confirm another experiment's predictions: its report's ``predictions.yaml``."""

    # ------------------------------------------------------------------------------ fields
    @field_validator("factors", mode="before")
    @classmethod
    def _canonical_factors(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, list):
            raise SpecProblem(
                f"must be a list of technique names and {{knob: [low, high]}} entries, got {shown_value(value)}", "factors"
            )
        if not value:
            raise SpecProblem(
                f"the list is empty; name at least one factor ({TECHNIQUE_LIST} or a knob), or leave factors out for all five",
                "factors",
            )
        entries = [canonical_factor(entry) for entry in value]
        names = [entry if isinstance(entry, str) else next(iter(entry)) for entry in entries]
        for name in names:
            if names.count(name) > 1:
                raise SpecProblem(f"{name} is listed twice; list each factor once", "factors")
        base = Path((info.context or {}).get("base", "."))
        entries = [entry if isinstance(entry, str) else resolve_level_paths(entry, base) for entry in entries]
        trainer = info.data.get("trainer")
        if isinstance(trainer, TrainerConfig):  # else the trainer's own error is reported first
            entries = validated_knob_levels(trainer, entries)
        return entries

    @field_validator("adaptive", mode="after")
    @classmethod
    def _adaptive_defaults(cls, value: AdaptiveSpec | None, info: ValidationInfo) -> AdaptiveSpec | None:
        return AdaptiveSpec() if value is None and info.data.get("design") == "adaptive" else value

    @field_validator("resolution", mode="before")
    @classmethod
    def _resolution_number(cls, value: Any) -> Any:
        numerals = {v: n for n, v in ((n, roman(n)) for n in range(1, 11))}
        if isinstance(value, str):
            value = numerals.get(value.strip().upper(), value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 3:
            raise SpecProblem(f"{value} is below III; give 3 (III), 4 (IV), 5 (V) or more", "resolution")
        return value

    @field_validator("orderings", mode="before")
    @classmethod
    def _canonical_orderings(cls, value: Any, info: ValidationInfo) -> Any:
        if value in ("paper", "all"):
            return value
        shape = f"must be `paper`, `all`, or a list of orderings, each a list of factor names, got {shown_value(value)}"
        if not isinstance(value, list) or not value or not all(isinstance(o, list) for o in value):
            raise SpecProblem(shape, "orderings")
        factors = info.data.get("factors")
        if factors is None:
            return value  # the factors' error is reported first
        orderings = [canonical_ordering(i, ordering, factors) for i, ordering in enumerate(value)]
        for i, ordering in enumerate(orderings):
            if ordering in orderings[:i]:
                raise SpecProblem(f"orderings[{i}] repeats orderings[{orderings.index(ordering)}]; list each ordering once", "orderings")
        return orderings

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_list(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise SpecProblem(f"must be a count or a list of integer seeds, got {value}; give a count of at least 1", "seeds")
        too_many = f"is more than {MAX_SEEDS} seeds per cell; use at most {MAX_SEEDS} (see `dapo-ablate plan-seeds`)"
        if isinstance(value, int):
            if value < 1:
                raise SpecProblem(f"{value} is below 1; give a count of at least 1 (seeds 0..n-1) or a list of seeds", "seeds")
            if value > MAX_SEEDS:
                raise SpecProblem(f"{value} {too_many}", "seeds")
            return list(range(value))
        if isinstance(value, list):
            if not value:
                raise SpecProblem("the list is empty; give at least one seed, or a count", "seeds")
            if len(value) > MAX_SEEDS:
                raise SpecProblem(f"a list of {len(value)} {too_many}", "seeds")
            seen: set[int] = set()
            for seed in value:
                if isinstance(seed, bool) or not isinstance(seed, int):
                    raise SpecProblem(f"must list integer seeds, got {shown_value(seed)} in the list; list integers", "seeds")
                if not 0 <= seed <= MAX_SEED:
                    raise SpecProblem(
                        f"seed {seed} is outside 0..{MAX_SEED}, the range of every random generator a run seeds; "
                        "list seeds in that range",
                        "seeds",
                    )
                if seed in seen:
                    raise SpecProblem(f"seed {seed} is listed twice; list each seed once", "seeds")
                seen.add(seed)
            return value
        raise SpecProblem(
            f"must be a count or a list of integer seeds, got {shown_value(value)}; give a count of at least 1 or a list of seeds",
            "seeds",
        )

    # ------------------------------------------------------------------------- cross-field
    @model_validator(mode="after")
    def _design_is_possible(self) -> "ExperimentSpec":
        for name in ("resolution", "generators"):
            if getattr(self, name) is not None and self.design not in ("fractional", "adaptive"):
                raise SpecProblem(f"only applies to design: fractional or adaptive (this is {self.design}); remove it", name)
        if self.adaptive is not None and self.design != "adaptive":
            raise SpecProblem(f"only applies to design: adaptive (this is {self.design}); remove it", "adaptive")
        if self.orderings != "paper" and self.design != "cumulative":  # `paper` is the default: harmless
            raise SpecProblem(f"only applies to design: cumulative (this is {self.design}); remove it", "orderings")
        k = len(self.factors)
        if k > MAX_FACTORS:
            raise SpecProblem(
                f"{k} factors are listed; a report analyses at most {MAX_FACTORS} ({2**MAX_FACTORS:,} cells, each further factor "
                "doubles them): keep the factors you are testing and fix the others in trainer",
                "factors",
            )
        if self.design == "adaptive":
            check_adaptive(self)
        elif self.design == "fractional":
            try:
                choose_fraction(k, self.resolution, self.generators)
            except DesignError as err:
                raise SpecProblem(str(err), "generators" if self.generators is not None else "design") from None
        elif self.design == "full" or (self.design == "cumulative" and self.orderings == "all"):
            if 2**k > MAX_CELLS:
                raise SpecProblem(
                    f"{self.design} with {k} factors needs {2**k} cells, above {MAX_CELLS}; use design: fractional or fewer factors",
                    "design",
                )
        return self

    @model_validator(mode="after")
    def _settings_build(self) -> "ExperimentSpec":
        names = [setting.name for setting in self.settings]
        for setting in self.settings:
            if not SETTING_NAME.fullmatch(setting.name) or len(setting.name) > MAX_SETTING_CHARS:
                raise SpecProblem(
                    f"setting name {shown_value(setting.name)} must start with a letter or digit and use only letters, digits, '_', "
                    f"'-' or '.', at most {MAX_SETTING_CHARS} of them",
                    "settings",
                )
            if names.count(setting.name) > 1:
                raise SpecProblem(f"setting '{setting.name}' is listed twice; give each setting its own name", "settings")
        if len(self.settings) == 1:
            raise SpecProblem("a transfer study needs two or more settings; add one or remove settings", "settings")
        self.setting_trainers()  # every setting builds, knobs included
        return self

    # ------------------------------------------------------------------------------ helpers
    def setting_trainers(self) -> list[tuple[str, TrainerConfig]]:
        """(name, trainer) per setting, in spec order; ``[("", trainer)]`` without settings."""
        if not self.settings:
            return [("", self.trainer)]
        out = []
        for setting in self.settings:
            data = _merge(self.trainer.to_dict(), setting.overrides, setting.name)
            try:
                out.append((setting.name, build_trainer_config(data, source=f"setting '{setting.name}'")))
            except ConfigError as err:
                raise SpecProblem(str(err), "settings") from None
        return out

    def setting_infos(self) -> list[SettingInfo]:
        """What each setting is (``setting_info``), in spec order; without settings, one named
        after the experiment."""
        stated = {setting.name: setting.attributes for setting in self.settings}
        return [setting_info(name or self.name, trainer, self.attributes, stated.get(name))
                for name, trainer in self.setting_trainers()]

    def to_dict(self) -> dict[str, Any]:
        """As ``TrainerBasedSpec.to_dict``, without the descriptive sections left out (so a spec
        written before they existed dumps the same)."""
        data = super().to_dict()
        for key in ("attributes", "confirm"):
            if data.get(key) is None:
                data.pop(key, None)
        if data.get("confirm") and data["confirm"].get("terms") is None:
            data["confirm"].pop("terms", None)
        for setting in data.get("settings") or []:
            if setting.get("attributes") is None:
                setting.pop("attributes", None)
        return data

    @property
    def factor_names(self) -> list[str]:
        """Canonical factor names in spec order (technique names, knob leaf names)."""
        return [entry if isinstance(entry, str) else next(iter(entry)) for entry in self.factors]


def check_adaptive(spec: ExperimentSpec) -> None:
    """design: adaptive: its first stage exists, its seeds fit max_seeds, no transfer settings."""
    settings = spec.adaptive or AdaptiveSpec()  # (filled in by the field's validator)
    k = len(spec.factors)
    if len(spec.seeds) > settings.max_seeds:
        raise SpecProblem(f"stage 1 has {len(spec.seeds)} seeds, above adaptive.max_seeds ({settings.max_seeds}); "
                          "give fewer seeds or raise max_seeds", "seeds")
    if spec.settings:
        raise SpecProblem("design: adaptive does not take transfer settings yet; run one adaptive experiment per "
                          "setting, or use design: full", "settings")
    if k < 2:
        raise SpecProblem("design: adaptive needs at least 2 factors; use design: full", "factors")
    if spec.resolution is not None or spec.generators is not None or k >= 5:
        try:
            first_stage_fraction(k, spec.resolution, spec.generators)
        except DesignError as err:
            raise SpecProblem(str(err), "generators" if spec.generators is not None else "design") from None


def first_stage_fraction(k: int, resolution: int | None, generators: list[str] | None) -> Fraction | None:
    """The fraction adaptive's stage 1 runs: the user's, else the fewest-run one of resolution V
    (None below 5 factors: every cell)."""
    if resolution is None and generators is None:
        if k < 5:
            return None
        resolution = 5
    return choose_fraction(k, resolution, generators)


def run_root(spec: ExperimentSpec | TrainerBasedSpec) -> Path:
    """The experiment's (or sweep's) run folders' parent, absolute: ``output_dir/<run_folder_name>``
    (a run's folder is ``run_root(spec) / <run id>``)."""
    return Path(spec.output_dir).expanduser().resolve() / run_folder_name(spec.name)


EVAL_CACHE_FOLDER = "eval-cache"
"""The step-0 evaluation cache every experiment and sweep in an output folder shares, beside their run folders."""


def run_folder_name(name: str) -> str:
    """The folder an experiment's or sweep's name gives its runs: the name, characters other than
    letters, digits, '.', '-' and '_' as '_'."""
    return re.sub(r"[^\w.-]+", "_", name)


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate an experiment YAML, raising SpecError with one sentence."""
    return load_spec_file(ExperimentSpec, path, kind="spec")


def build_spec(data: dict[str, Any], source: str = "experiment spec", base: str | Path = ".") -> ExperimentSpec:
    """Validate a plain dict; a relative `trainer:` file is read from ``base``."""
    return validate_spec(ExperimentSpec, data, source, base)


SpecT = TypeVar("SpecT", bound=BaseModel)


def load_spec_file(model: type[SpecT], path: str | Path, kind: str) -> SpecT:
    """Read a YAML file and validate it as `model`; errors name the `kind` of file ("sweep file")."""
    path = Path(path)
    try:
        data = read_yaml(path)
    except ConfigError as err:
        raise SpecError(str(err).replace("config file", f"{kind} file", 1)) from None
    return validate_spec(model, data, source=str(path), base=path.parent, from_file=True)


def validate_spec(model: type[SpecT], data: dict[str, Any], source: str, base: str | Path = ".",
                  from_file: bool = False) -> SpecT:
    """Validate a plain dict as `model` (a relative `trainer` file resolves against `base`), or
    raise SpecError. `from_file`: the data are a spec file's, in the folder `base`: its relative
    stores resolve against that folder too (`TrainerBasedSpec._stores_from_the_spec_folder`)."""
    try:
        return model.model_validate(data, context={"base": Path(base), "spec_folder": Path(base) if from_file else None})
    except ValidationError as err:
        raise SpecError(format_spec_error(err, source, model)) from None


# ---------------------------------------------------------------------------------- factors
