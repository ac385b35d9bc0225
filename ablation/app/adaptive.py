"""The look policy of ``design: adaptive``: the claims engine's group-sequential decisions
(`reports.sequential`) wired into the runtime's `AdaptiveScheduler` as its `LookPolicy`.

At each look: the finished runs' results table, the history the previous look recorded, a look
(every term supported, not supported or undecided, with repeated confidence intervals), then the
next stage (which cells get which seeds, a fold-over, or stop) turned into (cell key, seed) runs.
A cell's j-th run takes the j-th seed of the experiment's seed list: the spec's `seeds` (stage 1),
then the next unused integers, so cells share seeds and stay blocks.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.app.errors import UserError
from dapo_ablate.ablation.runtime.adaptive import LookOutcome

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


def look_policy(spec: ExperimentSpec) -> SequentialLooks | None:
    """The policy of an adaptive spec; None for every other design. In confirm mode the watched
    terms are checked against the looks already recorded (``check_watch``)."""
    if spec.design != "adaptive":
        return None
    policy = SequentialLooks(spec)
    check_watch(spec, policy.confirm)
    return policy


def confirm_watch(spec: ExperimentSpec) -> dict[str, Any] | None:
    """Confirm mode (``design: adaptive`` with ``confirm:``): what each look records under
    ``confirm`` (``reports.confirm_looks``): the predictions file, the margin (the effect of
    interest), the setting and the watched predictions: ``confirm.terms``, else every main effect
    and two-factor interaction the file predicts away from zero. None without ``confirm:``. A file
    that is not a predictions file, or terms it does not predict or this design does not estimate,
    are one sentence (UserError)."""
    if spec.design != "adaptive" or spec.confirm is None:
        return None
    from dapo_ablate.reports.predictions import load_predictions
    from dapo_ablate.reports.table import ReportInputError
    from dapo_ablate.reports.verdicts import NULL, setting_matches

    where = f"confirm.predictions {spec.confirm.predictions!r}"
    try:
        predictions = load_predictions(spec.confirm.predictions, spec.metric, where=where)
    except ReportInputError as error:
        raise UserError(str(error)) from None
    factors = spec.factor_names
    named = {_canonical_term(p.term, factors): p for p in predictions if p.statistic in ("main", "interaction")}
    if len([p for p in predictions if p.statistic in ("main", "interaction")]) > len(named):
        raise UserError(f"{where} predicts a term more than once (from several settings); keep one setting's "
                        "predictions in the file to confirm them with design: adaptive")
    if spec.confirm.terms:
        chosen = [_canonical_term(term, factors) for term in spec.confirm.terms]
        unknown = [term for term in chosen if term not in named]
        if unknown:
            raise UserError(f"confirm.terms: {unknown[0]!r} is not a main effect or two-factor interaction {where} "
                            f"predicts; name some of {', '.join(named) or 'none'}")
    else:
        chosen = [term for term, p in named.items() if p.direction != NULL]
        if not chosen:
            raise UserError(f"{where} predicts no main effect or interaction away from zero; name the terms to watch "
                            "in confirm.terms")
    estimable = set(factors) | {f"{a}:{b}" for i, a in enumerate(factors) for b in factors[i + 1:]}
    outside = [term for term in chosen if term not in estimable]
    if outside:
        raise UserError(f"confirm: {outside[0]!r} is not a main effect or two-factor interaction of this spec's factors "
                        f"({', '.join(factors)}); add its factors or name other terms in confirm.terms")
    info = spec.setting_infos()[0]
    predicted = [{"statistic": named[t].statistic, "term": t, "direction": named[t].direction,
                  "estimate": named[t].estimate, "ci_low": named[t].ci_low, "ci_high": named[t].ci_high,
                  "from_setting": named[t].from_setting.get("name", ""),
                  "matches_setting": setting_matches(named[t].for_setting, info)} for t in chosen]  # fmt: skip
    return {"predictions": spec.confirm.predictions, "margin": spec.adaptive.effect_of_interest / 100,
            "setting": info.name, "predicted": predicted}


def _canonical_term(term: str, factors: list[str]) -> str:
    """``a`` or ``a:b`` with its factors in the spec's order (as the looks name an interaction)."""
    parts = [part.strip() for part in term.split(":")]
    order = {name: i for i, name in enumerate(factors)}
    return ":".join(sorted(parts, key=lambda part: order.get(part, len(order)))) if len(parts) == 2 else term


def check_watch(spec: ExperimentSpec, confirm: dict[str, Any] | None) -> None:
    """The watched terms are part of the error guarantee: refuse a spec that watches other terms
    than the looks this experiment already recorded (one sentence, UserError)."""
    looks = recorded_looks(spec)
    if not looks:
        return
    before = looks[-1].get("watch")
    now = [p["term"] for p in confirm["predicted"]] if confirm else None
    if before != now:
        said = lambda terms: ", ".join(terms) if terms else "every term"  # noqa: E731
        raise UserError(f"confirm: experiment '{spec.name}' has looks that watched {said(before)}; this spec watches "
                        f"{said(now)} (changing them mid-way voids the error guarantee); restore its confirm: section "
                        "or give the experiment another name")


