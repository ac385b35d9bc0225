"""Transfer across settings: does each technique's effect hold in another model, prompt
distribution, reward environment or length regime?

One model over all settings: the cell index is (setting, cell), seeds are blocks *within*
their setting (a seed of one setting shares nothing with a seed of another), so the joint
information matrix is block-diagonal, G = diag(G_1, ..., G_S), with one residual variance
pooled over the settings (df = sum of the settings' residual df). Every statistic of a setting
(main effect, Shapley value, two-factor interaction) is a contrast c_s over that setting's
cells, placed in its block. For each term:

- per setting: c_s'mu with its exact t interval (``inference.estimate``);
- technique x setting interaction: H0 c_1'mu = ... = c_S'mu, the Wald F test with
  D = [c_s - c_S]_{s<S}: F = (D mu)' (D G^-1 D')^+ (D mu) / ((S - 1) sigma^2) on (S - 1, df);
  Holm (or the report's adjustment) over the family of all terms tested;
- heterogeneity summary: Cochran's Q = sum_s w_s (theta_s - theta_bar)^2, w_s = 1 / se_s^2
  (each setting's own residual variance where it has one), I^2 = max(0, (Q - (S-1)) / Q);
- verdict: ``not enough data`` (a setting lacks the estimate or there is no noise estimate),
  ``flips sign`` (interaction significant after adjustment and one setting's interval lies
  above zero while another's lies below), ``differs in size`` (significant otherwise),
  ``transfers`` (not significant, and no two settings' intervals exclude zero on opposite
  sides; if they do, the test cannot tell: ``not enough data``).

With one seed per cell there is no residual df: the noise comes from Lenth's pseudo standard
error pooled over every setting's factorial effects (assumes most effects are zero), as in the
single-setting report.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from . import shapley as sv
from .analysis import Analysis, CellValues, analyze
from .claims import CLAIM_COLUMNS, ClaimOptions
from .effects import effect_contrasts, lenth_pse
from .inference import LENTH, NONE, OLS, CellFit, Noise, _bartlett, estimate
from .multiplicity import adjust_within
from .table import ReportInputError

SETTING_COLUMN = "setting"
VERDICTS = ("transfers", "differs in size", "flips sign", "not enough data")
TRANSFER_COLUMNS = [
    "statistic", "term", "setting", "estimate", "ci_low", "ci_high", "p_interaction", "p_adjusted", "q", "i2", "verdict",
]  # fmt: skip
RANK_COLUMNS = ["setting_a", "setting_b", "kendall_tau", "p_value", "n_factors"]


@dataclass
class TransferAnalysis:
    """Per-setting analyses and the across-settings tables."""

    settings: list[str]
    analyses: dict[str, Analysis]
    transfer: pd.DataFrame  # TRANSFER_COLUMNS, one row per (statistic, term, setting)
    ranks: pd.DataFrame  # RANK_COLUMNS: Kendall's tau of Shapley values per pair of settings
    claims: pd.DataFrame  # CLAIM_COLUMNS, kind "transfer", family "transfer"
    noise_method: str
    df: float
    options: ClaimOptions

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


def _per_setting(results, factors, settings, **options) -> dict[str, Analysis]:
    analyses = {}
    for name in settings:
        rows = results[results[SETTING_COLUMN].astype(str) == name].drop(columns=[SETTING_COLUMN])
        try:
            analyses[name] = analyze(rows, factors, **options)
        except ReportInputError as error:
            raise ReportInputError(f"setting '{name}': {error}") from None
    return analyses


def _residuals(fit: CellFit) -> np.ndarray:
    partial = fit.y - fit.mu[fit.cell_index]
    if not fit.blocked:
        return partial
    counts = np.bincount(fit.seed_index, minlength=fit.n_seeds)
    return partial - (np.bincount(fit.seed_index, weights=partial, minlength=fit.n_seeds) / counts)[fit.seed_index]


def joint_fit(fits: list[CellFit]) -> CellFit:
    """One cell-means model over all settings: block-diagonal G^-1, seeds nested in settings,
    residual variance pooled (sum SSE / sum df)."""
    offsets = np.cumsum([0] + [len(f.mu) for f in fits])
    seed_offsets = np.cumsum([0] + [f.n_seeds for f in fits])
    m = int(offsets[-1])
    g_inv = np.zeros((m, m))
    for f, o in zip(fits, offsets):
        g_inv[o : o + len(f.mu), o : o + len(f.mu)] = f.g_inv
    df = float(sum(f.df for f in fits))
    sse = sum(f.sigma2 * f.df for f in fits if f.df > 0)
    cat = lambda name: np.concatenate([getattr(f, name) for f in fits])  # noqa: E731
    cell_index = np.concatenate([f.cell_index + o for f, o in zip(fits, offsets)])
    n = cat("n")
    residual = np.concatenate([_residuals(f) for f in fits])
    return CellFit(
        masks=np.arange(m), n=n, raw_mean=cat("raw_mean"), sd=cat("sd"), mu=cat("mu"), g_inv=g_inv,
        sigma2=sse / df if df > 0 else float("nan"), df=df, blocked=any(f.blocked for f in fits),
        n_seeds=int(seed_offsets[-1]), seed_sd=float("nan"), mean_inv_r=float("nan"),
        equal_var_p=_bartlett(residual, cell_index, n) if df > 0 else float("nan"),
        cell_var=cat("cell_var"), cell_index=cell_index,
        seed_index=np.concatenate([f.seed_index + o for f, o in zip(fits, seed_offsets)]), y=cat("y"),
    )  # fmt: skip


@dataclass
class _Terms:
    """Per statistic kind: term names and, per setting, contrast rows over that setting's cells."""

    statistic: str
    names: list[str]
    rows: list[np.ndarray]  # per setting [terms, m_s]; NaN rows where the setting cannot estimate


