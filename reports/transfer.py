"""Transfer across settings: does each technique's effect hold in another model, prompt
distribution, reward environment or length regime?

Each setting is its own experiment: its own cells, its own seeds (a seed of one setting shares
nothing with a seed of another) and, above all, its own noise. A 7B model is less noisy than a
1.5B one and a hard prompt mix noisier than an easy one, so no variance is pooled over settings:
every term's value in a setting (main effect, Shapley value, two-factor interaction) is the
number that setting's own analysis reports, with its own SE and df (the cells' own variances,
or the setting's own Lenth PSE with one seed) -- the same interval as in its own tables. A
setting without a noise estimate gives "not enough data"; it never borrows another's variance.

Across settings the S estimates of a term are independent, each with an estimated variance on
its own df. The technique x setting test is Welch's (1951) heterogeneity test on them
(``heterogeneity.welch_heterogeneity``): the classic test of equal means under unequal
variances, with the df correction that small per-setting df need. Why not a random-effects
model: it answers another question (a population of settings these were drawn from) and needs
the between-setting variance, which three settings cannot estimate; the settings here are
chosen, fixed conditions, and the question is whether the effect differs among *them*.
Cochran's Q and I^2 (each setting's own SE) are shown as descriptions, with no test behind them.

Verdict per term (first that applies):

- ``not enough data``: a setting lacks the estimate or its noise estimate;
- ``flips sign``: on simultaneous intervals (every term in every setting at once: Bonferroni
  over the T x S intervals at the flips family's share of alpha) one setting's value is above
  zero and another's below; ``sim_ci_low``/``sim_ci_high`` are those intervals;
- ``differs in size``: Welch's test rejects after the report's adjustment (family ``transfer``);
- ``transfers``: the effects are equivalent within +-margin (``--equivalence-margin``, default
  2 pp): two one-sided tests at alpha for every pair of settings (TOST; intersection-union, so no
  adjustment over the pairs), i.e. ``excluded_beyond`` -- the far end of the widest pair's
  (1 - 2 alpha) interval (90% at alpha 5%), the largest difference the data cannot exclude --
  is below the margin. It is a verdict per term at level alpha, not a row of claims.csv (which
  lists effects and differences, under the report's guarantee);
- ``inconclusive``: no difference detected, and the data cannot exclude one as large as the
  margin: an absence of evidence, not evidence of transfer.

``detectable_difference`` says what the study as run could find: the smallest difference
between two settings that this report would claim ("differs in size" or "flips sign") with 80%
power (``transfer_power.DETECTABLE_POWER``), given each setting's SE and df of the term as
estimated here, the same tests and adjustment, and the hardest arrangement (the least precise
pair that far apart, the other settings between them): ``transfer_power.detectable_differences``,
the quantity `plan-seeds --seeds` reports before a study is run. A difference smaller than it
was likely to be missed, so an "inconclusive" there says little.

``gap`` is the largest between-setting contrast (highest minus lowest setting) with its
(1 - 2 alpha) interval (``gap_ci_low``/``gap_ci_high``), the interval the TOST reads.

One guarantee for the report (``multiplicity``): the settings' own families (attribution,
interactions, order, steps) are each pooled over the settings, and with ``transfer`` and
``flips`` they share alpha by Bonferroni over families, so every row of the report's claims.csv
is covered by one family-wise (``--adjust holm``) or false-discovery-rate (``bh``) statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from dapo_ablate.core.contracts import SETTING_COLUMN

from .analysis import Analysis, analyze, lenth_rule
from .claims import CLAIM_COLUMNS, ClaimOptions, Guarantee, adjust_tests, claims_table, effects_with_adjusted
from .heterogeneity import cochran_q, difference_interval, excluded_beyond, flip_p, verdicts_of, welch_heterogeneity
from .options import ReportOptions, report_options
from .table import ReportInputError
from .transfer_power import DETECTABLE_POWER, Adjustment, detectable_differences

VERDICTS = ("transfers", "differs in size", "flips sign", "inconclusive", "not enough data")
TRANSFER_COLUMNS = [
    "statistic", "term", "setting", "estimate", "ci_low", "ci_high", "p_interaction", "p_adjusted", "q", "i2", "verdict",
    "detectable_difference", "se", "df", "sim_ci_low", "sim_ci_high", "p_flip_adjusted", "gap", "gap_ci_low",
    "gap_ci_high", "excluded_beyond",
]  # fmt: skip
RANK_COLUMNS = ["setting_a", "setting_b", "kendall_tau", "p_value", "n_factors"]
TRANSFER_FAMILIES = ("transfer", "flips")


@dataclass
class TransferAnalysis:
    """Per-setting analyses (claims adjusted for the whole report) and the across-settings tables."""

    settings: list[str]
    analyses: dict[str, Analysis]
    transfer: pd.DataFrame  # TRANSFER_COLUMNS, one row per (statistic, term, setting)
    ranks: pd.DataFrame  # RANK_COLUMNS: Kendall's tau of Shapley values per pair of settings
    claims: pd.DataFrame  # CLAIM_COLUMNS, kind "transfer", families "transfer" and "flips"
    options: ClaimOptions
    guarantee: Guarantee  # one statement for every claim of the report
    margin: float  # equivalence margin, in the metric's units
    equivalence_alpha: float  # TOST level per side, per term (intersection-union over the pairs)
    simultaneous_alpha: float  # two-sided, per interval behind "flips sign"
    detectable_power: float = DETECTABLE_POWER  # the power of detectable_difference
    evidence: dict[str, list[str]] = field(default_factory=dict)  # the report's evidence sections (evidence.Evidence)

    @property
    def percent(self) -> bool:
        return all(a.percent for a in self.analyses.values())

    @property
    def metric(self) -> str:
        return next(iter(self.analyses.values())).metric


def split_settings(results: pd.DataFrame) -> list[str]:
    """The settings in order of first appearance; one sentence if the column has empty values."""
    column = results[SETTING_COLUMN]
    if column.isna().any() or (column.astype(str).str.strip() == "").any():
        row = int(np.flatnonzero(column.isna().to_numpy() | (column.astype(str).str.strip() == "").to_numpy())[0])
        raise ReportInputError(
            f"column '{SETTING_COLUMN}' is empty in data row {row + 1}; name the setting of every run"
        )
    return list(dict.fromkeys(column.astype(str)))


def _per_setting(results, factors, settings, options: ReportOptions) -> dict[str, Analysis]:
    analyses = {}
    for name in settings:
        rows = results[results[SETTING_COLUMN].astype(str) == name].drop(columns=[SETTING_COLUMN])
        try:
            analyses[name] = analyze(rows, factors, options=options)
        except ReportInputError as error:
            raise ReportInputError(f"setting '{name}': {error}") from None
    return analyses


@dataclass
class TermValues:
    """One term's value in every setting, as that setting's own tables report it."""

    statistic: str  # main | shapley | interaction
    term: str
    estimate: np.ndarray  # [S]
    se: np.ndarray
    df: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray

    @property
    def p_value(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return 2 * stats.t.sf(np.abs(self.estimate) / self.se, self.df)

    @property
    def complete(self) -> bool:
        return bool(np.isfinite(self.estimate).all() and np.isfinite(self.se).all() and (self.se > 0).all())


_SOURCES = {"main": ("effects", "effect"), "interaction": ("effects", "effect"), "shapley": ("shapley", "shapley")}


def term_values(analyses: list[Analysis]) -> list[TermValues]:
    """Main effects, Shapley values and two-factor interactions (or chains), matched across
    settings by name, read from each setting's intervals (so transfer.csv repeats its numbers)."""
    names = {
        "main": [n for a in analyses for n in a.all_effects.loc[a.all_effects["order"] == 1, "term"]],
        "shapley": [f for a in analyses for f in a.shapley.loc[a.shapley["shapley"].notna(), "factor"]],
        "interaction": [n for a in analyses for n in a.all_effects.loc[a.all_effects["order"] == 2, "term"]],
    }
    out = []
    for statistic, (table, column) in _SOURCES.items():
        looked_up = [
            a.intervals[(a.intervals["table"] == table) & (a.intervals["column"] == column)].set_index("row")
            for a in analyses
        ]
        for term in dict.fromkeys(names[statistic]):
            rows = [frame.reindex([term]).iloc[0] for frame in looked_up]
            get = lambda key: np.array([float(r[key]) for r in rows])  # noqa: E731
            out.append(TermValues(statistic, term, get("estimate"), get("se"), get("df"), get("ci_low"), get("ci_high")))
    return out