def recorded_looks(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """The looks the ledger recorded for this experiment (none without a ledger)."""
    from dapo_ablate.ablation.store.adaptive_state import adaptive_state
    from dapo_ablate.ablation.store.results import open_ledger

    ledger = open_ledger(spec)
    if ledger is None:
        return []
    with ledger:
        return adaptive_state(spec, ledger).looks


def seed_list(spec: ExperimentSpec) -> list[int]:
    """The seeds cells take in order: the spec's, then the smallest unused integers, up to
    adaptive.max_seeds in all."""
    seeds = list(spec.seeds)
    candidate = 0
    while len(seeds) < spec.adaptive.max_seeds:
        if candidate not in seeds:
            seeds.append(candidate)
        candidate += 1
    return seeds


def cell_key(mask: int, k: int) -> str:
    """A cell's key (levels in factor order) from its mask (bit i: factor i)."""
    return "".join(str((mask >> i) & 1) for i in range(k))


class SequentialLooks:
    """`LookPolicy` of one adaptive spec (see the module docstring)."""

    def __init__(self, spec: ExperimentSpec) -> None:
        from dapo_ablate.reports.sequential import AdaptivePolicy, SequentialSettings, full_information_runs

        settings = spec.adaptive
        self.factors = spec.factor_names
        self.seeds = seed_list(spec)
        self.confirm = confirm_watch(spec)
        watch = tuple(p["term"] for p in self.confirm["predicted"]) if self.confirm else None
        self.settings = SequentialSettings(
            full_information_runs(len(self.factors), settings.max_seeds, settings.max_runs),
            delta=settings.effect_of_interest / 100, alpha=settings.alpha, spending=settings.spending, metric=spec.metric,
            watch=watch)
        self.policy = AdaptivePolicy(settings.seeds_per_look, settings.max_seeds, settings.max_runs, settings.max_tokens)

    def __call__(self, plan: Plan, records: list[dict[str, Any]], looks: list[dict[str, Any]]) -> LookOutcome:
        from dapo_ablate.ablation.store.results import results_frame
        from dapo_ablate.reports.sequential import SequentialHistory, look, next_stage, runs_saved

        previous = looks[-1] if looks else None
        history = SequentialHistory.from_dict(previous["history"]) if previous else None
        final = bool(previous and previous.get("next_final"))
        made = look(results_frame(records, self.factors), self.factors, self.settings, history, final=final)
        stage = next_stage(made, self.policy)
        add = [(cell_key(mask, len(self.factors)), self.seeds[j])
               for mask, first, count in stage.runs for j in range(first, first + count)]
        saved = runs_saved(made, self.settings)
        record = {**made.to_dict(), "action": stage.action, "reason": stage.reason, "next_final": stage.final,
                  "runs_saved": saved.sentence() if saved.term else None}
        if self.confirm:
            record["confirm"] = self.confirm
        return LookOutcome(record, add, self.summary(made, stage, len(add)))

    @staticmethod
    def summary(made: Any, stage: Any, added: int) -> str:
        """``3 supported, 2 not supported, 10 undecided (alpha spent 0.0031); seeds: 16 runs added (...)``."""
        counts = Counter(made.terms["decision"])
        decided = ", ".join(f"{counts.get(d, 0)} {d}" for d in ("supported", "not supported", "undecided"))
        then = f"{stage.action.replace('_', ' ')}: {added} runs added ({stage.reason})" if added else f"stop: {stage.reason}"
        return f"{made.runs} runs, {decided} (alpha spent {made.spent:.4f}); {then}"


def look_lines(spec: ExperimentSpec, plan: Plan) -> list[str]:
    """What `status` says of an adaptive experiment: the current look, its decided and undecided
    terms, the alpha spent and the budget left (empty for every other design)."""
    if spec.design != "adaptive":
        return []
    looks = recorded_looks(spec)
    settings = spec.adaptive
    most = full_runs(spec)
    budget = f"budget: {len(plan.runs)} of at most {most} runs planned" + (
        f", at most {settings.max_tokens:,} generated tokens" if settings.max_tokens else "")
    if not looks:
        return [f"adaptive: no look yet (the first comes when stage 1's {len(plan.runs)} runs are done); {budget}"]
    last = looks[-1]
    by_decision: dict[str, list[str]] = {}
    for row in last.get("terms", []):
        by_decision.setdefault(str(row.get("decision")), []).append(str(row.get("term")))
    decided = "; ".join(f"{len(by_decision.get(d, []))} {d}" + (f" ({', '.join(by_decision[d])})" if by_decision.get(d) else "")
                        for d in ("supported", "not supported", "undecided"))
    state = "stopped: " + str(last.get("reason")) if last.get("stopped") else f"then {str(last.get('action', '')).replace('_', ' ')}"
    lines = [f"adaptive: look {last['number']} at {last.get('runs')} runs: {decided}",
             f"alpha spent {float(last.get('spent', 0)):.4f} of {settings.alpha:g}; {state}; {budget}"]
    if last.get("watch") is not None:
        lines.insert(1, f"confirm mode: watching only the predicted {', '.join(last['watch'])}; every other term is "
                        "estimated, not decided")
    return lines


def full_runs(spec: ExperimentSpec) -> int:
    """The most runs an adaptive experiment may plan: every cell at max_seeds, capped by max_runs."""
    settings = spec.adaptive
    most = 2 ** len(spec.factors) * settings.max_seeds
    return min(most, settings.max_runs) if settings.max_runs else most
