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

from dapo_ablate.ablation.runtime.adaptive import LookOutcome

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


def look_policy(spec: ExperimentSpec) -> SequentialLooks | None:
    """The policy of an adaptive spec; None for every other design."""
    return SequentialLooks(spec) if spec.design == "adaptive" else None


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
        self.settings = SequentialSettings(
            full_information_runs(len(self.factors), settings.max_seeds, settings.max_runs),
            delta=settings.effect_of_interest / 100, alpha=settings.alpha, spending=settings.spending, metric=spec.metric)
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
    from dapo_ablate.ablation.store.adaptive_state import adaptive_state
    from dapo_ablate.ablation.store.results import open_ledger

    ledger = open_ledger(spec)
    if ledger is None:
        looks = []
    else:
        with ledger:
            looks = adaptive_state(spec, ledger).looks
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
    return [f"adaptive: look {last['number']} at {last.get('runs')} runs: {decided}",
            f"alpha spent {float(last.get('spent', 0)):.4f} of {settings.alpha:g}; {state}; {budget}"]


def full_runs(spec: ExperimentSpec) -> int:
    """The most runs an adaptive experiment may plan: every cell at max_seeds, capped by max_runs."""
    settings = spec.adaptive
    most = 2 ** len(spec.factors) * settings.max_seeds
    return min(most, settings.max_runs) if settings.max_runs else most
