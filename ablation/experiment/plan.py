"""The human-readable plan that `dapo-ablate validate` and `run --dry-run` print.

`format_plan(plan)` returns a string and prints nothing, so the CLI decides where it goes and
tests can read it.
"""

from __future__ import annotations

import math

from dapo_ablate.ablation.experiment.design import Calibration, ComputeEstimate, Plan
from dapo_ablate.ablation.experiment.fractions import LETTERS, roman
from dapo_ablate.core.policy import policies_to_build

__all__ = ["format_duration", "format_plan", "format_tokens"]

LISTED_ORDERINGS = 6
"""Orderings are named in the printout up to this many; beyond, only counted."""
WIDTH = 12  # label column


def format_plan(plan: Plan, seconds_per_run: float | None = None, calibration: Calibration | None = None,
                estimate_note: str | None = None) -> str:
    """Experiment, design, factors, runs, orderings, what the design supports, aliases,
    estimated compute (calibrated on measured runs when `calibration` is given) and where
    results go, as aligned lines. `estimate_note`: where the run time is estimated instead of
    scaling it from the CPU quickstart (the backend's, `runtime.backends.registry.estimate_note`:
    verl's GPU-hours), unless measured run times are given."""
    spec = plan.spec
    lines = [_row("experiment", f"{spec.name}  (spec {spec.digest()[:12]})"), _row("design", _design(plan))]
    lines += _block("factors", _factor_lines(plan))
    if plan.settings:
        lines += _block("settings", _setting_lines(plan))
    seeds = plan.seeds
    lines.append(_row("seeds", f"{len(seeds)}: {_seed_text(seeds)}"))
    per_setting = f" x {len(plan.settings)} settings" if plan.settings else ""
    if plan.design == "adaptive":
        lines.append(_row("runs", _adaptive_runs(plan)))
    else:
        lines.append(_row("runs", f"{len(plan.runs)} = {len(plan.cells)} unique cells{per_setting} x {len(seeds)} seed{'s' if len(seeds) != 1 else ''}"))
    lines.append(_row("metric", spec.metric))
    lines.append(_row("orderings", _orderings(plan)))
    lines += _block("supports", plan.supports)
    if plan.aliases:
        lines += _block("aliases", plan.aliases)
    note = estimate_note if seconds_per_run is None and calibration is None else None
    lines += _block("compute", _compute(plan.estimate(seconds_per_run, calibration), note) + _builds(plan))
    lines += _block(
        "results",
        [
            f"ledger   {spec.ledger}",
            f"tracking {spec.tracking.uri}" + (f" (artifacts {spec.tracking.artifact_location})" if spec.tracking.artifact_location else ""),
            f"outputs  {spec.output_dir}/",
            f"ray      {spec.executor.address or 'local'} ({_resources(plan)})",
        ],
    )
    return "\n".join(lines)


def _row(label: str, text: str) -> str:
    return f"{label:<{WIDTH}}{text}"


def _block(label: str, items: list[str]) -> list[str]:
    return [_row(label if i == 0 else "", item) for i, item in enumerate(items)] or [_row(label, "-")]


def _design(plan: Plan) -> str:
    k = len(plan.factors)
    if plan.design == "full":
        return f"full 2^{k} = {len(plan.cells)} cells"
    if plan.design == "fractional":
        p = len(plan.generators)
        return (
            f"fractional 2^({k}-{p}) = {len(plan.cells)} cells, resolution {roman(plan.resolution or 0)}, "
            f"generators {', '.join(plan.generators)} (letters in factor order)"
        )
    if plan.design == "adaptive":
        return _adaptive_design(plan)
    if plan.design == "one_at_a_time":
        return f"one at a time: baseline, each factor alone, each left out of the full recipe, full = {len(plan.cells)} cells"
    what = "all orderings" if plan.spec.orderings == "all" else ", ".join(plan.ordering_name(o) for o in plan.requested_orderings)
    return f"cumulative ({what}) = {len(plan.cells)} cells"


SPENDING_NAMES = {"obrien_fleming": "O'Brien-Fleming-type", "pocock": "Pocock-type"}


def _adaptive_design(plan: Plan) -> str:
    settings, k = plan.spec.adaptive, len(plan.factors)
    first = (f"fractional 2^({k}-{len(plan.generators)}), resolution {roman(plan.resolution or 0)}"
             if plan.generators else f"full 2^{k}")
    return (f"adaptive: stage 1 {first}, grown look by look; claims at family-wise alpha {settings.alpha:g} over all "
            f"looks ({SPENDING_NAMES[settings.spending]} spending), effect of interest {settings.effect_of_interest:g} pp")


