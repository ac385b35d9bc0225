"""Planning a transfer study: seeds per cell for the verdict you want, from each setting's own noise.

The transfer report (``transfer``) gives every term one verdict from each setting's own estimate,
SE and df. This module computes the chance of the verdict wanted, for the term the design
measures least precisely, under the same rule and the same multiplicity the report applies:

- ``transfers``: the effect is the same in every setting (planted equal), and the report shows
  every pair of settings within the equivalence margin by two one-sided tests at alpha
  (``heterogeneity.excluded_beyond_many`` below the margin), with no difference or flip
  claimed;
- ``differs``: the effect differs by ``size`` between two settings, and the report claims it
  ("differs in size" by Welch's test after the report's adjustment, or "flips sign"). The
  arrangement planned for is the least favourable one: the two settings whose difference is the
  least precise (the largest SEs) ``size`` apart, every other setting at their inverse-variance
  midpoint, which gives Welch's test the smallest noncentrality a gap of ``size`` can have
  (w_a w_b / (w_a + w_b) size^2); by that noncentrality, any other arrangement with that gap is
  detected at least as often.

The report's multiplicity: its families are each setting's own (attribution, interactions, order,
pooled over the settings), ``transfer`` (one Welch test per term) and ``flips`` (simultaneous
intervals over every term in every setting), Bonferroni over the F families; with one real
difference among the T terms, Holm's and Benjamini-Hochberg's first step is Bonferroni over T
(as ``power.plan_seeds`` plans a claims family), so the planned power is slightly low when
several terms differ at once.

How the power is computed: by simulating what the report computes from a setting's runs, not a
normal approximation. With n seeds per cell as blocks (balanced, m cells) and run noise sd sigma,
a statistic c'mu has the estimate theta + sigma sqrt(sum c_j^2 / n) Z, and each cell's own
variance estimate is s_j^2 = sigma^2 chi2(nu) / nu with nu = (n - 1)(m - 1) / m
(``inference``: the leverage-corrected residual df of a cell); the report's SE is
sqrt(sum c_j^2 s_j^2 / n) on Welch-Satterthwaite df (sum c_j^2 s_j^2)^2 / sum (c_j^2 s_j^2)^2 / nu,
so the few-df statistics (a Shapley value leans on a few cells) pay for their estimated df as
they do in the report. PLAN_DRAWS draws from a fixed generator: the same plan every time, each
power within about half a point of its exact value (binomial sd at 80%: 0.4 points). For designs
of more than CELL_LEVEL_CELLS cells the variance estimate is drawn as one scaled chi-square on the
statistic's Welch df (``power.welch_df``): with that many cells the df the report estimates vary
little.

Seeds per setting: ``equal`` gives every setting the same count (what one spec runs: its seeds
are every setting's); ``by-noise`` gives each setting seeds in proportion to its noise sd, which
for the difference of two settings is the allocation with the fewest runs (n_a / n_b =
sigma_a / sigma_b minimises n_a + n_b at a given sigma_a^2 / n_a + sigma_b^2 / n_b): a setting 3x
noisier gets 3x the seeds, not the 9x that would give it the quieter one's precision. The smallest
allocation reaching the power is the first step of the allocation's ladder that does (power rises
with every setting's seeds), found by a doubling search and bisection on COARSE_DRAWS reports,
then settled on PLAN_DRAWS from there: a few full evaluations per plan, not one per step.

What a budget buys (``detectable``): for given seeds per setting, the smallest margin that equal
effects are shown within ("transfers") and the smallest difference between two settings the
report claims ("differs"), each with the wanted power.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .design import describe_design
from .effects import effect_contrasts
from .heterogeneity import excluded_beyond_many, flip_p_many, verdicts_of, welch_heterogeneity_many
from .multiplicity import across_families, bonferroni
from .power import MAX_SEEDS, family_contrasts, half_fraction, welch_df
from .table import MAX_FACTORS, ReportInputError

TRANSFERS, DIFFERS = "transfers", "differs"
PLAN_VERDICTS = (TRANSFERS, DIFFERS)
EQUAL, BY_NOISE = "equal", "by-noise"
ALLOCATIONS = (EQUAL, BY_NOISE)
PLAN_DRAWS = 10_000
"""Simulated reports per power evaluation (binomial sd 0.4 points at 80%)."""
PLAN_SEED = 34
"""The generator's seed: the same inputs give the same plan."""
CELL_LEVEL_CELLS = 128
"""Up to this many cells a statistic leans on, each cell's variance estimate is drawn (the df
vary as the report's do); above it, one scaled chi-square on the Welch df."""
MIN_SEEDS = 2
"""A setting's own variance needs two seeds per cell (with one, the report takes Lenth's PSE)."""
AWAY = 50.0
"""Planted values lie this many SEs from zero, where no sign flips."""