def _setting_terms(analysis: Analysis) -> tuple[CellValues, object]:
    values = CellValues(analysis.fit, analysis.design, Noise(float("nan"), 0.0, NONE), analysis.confidence)
    return values, effect_contrasts(analysis.design, analysis.factors, np.linalg.inv(analysis.fit.g_inv))


def _collect_terms(analyses: list[Analysis], factors: list[str]) -> list[_Terms]:
    """Main effects, Shapley values and two-factor interactions, matched across settings by name."""
    per = [_setting_terms(a) for a in analyses]
    main = _Terms("main", list(factors), [])
    shapley = _Terms("shapley", list(factors), [])
    names2 = list(dict.fromkeys(n for _, e in per for n, o in zip(e.names, e.orders) if o == 2))
    pairs = _Terms("interaction", names2, [])
    for values, effects in per:
        m = len(values.fit.mu)
        index = {name: j for j, name in enumerate(effects.names)}
        pick = lambda names: np.array(  # noqa: E731
            [effects.contrasts[index[n]] if n in index else np.full(m, np.nan) for n in names]
        ).reshape(len(names), m)
        main.rows.append(pick(factors))
        shapley.rows.append(values.contrasts(sv.shapley_values))
        pairs.rows.append(pick(names2))
    return [t for t in (main, shapley, pairs) if t.names]


def _joint_rows(rows_by_setting: list[np.ndarray], j: int, sizes: list[int]) -> np.ndarray:
    """[S, M]: term j of each setting placed in its own block of the joint cell vector."""
    offsets = np.cumsum([0] + sizes)
    out = np.zeros((len(sizes), offsets[-1]))
    for s, rows in enumerate(rows_by_setting):
        out[s, offsets[s] : offsets[s + 1]] = rows[j]
    return out


