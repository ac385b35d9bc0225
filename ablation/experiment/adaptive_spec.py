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

from pydantic import BaseModel, ConfigDict, Field


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
    """Smallest effect worth finding, in percentage points of the metric: a term whose interval
    lies inside +/- this is decided `not supported` (futility)."""
