"""One convention for the accuracy differences a user types: percentage points, as every page and
console line shows them (`plan-seeds --effect 2 --sd 3`, `report --equivalence-margin 2`, an
adaptive spec's `effect_of_interest: 2`). The stores keep accuracies as fractions, so a size typed
for an accuracy metric (avg@k, pass@k, maj@k) is divided by 100 here; a value that only makes sense
as a fraction (below MIN_PP) or is no accuracy difference at all (above 100) is refused with the
fix. For any other metric the value is in the metric's own units, as given."""

from __future__ import annotations

from dapo_ablate.ablation.app.errors import UserError
from dapo_ablate.ablation.experiment.adaptive_spec import MIN_PP  # the spec's effect_of_interest: the same rule
from dapo_ablate.core.contracts import METRIC_PATTERN


def is_accuracy(metric: str) -> bool:
    return bool(METRIC_PATTERN.match(metric))


def metric_units(option: str, value: float, metric: str) -> float:
    """`value` of `option`, typed in pp for an accuracy `metric`, in the metric's stored units
    (a fraction); UserError for a value that cannot be meant in pp."""
    if not is_accuracy(metric):
        return value
    if value < MIN_PP:
        raise UserError(f"{option} {value:g} is in percentage points of {metric} ({value:g} pp is less than one problem "
                        f"in a thousand); for {100 * value:g} pp write {option} {100 * value:g}")
    if value > 100:
        raise UserError(f"{option} {value:g} is in percentage points of {metric} and cannot exceed 100; "
                        "give the difference in pp, e.g. 2 for 2 pp")
    return value / 100