def _joint_noise(fit: CellFit, analyses: list[Analysis], terms: list[_Terms]) -> Noise:
    """Pooled residual variance; without residual df, Lenth's PSE over every setting's effects."""
    if fit.df > 0:
        return Noise(fit.sigma2, fit.df, OLS)
    points, units = [], []
    for analysis in analyses:
        if analysis.design.kind not in ("full", "fraction"):
            return Noise(float("nan"), 0.0, NONE)
        effects = effect_contrasts(analysis.design, analysis.factors, np.linalg.inv(analysis.fit.g_inv))
        points.append(effects.contrasts @ analysis.fit.mu)
        units.append(np.einsum("ij,jk,ik->i", effects.contrasts, analysis.fit.g_inv, effects.contrasts))
    points, units = np.concatenate(points), np.concatenate(units)
    pse = lenth_pse(points) if len(points) >= 3 else 0.0
    if pse <= 0:
        return Noise(float("nan"), 0.0, NONE)
    return Noise(pse**2 / float(np.mean(units)), len(points) / 3, LENTH)


def interaction_test(fit: CellFit, rows: np.ndarray, noise: Noise) -> tuple[float, float]:
    """(F, p) of H0: every row's c'mu is equal (rows [S, M]); NaN without noise or a NaN row."""
    if noise.method == NONE or np.isnan(rows).any() or len(rows) < 2:
        return float("nan"), float("nan")
    d = rows[:-1] - rows[-1]
    diff = d @ fit.mu
    cov = d @ fit.g_inv @ d.T
    rank = np.linalg.matrix_rank(cov)
    if rank == 0:
        return float("nan"), float("nan")
    f = float(diff @ np.linalg.pinv(cov) @ diff / (rank * noise.sigma2))
    return f, float(stats.f.sf(f, rank, noise.df))


def cochran_q(estimates: np.ndarray, se: np.ndarray) -> tuple[float, float]:
    """(Q, I^2) with inverse-variance weights; NaN if any SE is missing or zero.

    Example: estimates (1, 3), se (1, 1): pooled 2, Q = 1 + 1 = 2, I^2 = (2 - 1) / 2 = 0.5.
    """
    if np.isnan(estimates).any() or not (np.isfinite(se).all() and (se > 0).all()):
        return float("nan"), float("nan")
    w = 1.0 / se**2
    pooled = float(w @ estimates / w.sum())
    q = float(w @ (estimates - pooled) ** 2)
    i2 = max(0.0, (q - (len(estimates) - 1)) / q) if q > 0 else 0.0
    return q, i2


def verdict(low: np.ndarray, high: np.ndarray, p_adjusted: float, alpha: float) -> str:
    """The plain verdict of one term (see the module docstring)."""
    if np.isnan(p_adjusted) or np.isnan(low).any() or np.isnan(high).any():
        return "not enough data"
    opposite = bool((low > 0).any() and (high < 0).any())
    if p_adjusted < alpha:
        return "flips sign" if opposite else "differs in size"
    return "not enough data" if opposite else "transfers"


def _own_se(analyses: list[Analysis], rows_by_setting: list[np.ndarray], j: int, fallback: np.ndarray) -> np.ndarray:
    """Each setting's SE from its own residual variance where it has residual df."""
    se = fallback.copy()
    for s, analysis in enumerate(analyses):
        fit = analysis.fit
        if fit.df > 0 and not np.isnan(rows_by_setting[s][j]).any():
            c = rows_by_setting[s][j]
            se[s] = float(np.sqrt(fit.sigma2 * c @ fit.g_inv @ c))
    return se


def _term_rows(terms: list[_Terms], fit, noise, analyses, settings, confidence):
    """(transfer rows without p_adjusted/verdict, per-term largest-gap estimates)."""
    sizes = [len(a.fit.mu) for a in analyses]
    table, gaps = [], []
    for group in terms:
        for j, name in enumerate(group.names):
            rows = _joint_rows(group.rows, j, sizes)
            rows[np.isnan(rows).any(axis=1)] = np.nan
            est = estimate(fit, rows, noise, confidence)
            _, p = interaction_test(fit, rows, noise)
            q, i2 = cochran_q(est.estimate, _own_se(analyses, group.rows, j, est.se))
            for s, setting in enumerate(settings):
                table.append({
                    "statistic": group.statistic, "term": name, "setting": setting, "estimate": est.estimate[s],
                    "ci_low": est.ci_low[s], "ci_high": est.ci_high[s], "p_interaction": p, "q": q, "i2": i2,
                })  # fmt: skip
            gaps.append(_largest_gap(fit, rows, est.estimate, noise, confidence, settings))
    return pd.DataFrame(table), gaps


