"""Bounded work for every results table: more than MAX_FACTORS factors is one sentence
before any work starts, and 12 factors (4,096 cells) analyse in seconds because the analysis uses
the structure of the 2^k design (a diagonal information matrix when seeds are balanced, the Walsh
transform of the observed cells for the alias structure) instead of dense cubic algebra over the
lattice. Each fast path is checked here against the slow, obvious computation it replaces.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_hostile_reports_factors_e2e.py."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports import ReportInputError, analyze, load_results_csv, validate_results
from dapo_ablate.reports import analysis as analysis_module
from dapo_ablate.reports.design import all_terms, contrast_column, describe_design
from dapo_ablate.reports.effects import effect_contrasts
from dapo_ablate.reports import inference
from dapo_ablate.reports.inference import LENTH, WELCH, Noise, estimate
from dapo_ablate.reports.power import half_fraction
from dapo_ablate.reports.simulate import simulate_results


def _factor_table(k: int, rows: int, rng: int = 0) -> pd.DataFrame:
    generator = np.random.default_rng(rng)
    table = pd.DataFrame(generator.integers(0, 2, size=(rows, k)), columns=[f"f{i}" for i in range(k)])
    return table.assign(seed=np.arange(rows), **{"avg@32": generator.uniform(0, 1, rows)})


def _gram_alias_structure(masks: np.ndarray, k: int):
    """The reference: the Gram matrix of all 2^k contrast columns over the cells (the analysis'
    first implementation): regular iff every entry is 0 or +-m; groups are the terms whose columns are equal
    up to sign, in term order."""
    terms = [(), *all_terms(k)]
    columns = np.stack([contrast_column(masks, term) for term in terms], axis=1)
    gram, m = columns.T @ columns, len(masks)
    if not np.all(np.isin(np.abs(gram), (0, m))):
        return None
    groups, signs, seen = [], [], set()
    for a in range(len(terms)):
        if a in seen:
            continue
        members = [b for b in range(a, len(terms)) if abs(gram[a, b]) == m]
        seen.update(members)
        groups.append(tuple(terms[b] for b in members))
        signs.append(tuple(int(np.sign(gram[a, b])) for b in members))
    defining = [(t, s) for t, s in zip(groups[0], signs[0]) if t]
    return groups[1:], signs[1:], [t for t, _ in defining], [s for _, s in defining]


def _quarter_fraction() -> np.ndarray:
    """2^(6-2): E = ABC, F = BCD (resolution IV), with the signs of I = -ABCE."""
    cells = []
    for a, b, c, d in product((0, 1), repeat=4):
        e, f = 1 - (a ^ b ^ c), b ^ c ^ d
        cells.append(a | b << 1 | c << 2 | d << 3 | e << 4 | f << 5)
    return np.array(sorted(cells))


def _fit(k: int, seeds: int, drop: int = 0):
    results = simulate_results([f"f{i}" for i in range(k)], 0.3, {("f0",): 0.05}, seeds, 0.01, 0.005, rng=1)
    if drop:
        results = results.drop(index=np.arange(drop) * 7 + 3).reset_index(drop=True)
    return analysis_module.fit_table(results, [f"f{i}" for i in range(k)], "avg@32")


def _dense_blocked_g(fit) -> np.ndarray:
    """G of the within-seed form from its definition, with dense matrices (module docstring of
    ``inference``): diag(n) - N diag(1/r) N' + q q' / sum(1/r)."""
    m, s = len(fit.masks), fit.n_seeds
    counts = np.zeros((m, s))
    np.add.at(counts, (fit.cell_index, fit.seed_index), 1.0)
    r = counts.sum(axis=0)
    q = counts @ (1 / r)
    return np.diag(counts.sum(axis=1)) - counts @ np.diag(1 / r) @ counts.T + np.outer(q, q) / np.sum(1 / r)


def test_more_than_twelve_factors_is_refused_before_any_work(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the analysis started")

    monkeypatch.setattr(analysis_module, "fit_table", no_work)
    table = _factor_table(13, 64)
    with pytest.raises(ReportInputError, match=r"13 factors .* at most 12 .*--factors"):
        analyze(table, [f"f{i}" for i in range(13)])
    with pytest.raises(ReportInputError, match=r"13 factors"):
        validate_results(table, [f"f{i}" for i in range(13)], "avg@32")


def test_twenty_inferred_factor_columns_are_one_sentence(tmp_path):
    path = tmp_path / "results.csv"
    _factor_table(20, 64).to_csv(path, index=False)
    with pytest.raises(ReportInputError) as raised:
        load_results_csv(path)
    message = str(raised.value)
    assert "20 columns look like factors (f0, f1, f2, f3, f4, f5, f6, f7 and 12 more)" in message, message
    assert "at most 12" in message and "--factors" in message


@pytest.mark.parametrize(
    ("cells", "k"),
    [
        (half_fraction(3), 3), (half_fraction(5), 5), (np.setdiff1d(np.arange(32), half_fraction(5)), 5),
        (_quarter_fraction(), 6), (np.array([0, 1, 2, 4]), 3), (np.array([0, 3, 5, 6, 7]), 3), (np.array([0, 3]), 2),
    ],
)  # fmt: skip
def test_walsh_alias_structure_matches_the_gram_matrix(cells, k):
    from dapo_ablate.reports.design import _alias_structure

    expected = _gram_alias_structure(np.asarray(cells), k)
    got = _alias_structure(np.asarray(cells), k)
    if expected is None:
        assert got is None
        return
    groups, signs, defining, defining_signs = got
    assert [tuple(g) for g in groups] == expected[0]
    assert [tuple(s) for s in signs] == expected[1]
    assert list(defining) == expected[2] and list(defining_signs) == expected[3]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_full_design_effect_rows_match_the_term_columns(k):
    masks = np.arange(2**k)
    design = describe_design(masks, k)
    contrasts = effect_contrasts(design, [f"f{i}" for i in range(k)], np.eye(2**k))
    expected = np.array([contrast_column(masks, t) / (2**k / 2) for t in all_terms(k)])
    np.testing.assert_array_equal(contrasts.contrasts, expected)
    assert contrasts.terms == all_terms(k)


@pytest.mark.parametrize(("seeds", "drop", "diagonal"), [(1, 0, True), (3, 0, True), (3, 2, False)])
def test_the_information_matrix_is_kept_diagonal_only_when_it_is(seeds, drop, diagonal):
    fit = _fit(4, seeds, drop)
    assert (fit.g_inv_diagonal is not None) == diagonal
    reference = np.diag(fit.n) if not fit.blocked else _dense_blocked_g(fit)
    np.testing.assert_allclose(fit.information(), reference, atol=1e-12)
    np.testing.assert_allclose(fit.g_inv, np.linalg.inv(reference), atol=1e-12)


@pytest.mark.parametrize(("seeds", "drop", "method"), [(1, 0, LENTH), (3, 0, WELCH), (3, 2, WELCH)])
def test_estimates_with_the_diagonal_match_the_dense_algebra(seeds, drop, method):
    """Every estimate through the diagonal fast path equals the same estimate with G^-1 dense
    (the fit rebuilt without ``g_inv_diagonal``), and Lenth's c'G^-1c equals the einsum."""
    fit = _fit(5, seeds, drop)
    design = describe_design(fit.masks, 5)
    contrasts = effect_contrasts(design, [f"f{i}" for i in range(5)], fit.information()).contrasts
    noise = Noise(0.0004, 10.0, LENTH) if method == LENTH else Noise(fit.sigma2, fit.df, WELCH)
    dense = replace(fit, g_inv_diagonal=None)
    for rows in (contrasts, np.eye(len(fit.masks))):
        fast, slow = estimate(fit, rows, noise, 0.95), estimate(dense, rows, noise, 0.95)
        for field in ("estimate", "se", "df", "ci_low", "ci_high", "p_value"):
            np.testing.assert_allclose(getattr(fast, field), getattr(slow, field), rtol=1e-10, atol=1e-14)
    unit = np.einsum("ij,jk,ik->i", contrasts, fit.g_inv, contrasts)
    np.testing.assert_allclose(inference.quadratic_forms(fit, contrasts), unit, rtol=1e-12)


def test_a_twelve_factor_half_fraction_is_read_as_resolution_xii():
    design = describe_design(half_fraction(12), 12)
    assert design.kind == "fraction" and design.resolution == 12 and len(design.alias_groups) == 2**11 - 1


@pytest.mark.parametrize("k", [1, 2, 5])
def test_statistic_matrices_match_the_statistics_applied_to_the_identity(k):
    from dapo_ablate.reports import shapley as sv
    from dapo_ablate.reports.orderings import position_means

    eye = np.eye(2**k)
    np.testing.assert_allclose(sv.shapley_matrix(k), sv.shapley_values(eye).T, atol=1e-15)
    np.testing.assert_allclose(sv.banzhaf_matrix(k), sv.banzhaf_values(eye).T, atol=1e-15)
    for factor in range(k):
        np.testing.assert_allclose(sv.position_matrix(k, factor), position_means(eye, factor).T, atol=1e-15)
    masks = np.arange(2**k)
    assert list(sv.popcount(masks)) == [bin(m).count("1") for m in masks]


def test_contrast_columns_match_one_column_at_a_time():
    from dapo_ablate.reports.design import contrast_columns

    masks, terms = _quarter_fraction(), all_terms(6)
    expected = np.array([contrast_column(masks, t) for t in terms])
    np.testing.assert_array_equal(contrast_columns(masks, terms), expected)


def test_cell_weights_with_sparse_seed_counts_match_the_dense_ones(monkeypatch):
    """Many cells x seeds keep N sparse (DENSE_COUNTS); both paths give the same weights."""
    fit = _fit(4, 3, drop=2)
    contrasts = effect_contrasts(describe_design(fit.masks, 4), [f"f{i}" for i in range(4)], fit.information()).contrasts
    dense = inference.cell_weights(fit, contrasts)
    monkeypatch.setattr(inference, "DENSE_COUNTS", 0)
    np.testing.assert_allclose(inference.cell_weights(fit, contrasts), dense, rtol=1e-12, atol=1e-15)
