"""Group-sequential decisions for an adaptive factorial: looks, alpha spending, the next stage.

An adaptive experiment runs in stages; after each stage a *look* reads the results table so far
(the tidy table ``analysis`` reads: one 0/1 column per factor, ``seed``, the metric) and decides
every term the design estimates (main effects and two-factor interactions, or their alias chains
in a fraction below resolution V):

- ``supported``: the repeated confidence interval (RCI) excludes 0;
- ``not supported`` (futility): the RCI lies inside (-delta, +delta), delta the effect of interest;
- ``undecided``: neither; the next stage adds runs.

Decisions are sticky: a term decided at one look keeps its decision (later looks still report
its estimate and RCI).

**Error control over looks** (Lan & DeMets 1983). Each term's information is 1 / Var(estimate);
its *information fraction* at a look is t = I / I_max, where I_max is the term's information in
the full factorial of ``full_information_runs`` runs (the most the experiment may run), read from
the design only (t = N_eff / N_max with N_eff = 4 / c'G^-1 c, the runs of a balanced full
factorial with the same precision), never from the noisy variance estimates. The two-sided
boundary c_k of look k at level a spends alpha(t_k) - alpha(t_{k-1}) of a spending function
(``spending.SPENDING``): P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1})
under the canonical joint distribution of the Z statistics (Z_k sqrt(t_k) a Brownian motion in
t), computed by recursive numerical integration (Armitage, McPherson & Rowe 1969; Jennison &
Turnbull 2000, ch. 19): the density of Z on the continuation region is carried from look to
look on a Simpson grid. The look that ends the experiment is made final by the caller
(``final=True``): its t is 1, so all of alpha is spent.

**Multiplicity** (Maurer & Bretz 2013, Holm's graph): with r terms not yet supported, each is
tested at level alpha / r with the boundaries of its own information fractions recomputed at that
level; a term that crosses frees its share, r falls, and the others are tested again at the larger
level, until none crosses. Futility is non-binding and frees nothing (a `not supported` term's
share stays reserved), so the family-wise error rate over all terms and looks is at most alpha.

**t, not z**: the estimates, SEs and Welch-Satterthwaite df are the report's own
(``inference.estimate`` on ``effects.effect_contrasts`` of ``analysis.fit_table``); a term's
t statistic enters as the z with the same two-sided p-value, and its RCI is estimate +/- q SE
with q the t_df quantile of the boundary's tail probability (Jennison & Turnbull 2000, sec. 3.8).

**Confirm mode** (``SequentialSettings.watch``): a later experiment that confirms another's
predictions watches only the predicted terms. Only they are tested and decided, Holm's graph runs
over them alone (r counts the watched terms not yet supported, so one watched term is tested at
alpha), and the experiment stops once every watched term is decided; every other term is reported
with its estimate as ``not watched`` (no interval, no decision, never a claim). The family-wise
error over the watched terms and all looks stays at most alpha.

**Next stage** (``next_stage``): every cell of a two-level factorial or regular fraction carries
every effect with the same weight |c_j| = 2 / m, so *which* cells carry the undecided terms is all
of them; what differs between candidate stages is the noise of the cells they grow and the
runs they cost. Candidates: more seeds in every cell; the fold-over (the cells of the full
factorial the fraction did not run, at the fraction's seeds per cell); more seeds in the noisier
half of the cells (Neyman allocation, n_j proportional to sigma_j). Each is scored by the
information it adds to the undecided terms per run, Var = (2/m)^2 sum_j sigma_j^2 / n_j with each
cell's variance shrunk toward the pooled one (``AdaptivePolicy.prior_df``), ties broken in that
order after the fold-over (in confirm mode the smallest of the tied stages: as much information
per run, and the next look sooner). A fraction whose undecided or supported alias chain holds two terms of
order <= 2 (resolution III/IV) is folded over first: only that separates them. The experiment
stops when every term is decided or no candidate fits the budget (max seeds per cell, runs,
generated tokens).

Wiring (the Scheduler of ``design: adaptive``): after each stage's runs finish,
``look(results, factors, settings, history, final=stage.final)``; record ``look.to_dict()`` in
the ledger (``SequentialHistory.from_dict(...)`` on resume); then
``next_stage(look, policy)`` -> ``Stage`` (cells and how many runs each gets, or stop). The
report shows ``look.table()`` per look and ``runs_saved(look, settings)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import optimize, stats

from dapo_ablate.core.contracts import DEFAULT_METRIC

from .analysis import fit_table, noise_model
from .spending import SPENDING, boundaries, exit_probabilities
from .design import describe_design
from .effects import effect_contrasts
from .inference import CellFit, estimate, quadratic_forms
from .table import ReportInputError, validate_results

SUPPORTED, NOT_SUPPORTED, UNDECIDED = "supported", "not supported", "undecided"
NOT_WATCHED = "not watched"
"""Confirm mode: a term the look estimates but does not decide (it was not predicted)."""
LOOK_COLUMNS = [
    "look", "term", "order", "estimate", "se", "df", "information", "level", "boundary", "z", "ci_low", "ci_high",
    "decision",
]  # fmt: skip


# --- looks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequentialSettings:
    """What every look of one adaptive experiment shares."""

    full_information_runs: int
    """Runs of the full factorial at which information is complete (t = 1): 2^k x max_seeds,
    or fewer when a budget caps the experiment (``full_information_runs``)."""
    delta: float = 0.02
    """Effect of interest in the metric's units (2 pp of a fraction metric is 0.02): a term whose
    RCI lies inside (-delta, +delta) is `not supported`."""
    alpha: float = 0.05
    """Family-wise error rate over all terms and looks."""
    spending: str = "obrien_fleming"
    """A name in SPENDING."""
    metric: str = DEFAULT_METRIC
    watch: tuple[str, ...] | None = None
    """Confirm mode: the only terms decided (``a`` or ``a:b`` as the looks name them; an alias chain
    ``a:b = c:d`` is watched when it holds one of them). None: every term."""


def watched(names: list[str], watch: tuple[str, ...] | None) -> np.ndarray:
    """Per term name: whether the look decides it (every term without ``watch``)."""
    if watch is None:
        return np.ones(len(names), dtype=bool)
    wanted = set(watch)
    return np.array([bool(wanted & {part.strip() for part in name.split("=")}) for name in names], dtype=bool)


def full_information_runs(k: int, max_seeds: int, max_runs: int | None = None) -> int:
    """Runs at t = 1: the full 2^k factorial at ``max_seeds`` per cell, capped by ``max_runs``."""
    runs = 2**k * max_seeds
    return min(runs, max_runs) if max_runs else runs


@dataclass(frozen=True)
class SequentialHistory:
    """What the earlier looks leave for the next: per term, its information fractions at the looks
    that tested it, and the decided terms (decision, look, level it was decided at)."""

    looks: int = 0
    fractions: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    decided: Mapping[str, tuple[str, int, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready (for the ledger); ``from_dict`` reads it back."""
        return {
            "looks": self.looks,
            "fractions": {term: list(values) for term, values in self.fractions.items()},
            "decided": {term: list(values) for term, values in self.decided.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> SequentialHistory:
        return cls(
            int(data.get("looks", 0)),
            {str(t): tuple(float(x) for x in v) for t, v in (data.get("fractions") or {}).items()},
            {str(t): (str(v[0]), int(v[1]), float(v[2])) for t, v in (data.get("decided") or {}).items()},
        )


@dataclass(frozen=True)
class CellState:
    """One observed cell at a look, for planning the next stage."""

    mask: int
    runs: int
    variance: float  # the cell's own residual variance s_j^2 (NaN with no residual df of its own)
    df: float  # its residual df nu_j
    tokens_per_run: float  # mean tokens_generated of its runs (NaN when not recorded)


@dataclass(frozen=True)
class Look:
    """The decisions of one look. ``table()``: one row per term (LOOK_COLUMNS)."""

    index: int
    runs: int
    k: int
    design: str  # full | fraction | incomplete
    resolution: int | None
    terms: pd.DataFrame = field(repr=False)  # LOOK_COLUMNS, 'ambiguous' (an alias chain with two terms of
    # order <= 2) and 'n_eff' (runs of a balanced full factorial as precise as the term's estimate)
    cells: tuple[CellState, ...] = field(repr=False)
    spent: float  # family-wise alpha spent so far: alpha(max t over the terms)
    final: bool
    history: SequentialHistory = field(repr=False)  # for the next look (this look included)
    pooled_variance: float = float("nan")  # the residual mean square (NaN without residual df)
    watch: tuple[str, ...] | None = None  # confirm mode: the watched terms (SequentialSettings.watch)

    def table(self) -> pd.DataFrame:
        return self.terms[LOOK_COLUMNS].copy()

    @property
    def undecided(self) -> list[str]:
        return list(self.terms.loc[self.terms["decision"] == UNDECIDED, "term"])

    @property
    def tokens_used(self) -> float:
        return float(np.nansum([c.tokens_per_run * c.runs for c in self.cells]))

    def to_dict(self) -> dict:
        """JSON-ready record of the look (its table and the history after it)."""
        rows = self.table().astype(object).where(self.table().notna(), None).to_dict(orient="records")
        data = {"look": self.index, "runs": self.runs, "spent": self.spent, "final": self.final,
                "terms": rows, "history": self.history.to_dict()}  # fmt: skip
        return data if self.watch is None else {**data, "watch": list(self.watch)}


def _t_to_z(p_value: np.ndarray, estimate_: np.ndarray) -> np.ndarray:
    """The z with the same two-sided p-value as the term's t, signed like the estimate."""
    with np.errstate(invalid="ignore"):
        return np.sign(estimate_) * stats.norm.isf(np.asarray(p_value) / 2)


def _t_multiplier(bound: float, df: float) -> float:
    """q with P(|T_df| >= q) = P(|Z| >= bound): the RCI's multiplier of the SE."""
    if not np.isfinite(bound):
        return np.inf
    tail = stats.norm.sf(bound)
    return float(stats.t.isf(tail, df)) if np.isfinite(df) and df > 0 else float(stats.norm.isf(tail))


def _fractions(previous: tuple[float, ...], now: float) -> tuple[float, ...]:
    """The term's fractions with this look's: a look at no more information than the last one
    replaces it (the same look again, e.g. after a resume), so fractions keep rising."""
    if previous and now <= previous[-1] + 1e-9:
        return previous[:-1] + (max(now, previous[-1]),)
    return previous + (now,)


@dataclass(frozen=True)
class _Tested:
    """Every term of a look, before the decisions."""

    names: list[str]
    orders: np.ndarray
    ambiguous: np.ndarray
    n_eff: np.ndarray  # runs of a balanced full factorial as precise as each term
    est: object  # inference.Estimates
    z: np.ndarray
    fractions: list[tuple[float, ...]]
    watched: np.ndarray  # confirm mode: the terms decided (every one without SequentialSettings.watch)


def _ambiguous(design, count: int) -> np.ndarray:
    """Per effect row: its alias chain holds two or more terms of order <= 2 (a fraction below
    resolution V), so only a fold-over tells them apart."""
    if design.kind != "fraction":
        return np.zeros(count, dtype=bool)
    groups = [group for group in design.alias_groups if len(group[0]) <= 2]
    return np.array([sum(len(term) <= 2 for term in group) >= 2 for group in groups], dtype=bool)


def _estimate_terms(results: pd.DataFrame, factors: list[str], settings: SequentialSettings, history, final: bool):
    """(_Tested, CellFit, design) of the table: the report's effects (main + two-factor, or chains)."""
    fit = fit_table(results, factors, settings.metric)
    design = describe_design(fit.masks, len(factors))
    contrasts = effect_contrasts(design, factors, fit.information(), max_order=2)
    if not contrasts.names:
        raise ReportInputError(
            "the cells run so far cannot separate main effects from interactions; run a full factorial or a "
            "regular fraction as the first stage"
        )
    noise, _ = noise_model(fit, design, contrasts, 1 - settings.alpha)
    est = estimate(fit, contrasts.contrasts, noise, 1 - settings.alpha)
    n_eff = 4.0 / quadratic_forms(fit, contrasts.contrasts)  # runs of a balanced full factorial as precise
    t_now = np.ones(len(n_eff)) if final else np.minimum(n_eff / settings.full_information_runs, 1.0)
    fractions = [
        _fractions(tuple(history.fractions.get(name, ())), float(t)) for name, t in zip(contrasts.names, t_now)
    ]
    ambiguous = _ambiguous(design, len(contrasts.names))
    z = _t_to_z(est.p_value, est.estimate)
    watching = watched(contrasts.names, settings.watch)
    if not watching.any():
        raise ReportInputError(
            f"confirm: none of the watched terms ({', '.join(settings.watch or ())}) is a main effect or two-factor "
            "interaction these runs estimate; name terms of the spec's factors in confirm.terms"
        )
    tested = _Tested(contrasts.names, contrasts.orders, ambiguous, n_eff, est, z, fractions, watching)
    return tested, fit, design


def _rci(est, i: int, level: float, fractions, spending: str) -> tuple[float, float, float]:
    """(boundary, ci_low, ci_high) of term i's RCI at ``level`` over its fractions."""
    bound = float(boundaries(fractions, level, spending)[-1])
    half = _t_multiplier(bound, float(est.df[i])) * float(est.se[i])
    return bound, float(est.estimate[i]) - half, float(est.estimate[i]) + half


def _holm_crossings(tested: _Tested, prior: dict, settings: SequentialSettings) -> tuple[dict[int, float], int]:
    """({term index: level} of the terms that cross now, r = terms not supported after them):
    Holm's graph over the group-sequential tests (module docstring)."""
    open_terms = [i for i, name in enumerate(tested.names)
                  if tested.watched[i] and prior.get(name) is None and np.isfinite(tested.z[i])]  # fmt: skip
    r = sum(1 for i, name in enumerate(tested.names) if tested.watched[i] and (prior.get(name) or ("",))[0] != SUPPORTED)
    crossed: dict[int, float] = {}
    while r > 0:
        level = settings.alpha / r
        hits = [
            i for i in open_terms
            if i not in crossed and abs(tested.z[i]) >= boundaries(tested.fractions[i], level, settings.spending)[-1]
        ]  # fmt: skip
        if not hits:
            break
        crossed.update({i: level for i in hits})
        r -= len(hits)
    return crossed, r


def _decide(tested: _Tested, history: SequentialHistory, settings: SequentialSettings, index: int):
    """(rows of LOOK_COLUMNS + ambiguous, the history after this look)."""
    prior = {name: history.decided.get(name) for name in tested.names}
    crossed, remaining = _holm_crossings(tested, prior, settings)
    open_level = settings.alpha / max(remaining, 1)
    decided, rows = dict(history.decided), []
    for i, name in enumerate(tested.names):
        if not tested.watched[i]:
            decision, level = NOT_WATCHED, float("nan")
        elif prior[name] is not None:
            decision, _, level = prior[name]
        elif i in crossed:
            decision, level = SUPPORTED, crossed[i]
        else:
            decision, level = UNDECIDED, open_level
        nan = float("nan")
        bound, low, high = (nan, nan, nan) if decision == NOT_WATCHED else _rci(
            tested.est, i, level, tested.fractions[i], settings.spending)
        if decision == UNDECIDED and -settings.delta < low and high < settings.delta:
            decision = NOT_SUPPORTED
        if prior[name] is None and decision not in (UNDECIDED, NOT_WATCHED):
            decided[name] = (decision, index, level)
        rows.append({
            "look": index, "term": name, "order": int(tested.orders[i]), "estimate": tested.est.estimate[i],
            "se": tested.est.se[i], "df": tested.est.df[i], "information": tested.fractions[i][-1], "level": level,
            "boundary": bound, "z": tested.z[i], "ci_low": low, "ci_high": high, "decision": decision,
            "ambiguous": bool(tested.ambiguous[i]), "n_eff": tested.n_eff[i],
        })  # fmt: skip
    fractions = dict(history.fractions) | dict(zip(tested.names, tested.fractions))
    return pd.DataFrame(rows), SequentialHistory(index, fractions, decided)


def _cell_states(results: pd.DataFrame, fit: CellFit) -> tuple[CellState, ...]:
    tokens = np.full(len(fit.masks), np.nan)
    if "tokens_generated" in results.columns:
        per_run = pd.to_numeric(results["tokens_generated"], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            sums = np.bincount(fit.cell_index, weights=np.nan_to_num(per_run), minlength=len(fit.masks))
            tokens = np.where(np.isnan(per_run).any(), np.nan, sums / fit.n)
    return tuple(
        CellState(int(mask), int(n), float(var), float(df), float(tok))
        for mask, n, var, df, tok in zip(fit.masks, fit.n, fit.cell_var, fit.cell_df, tokens)
    )


def look(
    results: pd.DataFrame,
    factors: list[str],
    settings: SequentialSettings,
    history: SequentialHistory | None = None,
    *,
    final: bool = False,
) -> Look:
    """Decide every term the results so far estimate (module docstring): supported, not supported
    or undecided, with repeated confidence intervals that hold over all looks.

    ``history``: the previous look's ``Look.history`` (None at the first look); ``final``: the last
    look (spends all of alpha). Raises ReportInputError for a bad table or cells that estimate no
    effects. Deterministic: the same table and history give the same decisions."""
    history = history or SequentialHistory()
    factors = list(factors)
    results = validate_results(results, factors, settings.metric)
    tested, fit, design = _estimate_terms(results, factors, settings, history, final)
    index = history.looks + 1
    terms, after = _decide(tested, history, settings, index)
    most = max(f[-1] for f, on in zip(tested.fractions, tested.watched) if on)
    spent = float(SPENDING[settings.spending](most, settings.alpha))
    return Look(
        index=index, runs=len(results), k=len(factors), design=design.kind, resolution=design.resolution, terms=terms,
        cells=_cell_states(results, fit), spent=spent, final=final, history=after,
        pooled_variance=float(fit.sigma2), watch=settings.watch,
    )  # fmt: skip


# --- the next stage --------------------------------------------------------------------------


@dataclass(frozen=True)
class AdaptivePolicy:
    """How stages grow and when they stop (the `adaptive:` settings of a spec)."""

    seeds_per_look: int = 1
    """Seeds a stage adds to each cell it grows."""
    max_seeds: int = 6
    """Most runs (seeds) any cell gets."""
    max_runs: int | None = None
    """Budget in runs over all stages; None: only max_seeds bounds it."""
    max_tokens: float | None = None
    """Budget in generated tokens over all runs (a stage's cost is estimated from the tokens its
    cells' runs generated so far); None: no token budget."""
    prior_df: float = 4.0
    """Planning only: each cell's variance is shrunk toward the pooled one as if the pooled
    variance were worth this many df (a cell with 1 or 2 df of its own is mostly noise)."""


STOP, SEEDS, FOLD_OVER, NOISY_CELLS = "stop", "seeds", "fold_over", "noisy_cells"


@dataclass(frozen=True)
class Stage:
    """What to run next: ``runs`` as (cell mask, first seed index, count): the cell's runs take
    seeds first .. first + count - 1 of the experiment's seed list (a cell's j-th run the j-th
    seed, so cells share seeds and stay blocks). ``final``: the look after this stage is the last
    (no further stage fits the budget), so pass ``final=True`` to it."""

    action: str  # STOP | SEEDS | FOLD_OVER | NOISY_CELLS
    runs: tuple[tuple[int, int, int], ...]
    reason: str
    final: bool = False

    @property
    def run_count(self) -> int:
        return sum(count for _, _, count in self.runs)


@dataclass(frozen=True)
class _Plan:
    """The cells as planned: runs and planning variance per cell mask."""

    k: int
    kind: str
    runs: dict[int, int]
    variance: dict[int, float]
    tokens: dict[int, float]


def _planning_state(last: Look, policy: AdaptivePolicy) -> _Plan:
    pooled = last.pooled_variance if np.isfinite(last.pooled_variance) and last.pooled_variance > 0 else 1.0
    variance, tokens = {}, {}
    for cell in last.cells:
        own = cell.df > 0 and np.isfinite(cell.variance)
        variance[cell.mask] = (
            (cell.df * cell.variance + policy.prior_df * pooled) / (cell.df + policy.prior_df) if own else pooled
        )
        tokens[cell.mask] = cell.tokens_per_run
    return _Plan(last.k, last.design, {c.mask: c.runs for c in last.cells}, variance, tokens)


def _effect_variance(plan: _Plan, runs: dict[int, int]) -> float:
    """Var of an effect, (2/m)^2 sum_j sigma_j^2 / n_j over the m cells of ``runs``; a cell the
    plan has no variance for (a fold-over's) takes the mean of the others."""
    fallback = float(np.mean(list(plan.variance.values())))
    return (2 / len(runs)) ** 2 * sum(plan.variance.get(mask, fallback) / n for mask, n in runs.items())


def _candidates(plan: _Plan, policy: AdaptivePolicy) -> list[tuple[str, dict[int, int]]]:
    """(action, {cell: runs added}) of each candidate stage, in tie-break order."""
    add = lambda mask: min(policy.seeds_per_look, policy.max_seeds - plan.runs.get(mask, 0))  # noqa: E731
    found = []
    if plan.kind == "fraction":
        seeds = min(int(round(np.mean(list(plan.runs.values())))), policy.max_seeds)
        found.append((FOLD_OVER, {mask: seeds for mask in range(2**plan.k) if mask not in plan.runs}))
    found.append((SEEDS, {mask: add(mask) for mask in plan.runs if add(mask) > 0}))
    if plan.kind != "incomplete":
        ranked = sorted(plan.runs, key=lambda mask: (-plan.variance[mask], mask))
        noisy = [mask for mask in ranked[: max(1, len(ranked) // 2)] if add(mask) > 0]
        found.append((NOISY_CELLS, {mask: add(mask) for mask in noisy}))
    return [(action, runs) for action, runs in found if runs]


def _fits(plan: _Plan, added: dict[int, int], policy: AdaptivePolicy) -> bool:
    total = sum(plan.runs.values()) + sum(added.values())
    if policy.max_runs is not None and total > policy.max_runs:
        return False
    if policy.max_tokens is None:
        return True
    known = [t for t in plan.tokens.values() if np.isfinite(t)]
    if not known:
        return True  # no token counts recorded: the run budget alone applies

    def per_run(mask: int) -> float:  # a cell without token counts (a fold-over's) costs the mean
        value = plan.tokens.get(mask, np.nan)
        return value if np.isfinite(value) else float(np.mean(known))

    used = sum(per_run(mask) * n for mask, n in plan.runs.items())
    return used + sum(per_run(mask) * n for mask, n in added.items()) <= policy.max_tokens


def _score(plan: _Plan, added: dict[int, int]) -> float:
    """Information the stage adds to an effect, relative to now, per run: (Var_now / Var_after - 1) / runs."""
    after = dict(plan.runs)
    for mask, n in added.items():
        after[mask] = after.get(mask, 0) + n
    return (_effect_variance(plan, plan.runs) / _effect_variance(plan, after) - 1) / sum(added.values())


def _grown(plan: _Plan, action: str, added: dict[int, int]) -> _Plan:
    runs = dict(plan.runs)
    for mask, n in added.items():
        runs[mask] = runs.get(mask, 0) + n
    kind = "full" if len(runs) == 2**plan.k else plan.kind
    fallback = float(np.mean(list(plan.variance.values())))
    variance = {mask: plan.variance.get(mask, fallback) for mask in runs}
    return replace(plan, kind=kind, runs=runs, variance=variance)


def next_stage(last: Look, policy: AdaptivePolicy) -> Stage:
    """The stage after look ``last`` (module docstring): stop when every term is decided or
    nothing fits the budget; fold a fraction over when an alias chain is ambiguous; else the
    candidate that adds the most information per run. Deterministic."""
    undecided = last.terms["decision"] == UNDECIDED
    if not undecided.any():
        return Stage(STOP, (), "every term is decided" if last.watch is None else "every watched term is decided")
    if last.final:
        return Stage(STOP, (), "the last look has been taken (budget spent)")
    plan = _planning_state(last, policy)
    fitting = [(action, added) for action, added in _candidates(plan, policy) if _fits(plan, added, policy)]
    if not fitting:
        return Stage(STOP, (), "no further stage fits the budget (max seeds, runs or tokens)")
    open_chains = last.terms["ambiguous"] & ~last.terms["decision"].isin([NOT_SUPPORTED, NOT_WATCHED])
    folds = [c for c in fitting if c[0] == FOLD_OVER]
    if open_chains.any() and folds:
        action, added = folds[0]
        reason = "an alias chain with two terms of order <= 2 is not ruled out: fold over to separate them"
    else:
        scores = [_score(plan, added) for _, added in fitting]
        best = max(scores)
        tied = [c for c, s in zip(fitting, scores) if s >= best * (1 - 1e-9)]
        # confirm mode: of stages as informative per run, the smallest, so the next look comes soonest
        action, added = min(tied, key=lambda c: sum(c[1].values())) if last.watch is not None else tied[0]
        reason = f"{int(undecided.sum())} undecided; most information per run ({best:.3g} of the current per run)"
    grown = _grown(plan, action, added)
    final = not any(_fits(grown, more, policy) for _, more in _candidates(grown, policy))
    runs = tuple((mask, plan.runs.get(mask, 0), n) for mask, n in sorted(added.items()))
    return Stage(action, runs, reason, final)


# --- runs saved ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunsSaved:
    """Runs the adaptive design used against the fixed full factorial of the same power."""

    term: str  # the term it is computed for: the least precise one
    runs_used: int
    power: float  # of the looks taken, for an effect of size delta, at level alpha / terms
    fixed_runs: float  # runs of the full factorial with that power (one look, same level)
    saved: float  # fixed_runs - runs_used

    def sentence(self, percent: bool = True) -> str:
        share = self.runs_used / self.fixed_runs if self.fixed_runs > 0 else float("nan")
        return (
            f"{self.runs_used} runs; the fixed full factorial with the same power ({self.power:.0%} for an effect "
            f"of the size of interest on {self.term}) needs {self.fixed_runs:.0f}: {share:.0%} of its runs."
        )


def runs_saved(last: Look, settings: SequentialSettings) -> RunsSaved:
    """Runs saved, estimated from the same data (method; in confirm mode over the watched terms):

    1. the least precise term's information now is I = 1 / SE^2 (its SE from the data), reached
       at information fraction t_K; earlier looks had I t_k / t_K;
    2. the power of the looks actually taken, for a true effect delta, at the first Holm level
       alpha / terms (as ``power.plan_seeds``): the exit probabilities of its boundaries with drift
       delta sqrt(I / t_K) (``exit_probabilities``);
    3. the fixed full factorial of N runs has information I N / N_eff (N_eff: this design's
       precision in runs of a balanced full factorial) and one look at the same level; its power
       Phi(x - z) + Phi(-x - z), x = delta sqrt(I N / N_eff), is set equal to (2) and solved for N.
    A look forced final (t_K = 1 below full information) puts the earlier looks at I t_k, a
    little less than they had: the power, and so the runs saved, err low."""
    decided = last.terms[last.terms["decision"] != NOT_WATCHED]  # confirm mode: the watched terms only
    terms = decided[np.isfinite(decided["se"].astype(float)) & (decided["se"].astype(float) > 0)]
    if terms.empty:
        return RunsSaved("", last.runs, float("nan"), float("nan"), float("nan"))
    row = terms.loc[terms["se"].astype(float).idxmax()]
    fractions = last.history.fractions[row["term"]]
    level = settings.alpha / len(decided)
    information = 1.0 / float(row["se"]) ** 2
    drift = settings.delta * np.sqrt(information / fractions[-1])
    power = float(exit_probabilities(boundaries(fractions, level, settings.spending), fractions, drift).sum())
    power = min(max(power, level), 1 - 1e-9)
    z = stats.norm.isf(level / 2)
    x = optimize.brentq(lambda x: stats.norm.cdf(x - z) + stats.norm.cdf(-x - z) - power, 0.0, 60.0)
    fixed = float(row["n_eff"]) * (x / (settings.delta * np.sqrt(information))) ** 2
    return RunsSaved(str(row["term"]), last.runs, power, float(fixed), float(fixed - last.runs))