def _adaptive_runs(plan: Plan) -> str:
    settings, k = plan.spec.adaptive, len(plan.factors)
    most = 2**k * settings.max_seeds if settings.max_runs is None else min(settings.max_runs, 2**k * settings.max_seeds)
    seeds = len(plan.seeds)
    return (f"{len(plan.runs)} so far in {len(plan.cells)} cells (stage 1: {seeds} seed{'s' if seeds != 1 else ''} each); "
            f"each look adds {settings.seeds_per_look} seed{'s' if settings.seeds_per_look != 1 else ''} where undecided, "
            f"at most {settings.max_seeds} per cell and {most} runs in all")


def _factor_lines(plan: Plan) -> list[str]:
    """``A  OF        techniques.overlong_filter  off / on``: the letter generators use, the label, where
    the levels go, and the levels."""
    short = max(len(f.short) for f in plan.factors)
    path = max(len(f.path) for f in plan.factors)
    return [
        f"{LETTERS[i] if i < len(LETTERS) else '-'}  {f.short:<{short}}  {f.path:<{path}}  {f.describe_levels()}"
        for i, f in enumerate(plan.factors)
    ]


def _setting_lines(plan: Plan) -> list[str]:
    """``tight     rollout.max_response_len=16, algorithm.overlong_cache=4``: each setting of a
    transfer study and its overrides of the base trainer (dotted keys)."""
    width = max(len(name) for name in plan.settings)
    return [
        f"{setting.name:<{width}}  {', '.join(f'{k}={v}' for k, v in _dotted(setting.overrides)) or 'the base trainer'}"
        for setting in plan.spec.settings
    ]


def _dotted(overrides: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested override mappings flattened to (dotted key, value) pairs, in spec order."""
    out: list[tuple[str, object]] = []
    for key, value in overrides.items():
        if isinstance(value, dict) and value:
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _seed_text(seeds: list[int]) -> str:
    if seeds == list(range(len(seeds))) and len(seeds) > 3:
        return f"0..{len(seeds) - 1}"
    return ", ".join(map(str, seeds))


def _orderings(plan: Plan) -> str:
    count, k = plan.orderings_count, len(plan.factors)
    total = math.factorial(k)
    if count == 0:
        return f"none of the {total} complete orderings (no path from the baseline to the full recipe)"
    text = f"{count} of {total}"
    if count <= LISTED_ORDERINGS:
        text += ": " + ", ".join(plan.ordering_name(o) for o in plan.orderings)
    elif plan.paper_ordering in plan.orderings:
        text += " (the paper's included)"
    return text


def _compute(est: ComputeEstimate, note: str | None = None) -> list[str]:
    """The compute block. With a backend's `note` (verl: its jobs' GPU-hour block) the time is
    estimated there: one estimate per plan, not a second one scaled from the CPU quickstart."""
    tokens = f"at most ~{format_tokens(est.tokens_upper)} generated tokens (every response at the ceiling, one sampling round per step)"
    if note:
        return [f"{est.runs} runs: {note}", tokens]
    if est.measured:
        source = "given"
    elif est.calibration is not None:
        cal = est.calibration
        source = (f"calibrated on {cal.runs} finished run{'s' if cal.runs != 1 else ''} in the ledger: "
                  f"measured mean {format_duration(cal.measured_s / cal.runs)}")
    else:
        source = "rough, scaled from the built-in CPU quickstart; calibrated once runs have finished"
    lines = [
        f"{est.runs} runs x ~{format_duration(est.seconds_per_run)} each ({source})",
        f"{est.parallelism} at a time -> ~{format_duration(est.wall_s)} wall ({format_duration(est.run_seconds)} of run time)",
        tokens,
    ]
    if est.real_model and not est.measured and est.calibration is None:
        lines.append("the scaling assumes the built-in model; time one run of a real model and pass its seconds instead")
    return lines


def _builds(plan: Plan) -> list[str]:
    """The built-in policies the runs need that neither ship nor are cached here: built once, first."""
    models = [(run.config.model, run.config.data.builtin_task) for run in plan.runs]
    return [f"+ ~{format_duration(build.rough_s)} (rough) first, once: building the built-in {build.words}, which is "
            "not shipped or cached here" for build in policies_to_build(models)]


def _resources(plan: Plan) -> str:
    ex = plan.spec.executor
    per_run = f"{ex.cpus_per_run:g} CPU" + (f" + {ex.gpus_per_run:g} GPU" if ex.gpus_per_run else "") + " per run"
    at_once = f"at most {ex.max_concurrent} at a time" if ex.max_concurrent else "as many at a time as resources allow"
    attempts = ex.retries + 1
    return (f"{per_run}, {at_once}, {attempts} attempt{'s' if attempts != 1 else ''} per run in all "
            f"(executor.retries {ex.retries})")


def format_duration(seconds: float) -> str:
    """12 s, 3.5 min, 2.1 h, 1.5 d."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def format_tokens(tokens: int) -> str:
    """950, 12.3k, 4.5M, 1.2B."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= size:
            return f"{tokens / size:.1f}{suffix}"
    return str(tokens)
