"""Where an adaptive experiment stands, read back from its ledger: the looks made so far (each one
records what it decided and the runs it added), so that every command plans the same runs.

The plan of ``design: adaptive`` is stage 1 plus every run a recorded look added
(`experiment.design.expand(spec, grown)`); a look that stopped the experiment adds none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.store.ledger import Ledger
from dapo_ablate.ablation.store.ledger_rules import unreadable_look

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
    """The experiment's looks in `ledger` (None, or an experiment not recorded yet: none), checked
    (`check_looks`)."""
    if ledger is None or spec.design != "adaptive" or ledger.get_experiment(spec.name) is None:
        return AdaptiveState()
    looks = ledger.looks(spec.name)
    check_looks(spec, looks, ledger.url)
    return AdaptiveState(looks)


def check_looks(spec: ExperimentSpec, looks: list[dict[str, Any]], url: str) -> None:
    """LedgerError naming the look and the fix (`ledger_rules.unreadable_look`) when the stored looks
    are not what drivers write: numbered 1, 2, ... without a gap, each adding (cell key, seed)
    pairs of the spec's design (a key of one 0/1 level per factor, a seed a whole number)."""
    k = len(spec.factor_names)
    for position, look in enumerate(looks, start=1):
        if look["number"] != position:
            raise unreadable_look(url, spec.name, look["number"], f"it follows look {position - 1}; look {position} is missing")
        added = look.get("added", [])
        if not isinstance(added, list) or not all(_is_run(pair, k) for pair in added):
            shown = next((pair for pair in added if not _is_run(pair, k)), added) if isinstance(added, list) else added
            raise unreadable_look(url, spec.name, position, f"it adds {shown!r}, not a (cell of {k} 0/1 levels, seed) pair")


def _is_run(pair: Any, k: int) -> bool:
    """A look's added run as drivers store it: [cell key, seed]."""
    if not isinstance(pair, list) or len(pair) != 2:
        return False
    key, seed = pair
    return (isinstance(key, str) and len(key) == k and set(key) <= {"0", "1"}
            and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0)


def current_plan(spec: ExperimentSpec, ledger: Ledger | None) -> Plan:
    """The spec's plan as it stands: for design: adaptive, stage 1 and what the recorded looks
    added; for every other design, `expand(spec)`."""
    from dapo_ablate.ablation.experiment.design import expand

    if spec.design != "adaptive":
        return expand(spec)
    return expand(spec, adaptive_state(spec, ledger).grown)
