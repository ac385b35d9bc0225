"""`adaptive:` of an experiment spec with ``design: adaptive``: how the design grows look by look.

Stage 1 runs the spec's `seeds` on the first design (the resolution V fraction of the factors, or
the spec's own `resolution` / `generators`, or every cell below 5 factors); after each stage the
claims engine looks at the data and decides each term (supported, not supported, undecided) under
a group-sequential alpha-spending rule; the next stage adds seeds where the undecided terms'
intervals shrink most, or folds the fraction over to the full factorial; it stops when every term
is decided or a budget is spent.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dapo_ablate.ablation.experiment.spec_errors import SpecProblem

MIN_PP = 0.1
"""The smallest accuracy difference a spec can mean, in pp (the CLI's `app.units.MIN_PP` too)."""


class AdaptiveSpec(BaseModel):
    """The settings of ``design: adaptive`` (every one has a default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    seeds_per_look: int = Field(1, ge=1, le=100)
    """Seeds a stage adds to each cell it grows."""
    max_seeds: int = Field(6, ge=1, le=1000)
    """Most seeds any cell gets in all (stage 1's `seeds` included)."""
    max_runs: int | None = Field(None, ge=1)
    """Budget in runs (stage 1 included); None: only max_seeds bounds it."""
    max_tokens: int | None = Field(None, ge=1)
    """Budget in generated tokens over all runs; None: no token budget."""
    alpha: float = Field(0.05, gt=0, lt=0.5)
    """Family-wise error rate of the claims over all looks together."""
    spending: Literal["obrien_fleming", "pocock"] = "obrien_fleming"
    """Lan-DeMets alpha-spending function: O'Brien-Fleming-type (spends little early) or Pocock-type."""
    effect_of_interest: float = Field(2.0, gt=0)
    """Smallest effect worth finding, in percentage points of the metric (as `plan-seeds --effect`
    and `report --equivalence-margin` take them): a term whose interval lies inside +/- this is
    decided `not supported` (futility)."""

    @field_validator("effect_of_interest")
    @classmethod
    def _in_pp(cls, value: float) -> float:
        if value < MIN_PP:
            raise SpecProblem(f"{value:g} is in percentage points ({value:g} pp is less than one problem in a thousand); "
                              f"for {100 * value:g} pp write effect_of_interest: {100 * value:g}", "adaptive.effect_of_interest")
        if value > 100:
            raise SpecProblem(f"{value:g} is in percentage points and cannot exceed 100; e.g. 2 for 2 pp",
                              "adaptive.effect_of_interest")
        return value
