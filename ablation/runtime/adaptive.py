"""``design: adaptive`` as a `Scheduler` of the one `Driver`: the factorial scheduler of the runs
planned so far, which, once all of them are done, looks at the data and either grows the plan or
stops.

A look is made by a `LookPolicy` the caller passes in (the app layer wires the claims engine's
group-sequential decisions, `reports.sequential`: the runtime imports no statistics). It gets the
plan and every finished run's record, and the looks before it; it returns what to record and the
(cell key, seed) runs to add, none to stop. The look is stored in the ledger first
(`Ledger.record_look`, once per number: a second driver adopts the first one's), then its runs are
added and queued, so a driver stopped at any point resumes where the ledger says: the plan is
always stage 1 plus what the recorded looks added (`store.adaptive_state.current_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dapo_ablate.ablation.runtime.factorial import FactorialScheduler
from dapo_ablate.ablation.store.adaptive_state import AdaptiveState, adaptive_state
from dapo_ablate.ablation.store.ledger import DONE, PENDING, Ledger
from dapo_ablate.ablation.store.transient import Retrying, retry_transient

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


@dataclass(frozen=True)
class LookOutcome:
    """What one look decided: `record` (JSON: decisions, spending, intervals; stored in the ledger
    and shown by `status` and the report), the runs to add as (cell key, seed), none to stop, and
    one line saying why."""

    record: dict[str, Any]
    add: list[tuple[str, int]]
    summary: str


class LookPolicy(Protocol):
    """Looks at the finished runs of `plan` (their `Ledger.results` records) given the earlier
    looks (`Ledger.looks`), and decides what follows."""

    def __call__(self, plan: Plan, records: list[dict[str, Any]], looks: list[dict[str, Any]]) -> LookOutcome: ...


class AdaptiveScheduler(FactorialScheduler):
    """A `FactorialScheduler` whose plan grows at each look (see the module docstring)."""

    def __init__(self, spec: ExperimentSpec, plan: Plan, ledger: Ledger, policy: LookPolicy) -> None:
        super().__init__(spec, plan, ledger)
        self.policy = policy
        self.left_undecided: dict[str, dict[str, Any]] | None = None
        """The plan's rows when this driver ended before the look (a run failed, or held by another
        driver): where the runs stand for its summary, even once another driver finished them."""
        self.taken_back: set[str] = set()
        """Runs found pending at the end (handed back: their driver died) and queued again by this
        invocation: each once, so a run nobody can claim never loops."""

    def plan_rows(self) -> dict[str, dict[str, Any]]:
        """The ledger's rows of the plan's runs; once this driver ended before the look, the rows it
        ended on: a run another driver finished since is that driver's to look at and publish, so
        this one never reports every run done (nor a headline) for a plan no look decided."""
        return self.left_undecided if self.left_undecided is not None else super().plan_rows()

    def finished(self) -> bool:
        """Asked with nothing in flight. With runs still queued: no. Else the plan first catches up
        with the looks other drivers stored (their runs join it; a look is never made on a stale
        plan, nor a stop taken from a look this driver did not plan for); a run handed back pending
        since (its driver died) is queued, once. Then, once every planned run is done (a failed or
        elsewhere-held run waits for the next invocation), look: True when the look stops the
        experiment, else its runs are queued."""
        if self.queue:
            return False
        state = self._catch_up()
        if self.queue:
            return False  # runs another driver's look added: this driver trains its share
        rows = self.plan_rows()
        pending = [run_id for run_id, row in rows.items() if row["status"] == PENDING and run_id not in self.taken_back]
        if pending:  # handed back since this driver queued its runs (another driver died): it trains them
            self.taken_back.update(pending)
            self.enqueue(pending)
            return False
        if any(row["status"] != DONE for row in rows.values()):
            self.left_undecided = rows  # failed or held runs end this invocation; `run` again resumes before the look
            return True
        if state.stopped:
            return True
        look = self._look(len(state.looks) + 1, state.looks)
        added = [(str(key), int(seed)) for key, seed in look.get("added", [])]
        if not added:
            return True
        self._grow(state.grown + added)
        return False  # the driver asks again: queued runs start, or (all done elsewhere) the next look

    def _catch_up(self) -> AdaptiveState:
        """The looks stored so far; the plan grown by those another driver recorded since this one
        planned (stage 1 plus every stored look's runs, `store.adaptive_state.current_plan`)."""
        state = retry_transient(lambda: adaptive_state(self.spec, self.ledger), "read the looks")
        if {(str(key), int(seed)) for key, seed in state.grown} - {(run.cell.key, run.seed) for run in self.plan.runs}:
            self.listeners.note(f"{self.name}: another driver's looks grew the plan; caught up with look {len(state.looks)}")
            self._grow(state.grown)
        return state

    def _look(self, number: int, looks: list[dict[str, Any]]) -> dict[str, Any]:
        """Look `number`: decided by the policy and stored, or the one another driver stored first."""
        self.read_records()
        records = [self.records[run.run_id] for run in self.plan.runs if run.run_id in self.records]
        outcome = self.policy(self.plan, records, looks)
        record = {**outcome.record, "runs": len(self.plan.runs), "added": [list(pair) for pair in outcome.add],
                  "stopped": not outcome.add, "summary": outcome.summary}
        stored = Retrying(self.ledger)
        if not stored.record_look(self.name, number, record, doing=f"record look {number}"):
            record = stored.looks(self.name, doing="read the looks")[number - 1]
        self.listeners.note(f"{self.name}: look {number}: {record['summary']}")
        self.listeners.looked([{**look, "recorded_at": str(look["recorded_at"])} for look in self.ledger.looks(self.name)])
        return record

    def _grow(self, grown: list[tuple[str, int]]) -> None:
        """The plan with the looks' runs: added to the ledger and queued with a fresh budget."""
        from dapo_ablate.ablation.experiment.design import expand

        self.plan = expand(self.spec, grown)
        new = [run for run in self.plan.runs if run.run_id not in self.planned]
        self.planned.update((run.run_id, run) for run in new)
        Retrying(self.ledger).add_runs(self.name, [run.to_run_spec() for run in new], doing="add the look's runs")
        claimable = set(self.ledger.claimable(self.name, lease_s=self.lease_s, max_attempts=self.retries + 1))
        for run in new:
            if run.run_id in claimable:
                self.queue.append(run.run_id)
                self.budget[run.run_id] = self.retries + 1
        self.listeners.grown(self.plan, len(new))
