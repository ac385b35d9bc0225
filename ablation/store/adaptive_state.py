"""Where an adaptive experiment stands, read back from its ledger: the looks made so far (each one
records what it decided and the runs it added), so that every command plans the same runs.

The plan of ``design: adaptive`` is stage 1 plus every run a recorded look added
(`experiment.design.expand(spec, grown)`); a look that stopped the experiment adds none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.store.ledger import Ledger

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


@dataclass(frozen=True)
class AdaptiveState:
    """The looks recorded so far, in order (`Ledger.looks`), and what they add up to."""

    looks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def grown(self) -> list[tuple[str, int]]:
        """(cell key, seed) of every run the looks added, in the order they were added."""
        return [(str(key), int(seed)) for look in self.looks for key, seed in look.get("added", [])]

    @property
    def stopped(self) -> bool:
        """True once a look decided to stop (every term decided, or a budget spent)."""
        return bool(self.looks) and bool(self.looks[-1].get("stopped"))


def adaptive_state(spec: ExperimentSpec, ledger: Ledger | None) -> AdaptiveState:
    """The experiment's looks in `ledger` (None, or an experiment not recorded yet: none)."""
    if ledger is None or spec.design != "adaptive" or ledger.get_experiment(spec.name) is None:
        return AdaptiveState()
    return AdaptiveState(ledger.looks(spec.name))


def current_plan(spec: ExperimentSpec, ledger: Ledger | None) -> Plan:
    """The spec's plan as it stands: for design: adaptive, stage 1 and what the recorded looks
    added; for every other design, `expand(spec)`."""
    from dapo_ablate.ablation.experiment.design import expand

    if spec.design != "adaptive":
        return expand(spec)
    return expand(spec, adaptive_state(spec, ledger).grown)