@dataclass(frozen=True)
class Adjustment:
    """How the report adjusts one term's transfer tests: ``terms`` share the transfer family (and
    the flips family, times the settings), ``families`` claims families share alpha (Bonferroni),
    within each family ``adjust`` (holm | bh | none)."""

    terms: int
    families: int
    alpha: float = 0.05
    adjust: str = "holm"


@dataclass(frozen=True)
class TransferTest:
    """The report's transfer verdict on one statistic of one design: the statistic's least precise
    contrast over the observed cells, how many terms share the transfer and flips families, and
    how many claims families the report has (each setting's own, pooled, plus those two)."""

    design: str
    statistic: str
    contrast: np.ndarray  # [m] over the observed cells
    terms: int
    families: int
    alpha: float = 0.05
    adjust: str = "holm"

    @property
    def cells(self) -> int:
        return len(self.contrast)

    @property
    def adjustment(self) -> Adjustment:
        return Adjustment(self.terms, self.families, self.alpha, self.adjust)


def transfer_tests(factors: list[str], alpha: float = 0.05, adjust: str = "holm") -> list[TransferTest]:
    """The statistics a transfer report judges, per design (the full 2^k and, from 3 factors, the
    half fraction of highest resolution): its Shapley values where the design gives them, and its
    main and two-factor effects (one row: they share a precision in these designs; the least
    precise is planned for). ReportInputError for more than MAX_FACTORS factors."""
    k = len(factors)
    if k > MAX_FACTORS:
        raise ReportInputError(
            f"plan-seeds got {k} factors, and a report analyses at most {MAX_FACTORS}; plan a design of "
            f"{MAX_FACTORS} or fewer with --factors"
        )
    designs = [(f"full 2^{k}", np.arange(2**k))]
    if k >= 3:
        designs.append((f"half fraction 2^({k}-1)", half_fraction(k)))
    tests = []
    for name, cells in designs:
        design = describe_design(cells, k)
        label = name + (f" (resolution {design.resolution})" if design.kind == "fraction" else "")
        families = family_contrasts(design, factors)
        effects = effect_contrasts(design, factors, np.eye(len(cells)), max_order=2)
        rows = effects.contrasts[(effects.orders == 1) | (effects.orders == 2)]
        shapley = families["attribution"][1] if families["attribution"][0] == "Shapley value" else None
        terms = len(rows) + (0 if shapley is None else len(shapley))
        common = {"terms": terms, "families": len(families) + 2, "alpha": alpha, "adjust": adjust}
        effect = _least_precise(rows)
        if shapley is None:
            tests.append(TransferTest(label, "main or interaction effect", effect, **common))
        elif _same_precision(_least_precise(shapley), effect):
            tests.append(TransferTest(label, "Shapley value, main or interaction effect", effect, **common))
        else:
            tests.append(TransferTest(label, "Shapley value", _least_precise(shapley), **common))
            tests.append(TransferTest(label, "main or interaction effect", effect, **common))
    return tests


def _least_precise(rows: np.ndarray) -> np.ndarray:
    return rows[int(np.argmax(np.sum(rows**2, axis=1)))]