@dataclass
class _Across:
    """A term's across-settings statistics before the report-wide adjustment."""

    p_interaction: float
    q: float
    i2: float
    p_flip: float
    flip_pair: tuple[int, int] | None
    gap: tuple[float, float, float]  # (highest - lowest, low, high) at 1 - 2 alpha_eq
    gap_pair: tuple[int, int] | None
    excluded: float


def _across(values: TermValues, equivalence_alpha: float) -> _Across:
    nan3 = (float("nan"),) * 3
    if not values.complete:
        return _Across(float("nan"), float("nan"), float("nan"), float("nan"), None, nan3, None, float("nan"))
    theta, se, df = values.estimate, values.se, values.df
    p_interaction = welch_heterogeneity(theta, se, df)[3]
    q, i2 = cochran_q(theta, se)
    p_flip, up, down = flip_p(theta, values.p_value)
    hi, lo = int(np.argmax(theta)), int(np.argmin(theta))
    gap = difference_interval(theta, se, df, hi, lo, 1 - 2 * equivalence_alpha)
    return _Across(
        p_interaction, q, i2, p_flip, None if up is None else (up, down), gap, (hi, lo),
        excluded_beyond(theta, se, df, equivalence_alpha),
    )  # fmt: skip


def _label(values: TermValues, pair: tuple[int, int], settings: list[str]) -> str:
    return f"{values.statistic} {values.term} ({settings[pair[0]]} - {settings[pair[1]]})"