def _largest_gap(fit, rows, point, noise, confidence, settings) -> dict | None:
    """The highest minus the lowest setting's estimate, with its own (marginal) interval."""
    if np.isnan(point).any():
        return None
    hi, lo = int(np.argmax(point)), int(np.argmin(point))
    gap = estimate(fit, rows[hi] - rows[lo], noise, confidence)
    return {"pair": f"{settings[hi]} - {settings[lo]}", "estimate": gap.estimate[0],
            "ci_low": gap.ci_low[0], "ci_high": gap.ci_high[0]}  # fmt: skip


def _verdicts(table: pd.DataFrame, options: ClaimOptions) -> pd.DataFrame:
    per_term = table.drop_duplicates(["statistic", "term"])[["statistic", "term", "p_interaction"]].copy()
    per_term["p_adjusted"] = adjust_within(per_term["p_interaction"].to_numpy(float), options.adjust)
    table = table.merge(per_term[["statistic", "term", "p_adjusted"]], on=["statistic", "term"], how="left")
    words = {
        key: verdict(g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float), float(g["p_adjusted"].iloc[0]), options.alpha)
        for key, g in table.groupby(["statistic", "term"], sort=False)
    }
    table["verdict"] = [words[(r.statistic, r.term)] for r in table.itertuples(index=False)]
    return table[TRANSFER_COLUMNS]


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


def _transfer_claims(transfer: pd.DataFrame, gaps: list[dict | None], options: ClaimOptions) -> pd.DataFrame:
    """claims.csv rows of kind ``transfer``: terms whose interaction test passes after adjustment;
    the estimate is the largest gap between two settings (highest minus lowest)."""
    per_term = transfer.drop_duplicates(["statistic", "term"]).reset_index(drop=True)
    rows = []
    for row, gap in zip(per_term.itertuples(index=False), gaps):
        if gap is None or not row.p_adjusted < options.alpha:
            continue
        rows.append({
            "kind": "transfer", "term": f"{row.statistic} {row.term} ({gap['pair']})", "estimate": gap["estimate"],
            "ci_low": gap["ci_low"], "ci_high": gap["ci_high"], "p_value": row.p_interaction,
            "p_adjusted": row.p_adjusted, "family": "transfer",
        })  # fmt: skip
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS)


def analyze_transfer(
    results: pd.DataFrame,
    factors: list[str],
    metric: str = "avg@32",
    orderings="paper",
    confidence: float = 0.95,
    design: str | None = None,
    *,
    adjust: str = "holm",
    per_effect_tests: bool = False,
) -> TransferAnalysis:
    """Every setting's analysis and the transfer tables (module docstring) for a results table
    with a ``setting`` column naming at least two settings."""
    settings = split_settings(results)
    if len(settings) < 2:
        raise ReportInputError(
            f"column '{SETTING_COLUMN}' names one setting ({settings[0]}); a transfer study needs two or more"
        )
    analyses = _per_setting(
        results, list(factors), settings, metric=metric, orderings=orderings, confidence=confidence,
        design=design, adjust=adjust, per_effect_tests=per_effect_tests,
    )  # fmt: skip
    ordered = [analyses[s] for s in settings]
    options = ClaimOptions(adjust=adjust, alpha=1 - confidence, per_effect_tests=per_effect_tests)
    fit = joint_fit([a.fit for a in ordered])
    terms = _collect_terms(ordered, list(factors))
    noise = _joint_noise(fit, ordered, terms)
    table, gaps = _term_rows(terms, fit, noise, ordered, settings, confidence)
    transfer = _verdicts(table, options)
    return TransferAnalysis(
        settings=settings, analyses=analyses, transfer=transfer, ranks=rank_agreement(transfer, settings),
        claims=_transfer_claims(transfer, gaps, options), noise_method=noise.method, df=float(noise.df),
        options=options,
    )  # fmt: skip
