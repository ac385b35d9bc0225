"""`dapo-ablate sweep-report`: what a sweep found, from its Optuna study alone.

Tables (pandas; written as CSV and in report.md):

- ``best_params``: the best complete trial's knobs and value;
- ``trials``: one row per trial: number, state, value (pruned: its last intermediate value), the
  knobs, the step it was pruned at, seconds, error, and which trial retried it; in robustness
  mode ``effect.<factor>`` with its CI;
- ``importances``: Optuna's fANOVA parameter importances for the objective (and, in robustness
  mode, for each factor's effect): how much of the variation across trials each knob explains.
  They need at least `MIN_IMPORTANCE_TRIALS` complete trials in which some knob varied;
  otherwise the table is empty and the report says why;
- ``effects`` (robustness mode): one row per complete trial x factor: the knobs, the effect
  (on - off, mean over seeds) and its 95% t interval over seeds (none with one seed), and
  ``effect_summary``: per factor, the effect's mean, range and sign across knob settings.

Figures (PNG, matplotlib Agg): ``history.png`` (values by trial, best so far), ``importances.png``,
``effects.png`` (each factor's effect against each knob, with CIs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from dapo_ablate.sweeps.report_data import SweepReport
from dapo_ablate.sweeps.spec import SweepSpec

MIN_IMPORTANCE_TRIALS = 3


def read_report(spec: SweepSpec) -> SweepReport:
    """The report of the sweep's study as it stands; StudyError when it was never run."""
    from dapo_ablate.sweeps.study import load_study

    factors = [f if isinstance(f, str) else next(iter(f)) for f in spec.factors or []]
    return build_report(load_study(spec), spec.metric, list(spec.space), factors)


def build_report(study: Any, metric: str, knobs: list[str], factors: list[str]) -> SweepReport:
    """The report's tables from an Optuna study (`knobs`: the searched knobs, in spec order)."""
    trials = study.get_trials(deepcopy=False)
    direction = study.direction.name.lower()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    best_params = pd.DataFrame(
        [{"trial": best.number, metric: best.value, **best.params}] if best else [], columns=["trial", metric, *knobs]
    )
    importances, note = param_importances(study, complete, knobs, factors)
    report = SweepReport(study.study_name, metric, direction, knobs, factors, best_params,
                         trials_table(trials, metric, knobs, factors), importances, note)
    if factors:
        report.effects = effects_table(complete, knobs, factors)
        report.effect_summary = effect_summary(report.effects, factors)
    if best is None:
        report.notes.append("no trial is complete yet, so there is no best setting")
    return report


def trials_table(trials: list[FrozenTrial], metric: str, knobs: list[str], factors: list[str]) -> pd.DataFrame:
    retried_as = {n: t.number for t in trials for n in t.system_attrs.get("retry_history", [])[-1:]}
    rows = []
    for t in trials:
        value = t.value
        if t.state == TrialState.PRUNED and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name, metric: value}
        row.update({knob: t.params.get(knob) for knob in knobs})
        row.update({"pruned_at_step": t.user_attrs.get("pruned_at_step"), "seconds": seconds,
                    "retried_as": retried_as.get(t.number), "error": t.user_attrs.get("error")})
        for factor in factors:
            effect = (t.user_attrs.get("effects") or {}).get(factor) or {}
            row.update({f"effect.{factor}": effect.get("mean"), f"effect.{factor}.ci_low": effect.get("ci_low"),
                        f"effect.{factor}.ci_high": effect.get("ci_high")})
        rows.append(row)
    columns = ["trial", "state", metric, *knobs, "pruned_at_step", "seconds", "retried_as", "error"]
    columns += [f"effect.{f}{s}" for f in factors for s in ("", ".ci_low", ".ci_high")]
    return pd.DataFrame(rows, columns=columns)


def param_importances(study: Any, complete: list[FrozenTrial], knobs: list[str], factors: list[str]) -> tuple[pd.DataFrame, str]:
    """fANOVA importances of the knobs for the objective (and each factor's effect); a note
    instead when there are too few complete trials or no knob varied."""
    import optuna

    targets: list[tuple[str, Any]] = [("objective", None)]
    targets += [(f"effect.{f}", _effect_target(f)) for f in factors]
    empty = pd.DataFrame(columns=["target", "knob", "importance"])
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return empty, (f"parameter importances need at least {MIN_IMPORTANCE_TRIALS} complete trials "
                       f"(this study has {len(complete)}); run more trials")
    varied = [k for k in knobs if len({json.dumps(t.params.get(k)) for t in complete}) > 1]
    if not varied:
        return empty, "parameter importances need a knob whose value differs between complete trials"
    rows = []
    for name, target in targets:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        try:
            values = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varied, target=target)
        except (RuntimeError, ValueError) as err:  # e.g. a target that is constant
            return empty, f"parameter importances could not be computed ({err})"
        rows += [{"target": name, "knob": knob, "importance": value} for knob, value in values.items()]
    return pd.DataFrame(rows, columns=["target", "knob", "importance"]), ""