def _same_precision(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two contrasts weigh the cells alike up to order (then their SEs and df are drawn
    alike, and one row plans both)."""
    return len(a) == len(b) and np.allclose(np.sort(a**2), np.sort(b**2))


@dataclass(frozen=True)
class SimulatedTerm:
    """What PLAN_DRAWS simulated reports show for one term, before its true values are added:
    each setting's estimation error, SE and df ([draws, S])."""

    error: np.ndarray
    se: np.ndarray
    df: np.ndarray
    true_se: np.ndarray  # [S]

    def statistics(self, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return truth + self.error, self.se, self.df


def simulate_term(test: TransferTest, sigmas, seeds, draws: int = PLAN_DRAWS) -> SimulatedTerm:
    """The term's estimation error, SE and df in each setting of ``draws`` simulated reports
    (module docstring): setting s has run noise sd sigmas[s] and seeds[s] seeds per cell. Setting
    s's normal draws come from generator (PLAN_SEED, s) and its chi-squares from (PLAN_SEED, s, n),
    so a setting's draws do not change when another setting's seeds do."""
    c2 = test.contrast[test.contrast != 0] ** 2
    m = test.cells
    errors, ses, dfs, true_ses = [], [], [], []
    for index, (sigma, n) in enumerate(zip(np.asarray(sigmas, dtype=float), np.asarray(seeds, dtype=int))):
        weights, nu = c2 / n, (n - 1) * (m - 1) / m
        true_se = sigma * np.sqrt(weights.sum())
        errors.append(true_se * np.random.default_rng([PLAN_SEED, index]).standard_normal(draws))
        rng = np.random.default_rng([PLAN_SEED, index, int(n)])
        if len(c2) <= CELL_LEVEL_CELLS:
            parts = weights * sigma**2 * rng.chisquare(nu, size=(draws, len(c2))) / nu
            variance = parts.sum(axis=1)
            dfs.append(variance**2 / np.sum(parts**2, axis=1) * nu)
        else:
            df = welch_df(test.contrast, m, int(n))
            variance = true_se**2 * rng.chisquare(df, size=draws) / df
            dfs.append(np.full(draws, df))
        ses.append(np.sqrt(variance))
        true_ses.append(true_se)
    return SimulatedTerm(np.stack(errors, 1), np.stack(ses, 1), np.stack(dfs, 1), np.array(true_ses))


def verdict_shares(adjustment: Adjustment, theta, se, df, margin: float) -> dict[str, np.ndarray]:
    """{verdict: bool array} (the verdicts a plan counts) of the report's rule (``heterogeneity.verdicts_of``) on simulated
    values (arrays [..., S]), with each term's adjusted p-values as the report adjusts them when
    it is the one term that differs (first step of Holm or BH: Bonferroni over the family)."""
    s = theta.shape[-1]
    if (theta < 0).any():  # a sign to flip (the planted values lie AWAY from zero: almost never)
        with np.errstate(invalid="ignore", divide="ignore"):
            p_flip = flip_p_many(theta, 2 * stats.t.sf(np.abs(theta) / se, df))
    else:
        p_flip = np.ones(theta.shape[:-1])
    p_welch = welch_heterogeneity_many(theta, se, df)[3]
    p_adjusted = _adjusted(p_welch, adjustment.terms, adjustment)
    flip_adjusted = _adjusted(p_flip, adjustment.terms * s, adjustment)
    # an infinite margin (planning "differs") needs no excluded_beyond: every value is below it
    excluded = excluded_beyond_many(theta, se, df, adjustment.alpha) if np.isfinite(margin) else np.zeros(theta.shape[:-1])
    words = verdicts_of(np.ones(theta.shape[:-1], dtype=bool), flip_adjusted, p_adjusted, excluded, margin, adjustment.alpha)
    return {word: words == word for word in ("transfers", "differs in size", "flips sign")}


def _adjusted(p: np.ndarray, count: int, adjustment: Adjustment) -> np.ndarray:
    within = p if adjustment.adjust == "none" else bonferroni(p, count)
    return across_families(within, adjustment.families, adjustment.adjust)


def least_favourable(size, true_se: np.ndarray) -> np.ndarray:
    """True values of a term that differs by ``size`` between two settings, arranged as Welch's
    test detects least often: the two settings with the largest SEs (the least precise pair)
    ``size`` apart, every other at their inverse-variance midpoint; AWAY SEs above zero, so that
    no sign flips. Arrays [..., S] (``size``: [...] or one number)."""
    true_se = np.asarray(true_se, dtype=float)
    size = np.asarray(size, dtype=float)[..., None]
    order = np.argsort(-true_se, axis=-1, kind="stable")
    a, b = order[..., :1], order[..., 1:2]
    w_a = 1 / np.take_along_axis(true_se, a, axis=-1) ** 2
    w_b = 1 / np.take_along_axis(true_se, b, axis=-1) ** 2
    away = AWAY * true_se.max(axis=-1, keepdims=True)
    truth = np.array(np.broadcast_to(away + size * w_a / (w_a + w_b), np.broadcast_shapes(true_se.shape, size.shape)))
    np.put_along_axis(truth, a, away + size, axis=-1)
    np.put_along_axis(truth, b, away, axis=-1)
    return truth


def planted(verdict: str, size, true_se: np.ndarray) -> np.ndarray:
    """The true values a plan is for: ``transfers``: the same value in every setting; ``differs``:
    ``least_favourable``. Both AWAY SEs from zero, where no sign can flip (the verdict rule is
    otherwise blind to where the values lie)."""
    true_se = np.asarray(true_se, dtype=float)
    if verdict == TRANSFERS:
        return np.broadcast_to(AWAY * true_se.max(axis=-1, keepdims=True), true_se.shape)
    return least_favourable(size, true_se)


class Planner:
    """Powers of one statistic's transfer verdicts for one set of setting noise levels, each
    allocation's simulated reports drawn once (``simulate_term``) and shared by every verdict and
    size asked of it."""

    def __init__(self, test: TransferTest, sigmas) -> None:
        self.test, self.sigmas = test, np.asarray(sigmas, dtype=float)
        self._terms: dict[tuple, SimulatedTerm] = {}

    def term(self, seeds, draws: int = PLAN_DRAWS) -> SimulatedTerm:
        key = (tuple(int(n) for n in seeds), draws)
        if key not in self._terms:
            self._terms[key] = simulate_term(self.test, self.sigmas, seeds, draws)
        return self._terms[key]

    def power(self, seeds, verdict: str, size: float, margin: float, draws: int = PLAN_DRAWS) -> float:
        """The chance that the report gives ``verdict`` (``transfers``: for equal values, within
        ``margin``; ``differs``: a difference of ``size``, claimed) with these seeds per setting."""
        return float(share(self.test.adjustment, self.term(seeds, draws), verdict, size, margin))


def power_of(test: TransferTest, sigmas, seeds, verdict: str, size: float, margin: float) -> float:
    """``Planner.power`` of one allocation."""
    return Planner(test, sigmas).power(seeds, verdict, size, margin)


def share(adjustment: Adjustment, term: SimulatedTerm, verdict: str, size, margin: float) -> np.ndarray:
    """The share of the simulated reports (the first axis) that give ``verdict`` (``differs``:
    "differs in size" or "flips sign") for the values ``planted`` for it, per term."""
    shares = verdict_shares(adjustment, *term.statistics(planted(verdict, size, term.true_se)), margin)
    wanted = ("transfers",) if verdict == TRANSFERS else ("differs in size", "flips sign")
    hits = sum(shares.get(word, np.zeros(term.error.shape[:-1], dtype=bool)) for word in wanted)
    return np.mean(hits, axis=0)


def ladder(sigmas, allocation: str) -> np.ndarray:
    """[steps, S]: the seeds per setting an allocation tries, smallest first, each step adding
    seeds to at least one setting and taking none away: ``equal``, 2, 3, ... in every setting;
    ``by-noise``, each setting's seeds the smallest whole number at or above x sigma_s /
    sigma_min (at least MIN_SEEDS) as x grows. At most MAX_SEEDS in any setting."""
    sigmas = np.asarray(sigmas, dtype=float)
    if allocation == EQUAL:
        counts = np.arange(MIN_SEEDS, MAX_SEEDS + 1)
        return np.repeat(counts[:, None], len(sigmas), axis=1)
    ratio = sigmas / sigmas.min()
    x = np.unique(np.concatenate([np.arange(1, MAX_SEEDS + 1) / r for r in ratio]))
    steps = np.maximum(MIN_SEEDS, np.ceil(x[:, None] * ratio[None, :] - 1e-9)).astype(int)
    steps = np.unique(steps[(steps <= MAX_SEEDS).all(axis=1)], axis=0)
    return steps[np.argsort(steps.sum(axis=1), kind="stable")]


@dataclass(frozen=True)
class Found:
    """The smallest seeds per setting reaching the power (None: not within MAX_SEEDS) and the
    power they give."""

    seeds: np.ndarray | None
    power: float


COARSE_DRAWS = 1_000
"""Draws per power evaluation while the search closes in (then PLAN_DRAWS at the steps it decides
between)."""


def seeds_for(planner: Planner, verdict: str, size: float, margin: float, power: float, allocation: str) -> Found:
    """The first step of the allocation's ``ladder`` whose power for ``verdict`` reaches ``power``:
    found with COARSE_DRAWS, then settled with PLAN_DRAWS from there (power rises along the
    ladder), so a plan takes a few full evaluations rather than one per step."""
    steps = ladder(planner.sigmas, allocation)

    def reaches(draws: int):
        return lambda i: planner.power(steps[i], verdict, size, margin, draws) >= power

    rough = first_reaching(len(steps), reaches(COARSE_DRAWS), 0)
    found = first_reaching(len(steps), reaches(PLAN_DRAWS), min(rough, len(steps) - 1))
    if found == len(steps):
        return Found(None, float("nan"))
    return Found(steps[found], planner.power(steps[found], verdict, size, margin))


def first_reaching(count: int, reaches, start: int) -> int:
    """The first index in 0..count-1 where ``reaches`` (false, then true: monotone) holds, searched
    from ``start``: steps doubling away from it until the answer is bracketed, then bisection.
    ``count`` if it never holds."""
    if reaches(start):
        low, high, step = start - 1, start, 1  # reaches(high); low: not reaches, or -1 (below)
        while low >= 0 and reaches(low):
            high, low, step = low, max(low - 2 * step, -1), 2 * step
    else:
        low, step = start, 1  # not reaches(low)
        while True:
            high = min(low + step, count - 1)
            if high == low:
                return count
            if reaches(high):
                break
            low, step = high, 2 * step
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def detectable(planner: Planner, seeds, power: float) -> tuple[float, float]:
    """What seeds per setting buy, at ``power``: (the smallest margin within which equal values are
    shown, "transfers"; the smallest difference between two settings claimed, "differs",
    arranged as ``least_favourable``), on the simulated reports ``Planner.power`` reads."""
    adjustment, term = planner.test.adjustment, planner.term(seeds)
    theta, se, df = term.statistics(planted(TRANSFERS, 0.0, term.true_se))
    shares = verdict_shares(adjustment, theta, se, df, np.inf)  # an infinite margin: every term not claimed
    eligible = shares.get("transfers", np.zeros(len(theta), dtype=bool))
    ends = np.sort(np.where(eligible, excluded_beyond_many(theta, se, df, adjustment.alpha), np.inf))
    needed = int(np.ceil(power * len(ends) - 1e-9))
    margin = float(np.nextafter(ends[needed - 1], np.inf)) if needed >= 1 else 0.0
    return margin, float(smallest_differences(adjustment, term, power))


def smallest_differences(adjustment: Adjustment, term: SimulatedTerm, power: float) -> np.ndarray:
    """Per term, the smallest difference between two settings (``least_favourable``) the report
    claims in a share ``power`` of the simulated reports: the noise held fixed, so the share rises
    with the difference; doubling, then bisection to a thousandth of the SE of the least precise
    pair's difference. Inf where no difference up to 10^6 of those SEs is claimed that often."""
    pair_se = np.sqrt(np.sort(term.true_se**2, axis=-1)[..., -2:].sum(axis=-1))
    low, high = np.zeros_like(pair_se), pair_se.copy()
    for _ in range(20):  # 2^20 pair SEs: beyond any difference a report could be asked about
        short = share(adjustment, term, DIFFERS, high, np.inf) < power
        if not short.any():
            break
        low, high = np.where(short, high, low), np.where(short, 2 * high, high)
    reached = share(adjustment, term, DIFFERS, high, np.inf) >= power
    while (active := (high - low) > 1e-3 * pair_se).any():  # each term stops at its own tolerance
        middle = (low + high) / 2
        ok = share(adjustment, term, DIFFERS, middle, np.inf) >= power
        low, high = np.where(active & ~ok, middle, low), np.where(active & ok, middle, high)
    return np.where(reached, high, np.inf)


DETECTABLE_POWER = 0.8
"""The power of the transfer report's ``detectable_difference`` (plan-seeds' default power)."""
REPORT_DRAWS = 4_000
"""Simulated reports behind a report's ``detectable_difference`` (per term; a few hundredths of
a pp from the value at PLAN_DRAWS)."""


def detectable_differences(se, df, adjustment: Adjustment, power: float = DETECTABLE_POWER) -> np.ndarray:
    """[T]: for each term with these SEs and df in its S settings ([T, S], as a study ran), the
    smallest difference between two settings its report claims with ``power`` ("differs in size"
    or "flips sign", arranged as ``least_favourable``): ``smallest_differences`` on REPORT_DRAWS
    simulated reports, each setting's variance estimate drawn as a scaled chi-square on its df.
    NaN for a term without usable SEs and df. A term's value depends on its own SEs and df only."""
    se, df = (np.atleast_2d(np.asarray(v, dtype=float)) for v in (se, df))
    with np.errstate(invalid="ignore"):
        usable = (np.isfinite(se) & (se > 0) & (df > 0)).all(axis=-1) & (se.shape[-1] >= 2)
    se, df = np.where(usable[:, None], se, 1.0), np.where(usable[:, None], df, 1.0)
    z = np.stack([np.random.default_rng([PLAN_SEED, s]).standard_normal(REPORT_DRAWS) for s in range(se.shape[-1])], -1)
    scale = np.ones((REPORT_DRAWS, *se.shape))
    for (t, s), value in np.ndenumerate(df):  # a term's draws are its own: the same whatever the other terms
        if np.isfinite(value):
            scale[:, t, s] = np.random.default_rng([PLAN_SEED, s, 1]).chisquare(value, REPORT_DRAWS) / value
    term = SimulatedTerm(z[:, None, :] * se, se * np.sqrt(scale), np.broadcast_to(df, scale.shape), se)
    return np.where(usable, smallest_differences(adjustment, term, power), np.nan)


PLAN_COLUMNS = [
    "design", "cells", "statistic", "verdict", "size", "level", "seeds_per_cell", "runs", "power", "by_noise",
    "by_noise_runs", "by_noise_power",
]  # fmt: skip
BUDGET_COLUMNS = ["design", "cells", "statistic", "seeds", "runs", "transfers_margin", "detectable_difference"]


@dataclass(frozen=True)
class Question:
    """What a transfer plan is for, in the metric's stored units: a difference ``effect`` between two
    settings to claim ("differs"), equal effects to show within ``margin`` ("transfers"), each
    with ``power``, at the report's alpha and adjustment."""

    effect: float
    margin: float
    power: float = 0.8
    alpha: float = 0.05
    adjust: str = "holm"


def plan_transfer(factors: list[str], sigmas, question: Question) -> pd.DataFrame:
    """PLAN_COLUMNS, one row per design, statistic and verdict (``transfers`` for
    ``question.margin``, ``differs`` for ``question.effect``): the same seeds per cell in every
    setting (``seeds_per_cell``: what one spec runs) and seeds in proportion to each setting's
    noise (``by_noise``, one count per setting in order, with its runs and power); NaN seeds where
    no count up to MAX_SEEDS reaches the power."""
    sigmas = np.asarray(sigmas, dtype=float)
    rows = []
    for test in transfer_tests(factors, question.alpha, question.adjust):
        planner = Planner(test, sigmas)
        for verdict, size in ((TRANSFERS, question.margin), (DIFFERS, question.effect)):
            margin = question.margin if verdict == TRANSFERS else np.inf
            equal = seeds_for(planner, verdict, size, margin, question.power, EQUAL)
            same_noise = np.allclose(sigmas, sigmas[0])
            noise = equal if same_noise else seeds_for(planner, verdict, size, margin, question.power, BY_NOISE)
            rows.append({
                "design": test.design, "cells": test.cells, "statistic": test.statistic, "verdict": verdict,
                "size": size, "level": _level(test, verdict), **_counts("", equal, test.cells),
                **_counts("by_noise", noise, test.cells),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)


def _level(test: TransferTest, verdict: str) -> float:
    """The level the verdict is decided at: each one-sided test of the TOST (``transfers``), or
    Welch's test after the report's adjustment when this is the one term that differs."""
    if verdict == TRANSFERS or test.adjust == "none":
        return test.alpha
    return test.alpha / (test.families * test.terms)


def _counts(prefix: str, found: Found, cells: int) -> dict:
    if found.seeds is None:
        seeds, runs = (np.nan, np.nan)
    else:
        seeds, runs = found.seeds, int(found.seeds.sum()) * cells
    if prefix:
        text = "" if found.seeds is None else " / ".join(str(int(n)) for n in seeds)
        return {prefix: text, f"{prefix}_runs": runs, f"{prefix}_power": found.power}
    return {"seeds_per_cell": np.nan if found.seeds is None else int(seeds[0]), "runs": runs, "power": found.power}


def budget_table(factors: list[str], sigmas, seeds, power: float = 0.8, alpha: float = 0.05, adjust: str = "holm") -> pd.DataFrame:
    """BUDGET_COLUMNS, one row per design and statistic: what these seeds per cell (one per
    setting) buy at ``power`` (``detectable``): the smallest margin equal effects are shown within
    and the smallest difference between two settings the report claims."""
    sigmas, seeds = np.asarray(sigmas, dtype=float), np.asarray(seeds, dtype=int)
    rows = []
    for test in transfer_tests(factors, alpha, adjust):
        margin, difference = detectable(Planner(test, sigmas), seeds, power)
        rows.append({
            "design": test.design, "cells": test.cells, "statistic": test.statistic,
            "seeds": " / ".join(str(int(n)) for n in seeds), "runs": int(seeds.sum()) * test.cells,
            "transfers_margin": margin, "detectable_difference": difference,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=BUDGET_COLUMNS)