def _transfer_tests(values: list[TermValues], across: list[_Across], settings: list[str]) -> pd.DataFrame:
    """One ``transfer`` test (Welch) and one ``flips`` test per term, as claims rows (intervals of
    the flips rows are filled in once the simultaneous level is known)."""
    rows = []
    for v, a in zip(values, across):
        if not np.isfinite(a.p_interaction):
            continue
        rows.append({
            "kind": "transfer", "term": _label(v, a.gap_pair, settings), "estimate": a.gap[0], "ci_low": a.gap[1],
            "ci_high": a.gap[2], "p_value": a.p_interaction, "family": "transfer", "key": (v.statistic, v.term),
            "pair": a.gap_pair,
        })  # fmt: skip
        pair = a.flip_pair or a.gap_pair
        rows.append({
            "kind": "transfer", "term": _label(v, pair, settings), "estimate": v.estimate[pair[0]] - v.estimate[pair[1]],
            "ci_low": np.nan, "ci_high": np.nan, "p_value": a.p_flip, "family": "flips", "key": (v.statistic, v.term),
            "pair": pair,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=[*CLAIM_COLUMNS[:-2], "family", "key", "pair"])


def _simultaneous(values: TermValues, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Each setting's interval at 1 - alpha (two-sided), on its own SE and df."""
    with np.errstate(invalid="ignore"):
        half = stats.t.ppf(1 - alpha / 2, values.df) * values.se
    return values.estimate - half, values.estimate + half


def _per_setting_tests(analyses: list[Analysis], settings: list[str]) -> pd.DataFrame:
    parts = [a.tests[[*CLAIM_COLUMNS[:-2], "family"]].assign(setting=s) for s, a in zip(settings, analyses)]
    return pd.concat(parts, ignore_index=True)


def _sidak_m(analyses: list[Analysis], options: ClaimOptions) -> int | None:
    """Lenth's simultaneous rule over every setting's effects when every setting uses it."""
    if options.per_effect_tests or any(a.lenth is None for a in analyses):
        return None
    return int(sum(a.lenth["m"] for a in analyses))


def _readjusted(analysis: Analysis, tests: pd.DataFrame, options, guarantee: Guarantee, sidak_m, tested) -> Analysis:
    """The setting's analysis with its claims under the report-wide guarantee."""
    tests = tests[[*CLAIM_COLUMNS, "claimed"]].reset_index(drop=True)
    effects = effects_with_adjusted(
        analysis.effects.assign(order=analysis.effects["term"].map(analysis.all_effects.set_index("term")["order"])),
        tests, options, sidak_m, guarantee.n_families,
    )[analysis.effects.columns]  # fmt: skip
    return replace(
        analysis, tests=tests, claims=claims_table(tests), effects=effects, guarantee=guarantee,
        lenth=lenth_rule(analysis.lenth, options, guarantee, sidak_m, tested),
    )  # fmt: skip


def _verdict(values: TermValues, flip_adjusted: float, p_adjusted: float, excluded: float, margin: float, alpha: float) -> str:
    """The plain verdict of one term (module docstring)."""
    return str(verdicts_of(np.array([values.complete]), flip_adjusted, p_adjusted, excluded, margin, alpha)[0])


def rank_agreement(transfer: pd.DataFrame, settings: list[str]) -> pd.DataFrame:
    """Kendall's tau between the settings' Shapley values (tau-b; ties allowed), per pair."""
    shapley = transfer[transfer["statistic"] == "shapley"].pivot(index="term", columns="setting", values="estimate")
    rows = []
    for a, b in combinations(settings, 2):
        if shapley.empty or a not in shapley or b not in shapley or shapley[[a, b]].isna().any().any():
            rows.append({"setting_a": a, "setting_b": b, "kendall_tau": np.nan, "p_value": np.nan, "n_factors": len(shapley)})
            continue
        result = stats.kendalltau(shapley[a], shapley[b])
        rows.append({"setting_a": a, "setting_b": b, "kendall_tau": float(result.statistic),
                     "p_value": float(result.pvalue), "n_factors": len(shapley)})  # fmt: skip
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def _table(values, across, adjusted, settings, sim_alpha, margin, alpha) -> pd.DataFrame:
    """transfer.csv: one row per (term, setting)."""
    rows = []
    for v, a in zip(values, across):
        p_adjusted = adjusted.get(("transfer", v.statistic, v.term), np.nan)
        flip_adjusted = adjusted.get(("flips", v.statistic, v.term), np.nan)
        word = _verdict(v, flip_adjusted, p_adjusted, a.excluded, margin, alpha)
        sim_low, sim_high = _simultaneous(v, sim_alpha)
        for s, setting in enumerate(settings):
            rows.append({
                "statistic": v.statistic, "term": v.term, "setting": setting, "estimate": v.estimate[s],
                "ci_low": v.ci_low[s], "ci_high": v.ci_high[s], "p_interaction": a.p_interaction,
                "p_adjusted": p_adjusted, "q": a.q, "i2": a.i2, "verdict": word, "se": v.se[s], "df": v.df[s],
                "sim_ci_low": sim_low[s], "sim_ci_high": sim_high[s], "p_flip_adjusted": flip_adjusted,
                "gap": a.gap[0], "gap_ci_low": a.gap[1], "gap_ci_high": a.gap[2], "excluded_beyond": a.excluded,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=TRANSFER_COLUMNS)


def analyze_transfer(
    results: pd.DataFrame, factors: list[str], *, options: ReportOptions | None = None, **changes
) -> TransferAnalysis:
    """Every setting's analysis and the transfer tables (module docstring) for a results table
    with a ``setting`` column naming at least two settings. ``options``: as for ``analyze``, and
    its equivalence_margin (``changes``: any field by keyword)."""
    options = report_options(options, changes)
    settings = split_settings(results)
    if len(settings) < 2:
        raise ReportInputError(
            f"column '{SETTING_COLUMN}' names one setting ({settings[0]}); a transfer study needs two or more"
        )
    analyses = _per_setting(results, list(factors), settings, options)
    ordered = [analyses[s] for s in settings]
    margin = options.equivalence_margin
    _check_margin(margin, ordered, options.metric)
    claims = options.claims
    values = term_values(ordered)
    equivalence_alpha = claims.alpha  # per side, per term (module docstring)
    across = [_across(v, equivalence_alpha) for v in values]
    tests, guarantee, sim_alpha, sidak_m = _report_tests(ordered, values, across, settings, claims)
    adjusted = {
        (row.family, *row.key): row.p_adjusted
        for row in tests[tests["family"].isin(TRANSFER_FAMILIES)].itertuples(index=False)
    }
    tested = int((tests["family"] == "interactions").sum())
    readjusted = {
        s: _readjusted(a, tests[tests["setting"] == s], claims, guarantee, sidak_m, tested)
        for s, a in zip(settings, ordered)
    }
    transfer = _table(values, across, adjusted, settings, sim_alpha, margin, claims.alpha)
    transfer["detectable_difference"] = _detectable(values, transfer, tests, guarantee, claims)
    return TransferAnalysis(
        settings=settings, analyses=readjusted, transfer=transfer, ranks=rank_agreement(transfer, settings),
        claims=_transfer_claims(tests), options=claims, guarantee=guarantee, margin=margin,
        equivalence_alpha=equivalence_alpha, simultaneous_alpha=sim_alpha,
    )  # fmt: skip


def _detectable(values: list[TermValues], transfer: pd.DataFrame, tests, guarantee: Guarantee, options) -> np.ndarray:
    """transfer.csv's detectable_difference (module docstring), per row: each term's from its
    settings' own SEs and df, at the report's adjustment of its transfer tests."""
    if not values:
        return np.zeros(0)
    adjustment = Adjustment(int((tests["family"] == "transfer").sum()), guarantee.n_families, options.alpha, options.adjust)
    found = detectable_differences(np.stack([v.se for v in values]), np.stack([v.df for v in values]), adjustment)
    by_term = {(v.statistic, v.term): d for v, d in zip(values, found)}
    return np.array([by_term[key] for key in zip(transfer["statistic"], transfer["term"])], dtype=float)


def _check_margin(margin: float, analyses: list[Analysis], metric: str) -> None:
    """One sentence for a margin that cannot be meant: not positive, or >= 1 for an accuracy."""
    if not margin > 0:
        raise ReportInputError(f"--equivalence-margin must be positive, got {margin}")
    if margin >= 1 and all(a.percent for a in analyses):
        raise ReportInputError(
            f"--equivalence-margin {margin} is in the metric's units (a fraction for {metric}): "
            "give 0.02 for 2 percentage points"
        )


def _report_tests(analyses, values, across, settings, options) -> tuple[pd.DataFrame, Guarantee, float, int | None]:
    """Every test of the report (each setting's, ``transfer``, ``flips``) adjusted under one
    guarantee; the flips rows get the interval their simultaneous intervals imply. Returns
    (tests, guarantee, the simultaneous intervals' alpha, Lenth's simultaneous m or None)."""
    tests = pd.concat([_per_setting_tests(analyses, settings), _transfer_tests(values, across, settings)], ignore_index=True)
    n_flips = int((tests["family"] == "flips").sum()) * len(settings)  # simultaneous intervals behind the flips
    sidak_m = _sidak_m(analyses, options)
    pooled = ", ".join(f for f in dict.fromkeys(tests["family"]) if f not in TRANSFER_FAMILIES)
    scope = f"{pooled} each pooled over the {len(settings)} settings"
    tests, guarantee = adjust_tests(tests, options, sidak_m, {"flips": n_flips}, scope)
    sim_alpha = options.alpha / (guarantee.n_families * max(n_flips, 1) if options.adjust != "none" else 1)
    by_key = {(v.statistic, v.term): v for v in values}
    for i in np.flatnonzero(tests["family"] == "flips"):  # the pair's difference on simultaneous intervals
        low, high = _simultaneous(by_key[tests.at[i, "key"]], sim_alpha)
        up, down = tests.at[i, "pair"]
        tests.loc[i, ["ci_low", "ci_high"]] = low[up] - high[down], high[up] - low[down]
    return tests, guarantee, sim_alpha, sidak_m


def _transfer_claims(tests: pd.DataFrame) -> pd.DataFrame:
    """claims.csv rows of kind ``transfer``: per term, the flip when it is claimed, else the
    difference (Welch) when it is; the estimate is the pair's difference."""
    claimed = tests[tests["family"].isin(TRANSFER_FAMILIES) & tests["claimed"]]
    claimed = claimed.sort_values("family", key=lambda f: f != "flips", kind="stable").drop_duplicates("key")
    order = {key: i for i, key in enumerate(dict.fromkeys(tests["key"].dropna()))}
    claimed = claimed.assign(_order=claimed["key"].map(order)).sort_values("_order", kind="stable")
    return claimed[CLAIM_COLUMNS].reset_index(drop=True)