def _effect_target(factor: str):
    return lambda t: ((t.user_attrs.get("effects") or {}).get(factor) or {}).get("mean", math.nan)


def effects_table(complete: list[FrozenTrial], knobs: list[str], factors: list[str]) -> pd.DataFrame:
    rows = []
    for t in complete:
        for factor in factors:
            effect = (t.user_attrs.get("effects") or {}).get(factor)
            if effect:
                rows.append({"trial": t.number, "factor": factor, **{k: t.params.get(k) for k in knobs},
                             "effect": effect["mean"], "ci_low": effect.get("ci_low"), "ci_high": effect.get("ci_high"),
                             "seeds": effect.get("n")})
    return pd.DataFrame(rows, columns=["trial", "factor", *knobs, "effect", "ci_low", "ci_high", "seeds"])


def effect_summary(effects: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per factor across knob settings: mean, min and max effect, the share of settings where it
    is positive, and the shares whose CI lies wholly above / below zero."""
    rows = []
    for factor in factors:
        sub = effects[effects["factor"] == factor]
        if sub.empty:
            continue
        has_ci = sub["ci_low"].notna()
        rows.append({
            "factor": factor, "settings": len(sub), "mean_effect": sub["effect"].mean(),
            "min_effect": sub["effect"].min(), "max_effect": sub["effect"].max(),
            "share_positive": (sub["effect"] > 0).mean(),
            "share_ci_above_0": (sub.loc[has_ci, "ci_low"] > 0).sum() / len(sub) if has_ci.any() else None,
            "share_ci_below_0": (sub.loc[has_ci, "ci_high"] < 0).sum() / len(sub) if has_ci.any() else None,
        })
    return pd.DataFrame(rows, columns=["factor", "settings", "mean_effect", "min_effect", "max_effect",
                                       "share_positive", "share_ci_above_0", "share_ci_below_0"])


# ------------------------------------------------------------------------------------ output
def write_report(report: SweepReport, out: str | Path) -> list[Path]:
    """CSV tables, report.md and PNG figures into `out`; the paths written."""
    from dapo_ablate.sweeps import plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"best_params": report.best_params, "trials": report.trials, "importances": report.importances}
    if report.effects is not None:
        tables.update({"effects": report.effects, "effect_summary": report.effect_summary})
    written = []
    for name, table in tables.items():
        path = out / f"{name}.csv"
        table.to_csv(path, index=False)
        written.append(path)
    figures = {"history.png": plots.history_plot(report), "importances.png": plots.importance_plot(report)}
    if report.effects is not None:
        figures["effects.png"] = plots.effects_plot(report)
    for name, png in figures.items():
        if png is not None:
            (out / name).write_bytes(png)
            written.append(out / name)
    path = out / "report.md"
    path.write_text(markdown(report, [p.name for p in written if p.suffix == ".png"]))
    return [path, *written]


def markdown(report: SweepReport, figures: list[str]) -> str:
    n_states = report.trials["state"].value_counts().to_dict()
    states = ", ".join(f"{count} {state.lower()}" for state, count in n_states.items())
    parts = [f"# Sweep {report.name}\n", f"Objective: {report.direction} `{report.metric}`; trials: {states or 'none'}.\n"]
    parts += [f"_{note}._\n" for note in report.notes]
    parts += ["## Best setting\n", md_table(report.best_params) if len(report.best_params) else "No complete trial yet.\n"]
    parts.append("## Parameter importances (fANOVA)\n")
    parts.append(md_table(report.importances) if len(report.importances) else f"_{report.importance_note}._\n")
    if report.effects is not None:
        parts += [
            "## Factor effects across knob settings\n",
            "Effect = on - off at each knob setting, mean over seeds, with a 95% t interval over seeds "
            "(blank with one seed). The trial's value is the full-on cell's objective.\n",
            md_table(report.effect_summary) if report.effect_summary is not None else "",
            md_table(report.effects) if len(report.effects) else "No complete trial yet.\n",
        ]
    parts += ["## Trials\n", md_table(report.trials.dropna(axis=1, how="all"))]
    parts += [f"![{name}]({name})\n" for name in figures]
    return "\n".join(parts)


def md_table(table: pd.DataFrame) -> str:
    """GitHub Markdown of a small table; floats to 4 significant digits, blanks for missing."""
    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", r"\|").replace("\n", " ")

    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"
