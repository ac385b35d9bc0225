"""Design expansion: cell counts, fractions and their aliases, orderings, run ids, the plan printout."""

import hashlib
import itertools
import json
import math

import numpy as np
import pytest

from dapo_ablate.ablation.experiment.design import (
    REFERENCE_SECONDS,
    STANDARD_FRACTIONS,
    Cell,
    DesignError,
    choose_fraction,
    estimate_run_seconds,
    expand,
)
from dapo_ablate.ablation.experiment import identity
from dapo_ablate.ablation.experiment.identity import IDENTITY_VERSION, RunSpec, make_run_id
from dapo_ablate.ablation.experiment.plan import format_plan
from dapo_ablate.ablation.experiment.spec import build_spec
from dapo_ablate.core.config import TECHNIQUES, TrainerConfig

from tiny_configs import QUICKSTART_SHAPE


# The CPU quickstart's scale: 20 steps of 64 prompts x 8 samples, a 32-token ceiling, eval_k = 8.
TINY = QUICKSTART_SHAPE
FIVE = ["OF", "CH", "SP", "TL", "DS"]


def plan_of(**fields):
    return expand(build_spec({"name": "tiny", "trainer": TINY, **fields}))


def on_sets(plan):
    return {frozenset(f.short for f in cell.on(plan.factors)) for cell in plan.cells}


def pm(cell):
    """-1/+1 coding of a cell's levels."""
    return np.array(cell.levels) * 2 - 1


# ----------------------------------------------------------------------------------- counts
def test_full_design_of_five_has_32_cells_covering_all_120_orderings():
    plan = plan_of()
    assert len(plan.cells) == 32 and len({c.key for c in plan.cells}) == 32
    assert len(plan.runs) == 32
    assert plan.orderings_count == 120 and len(set(plan.orderings)) == 120
    assert plan.orderings[0] == tuple(TECHNIQUES)  # the paper's first
    assert plan.cells[0].key == "00000" and plan.cells[-1].key == "11111"
    assert any("exact Shapley" in s for s in plan.supports)


def test_cumulative_paper_ordering_needs_six_cells():
    plan = plan_of(design="cumulative")
    labels = [plan.label(c) for c in plan.cells]
    assert labels == ["GRPO", "OF", "OF+CH", "OF+CH+SP", "OF+CH+SP+TL", "OF+CH+SP+TL+DS"]  # the paper's table rows
    assert plan.orderings == [tuple(TECHNIQUES)] and plan.orderings_count == 1
    assert plan.orderings_through(plan.cells[-1]) == ["paper"]
    assert any("one cumulative path" in s for s in plan.supports)
    assert any("no main effects" in s for s in plan.supports)


def test_cumulative_all_orderings_need_the_32_cells():
    plan = plan_of(design="cumulative", orderings="all")
    assert len(plan.cells) == 32 and plan.orderings_count == 120
    # the union of the prefixes of all 120 permutations is exactly the full factorial
    prefixes = {frozenset(p[:d]) for p in itertools.permutations(range(5)) for d in range(6)}
    assert len(prefixes) == 32


def test_cumulative_explicit_orderings_share_their_prefixes():
    plan = plan_of(design="cumulative", orderings=[FIVE, ["DS", "OF", "CH", "SP", "TL"]])
    # paper: 6 cells; DS first adds DS, DS+OF, DS+OF+CH, DS+OF+CH+SP (baseline and full shared)
    assert len(plan.cells) == 10
    assert plan.requested_orderings == [tuple(TECHNIQUES), ("dynamic_sampling", *TECHNIQUES[:4])]
    full = next(c for c in plan.cells if c.key == "11111")
    assert {"paper", "DS>OF>CH>SP>TL"} <= set(plan.orderings_through(full))
    assert plan.orderings_through(Cell((0, 0, 0, 0, 1))) == ["DS>OF>CH>SP>TL"]


def test_one_at_a_time_of_five_has_12_cells():
    plan = plan_of(design="one_at_a_time")
    everything = frozenset(FIVE)
    expected = {frozenset(), everything}
    expected |= {frozenset({f}) for f in FIVE}
    expected |= {everything - {f} for f in FIVE}
    assert len(plan.cells) == 12 and on_sets(plan) == expected
    assert plan.orderings_count == 0
    assert any("add-one" in s for s in plan.supports) and any("leave-one-out" in s for s in plan.supports)


# -------------------------------------------------------------------------------- fractions
def test_default_fraction_of_five_is_the_16_run_resolution_V_half():
    plan = plan_of(design="fractional")
    assert len(plan.cells) == 16 and plan.resolution == 5 and plan.generators == ["E=ABCD"]
    for cell in plan.cells:
        a, b, c, d, e = pm(cell)
        assert e == a * b * c * d
    # resolution V: main effects and two-factor interaction columns are mutually orthogonal
    x = np.array([pm(c) for c in plan.cells])
    columns = [x[:, i] for i in range(5)] + [x[:, i] * x[:, j] for i, j in itertools.combinations(range(5), 2)]
    gram = np.array(columns) @ np.array(columns).T
    assert np.array_equal(gram, 16 * np.eye(15))
    assert plan.aliases[0] == "I = OF:CH:SP:TL:DS"
    assert "OF = CH:SP:TL:DS" in plan.aliases and "OF:CH = SP:TL:DS" in plan.aliases
    assert len(plan.aliases) == 1 + 5 + 10
    assert "main effects (aliased with four-factor interactions)" in plan.supports
    assert "two-factor interactions (aliased with three-factor interactions)" in plan.supports
    assert any("Shapley values only from a fitted model" in s and "not exact" in s for s in plan.supports)
    # an odd number of factors on: the all-off baseline is not in this half
    assert plan.orderings_count == 0 and any("baseline not run" in s for s in plan.supports)


def test_fraction_of_four_is_8_runs_resolution_IV():
    plan = plan_of(design="fractional", factors=list(TECHNIQUES[:4]))
    assert len(plan.cells) == 8 and plan.resolution == 4 and plan.generators == ["D=ABC"]
    for cell in plan.cells:
        a, b, c, d = pm(cell)
        assert d == a * b * c
    assert "OF:CH = SP:TL" in plan.aliases  # resolution IV: two-factor interactions aliased in pairs


def test_user_generators_override_the_table():
    plan = plan_of(design="fractional", generators=["E=-ABCD"])  # the other half: the baseline is in it
    assert len(plan.cells) == 16 and plan.cells[0].key == "00000"
    assert all(pm(c)[4] == -np.prod(pm(c)[:4]) for c in plan.cells)
    assert plan.aliases[0] == "I = -OF:CH:SP:TL:DS"


@pytest.mark.parametrize(
    "k, resolutions",
    [(3, [3]), (4, [4]), (5, [5, 3]), (6, [6, 4, 3]), (7, [7, 4, 4, 3])],
)
def test_standard_fractions_have_their_textbook_resolutions(k, resolutions):
    fractions = [choose_fraction(k, generators=g) for g in STANDARD_FRACTIONS[k]]
    assert [f.resolution for f in fractions] == resolutions
    for p, fraction in enumerate(fractions, start=1):
        cells = [Cell(levels) for levels in fraction.level_rows()]
        assert len(cells) == 2 ** (k - p) == len(set(cells))
        x = np.array([pm(c) for c in cells])
        assert np.array_equal(x.T @ x, len(cells) * np.eye(k))  # main effects orthogonal (resolution >= III)


@pytest.mark.parametrize(
    "k, resolution, runs, generators",
    [
        (5, None, 16, ["E=ABCD"]),
        (5, 3, 8, ["D=AB", "E=AC"]),
        (5, 5, 16, ["E=ABCD"]),
        (6, 4, 16, ["E=ABC", "F=BCD"]),
        (7, 4, 16, ["E=ABC", "F=BCD", "G=ACD"]),
        (7, 5, 64, ["G=ABCDEF"]),
        (3, 3, 4, ["C=AB"]),
    ],
)
def test_the_fewest_runs_reaching_the_resolution_are_chosen(k, resolution, runs, generators):
    fraction = choose_fraction(k, resolution)
    assert (fraction.runs, fraction.generator_text()) == (runs, generators)


def test_impossible_fractions_say_why():
    with pytest.raises(DesignError, match="at least 3 factors"):
        choose_fraction(2)
    with pytest.raises(DesignError, match=r"resolution V .*the best is IV"):
        choose_fraction(4, 5)
    with pytest.raises(DesignError, match="no built-in fraction for 8 factors; give generators"):
        choose_fraction(8)
    # user generators: any k (Montgomery's 2^(8-2)_V: I = ABCDG = ABEFH = CDEFGH)
    assert choose_fraction(8, generators=["G=ABCD", "H=ABEF"]).resolution == 5


# -------------------------------------------------------------------------------- orderings
def test_orderings_through_a_cell_of_the_full_design():
    plan = plan_of()
    by_key = {c.key: c for c in plan.cells}
    assert len(plan.orderings_through(by_key["00000"])) == 120
    of_first = plan.orderings_through(by_key["10000"])
    assert len(of_first) == 24 and "paper" in of_first  # 4! orderings start with OF
    assert all(name == "paper" or name.startswith("OF>") for name in of_first)
    # a two-factor cell lies on 2! x 3! orderings
    assert len(plan.orderings_through(by_key["01001"])) == 12
    assert "CH>DS>OF>SP>TL" in plan.orderings_through(by_key["01001"])


def test_paper_ordering_is_restricted_to_the_factors_with_knobs_last():
    plan = plan_of(design="cumulative", factors=[{"eps_high": [0.2, 0.28]}, "dynamic_sampling", "clip_higher"])
    assert plan.paper_ordering == ("clip_higher", "dynamic_sampling", "eps_high")
    assert [plan.label(c) for c in plan.cells] == ["baseline", "CH", "DS+CH", "eps_high=0.28+DS+CH"]


# -------------------------------------------------------------------------------------- runs
def test_run_names_labels_and_ledger_specs():
    plan = plan_of(seeds=2)
    names = {run.name for run in plan.runs}
    assert {"GRPO s0", "GRPO s1", "OF+CH+SP+TL+DS s0", "CH+TL s1"} <= names
    run = next(r for r in plan.runs if r.name == "OF+SP s1")
    spec = run.to_run_spec()
    assert isinstance(spec, RunSpec)
    assert (spec.run_id, spec.cell_key, spec.seed) == (run.run_id, "10100", 1)
    assert spec.factors == dict(zip(TECHNIQUES, [1, 0, 1, 0, 0]))
    assert spec.config == run.config.to_dict() and spec.config["schedule"]["seed"] == 1
    assert plan.run_specs()[0] == plan.runs[0].to_run_spec()


def test_run_id_is_the_documented_hash():
    from dapo_ablate.core.config import TrainerConfig

    run = plan_of().runs[5]
    defaults = TrainerConfig().to_dict()
    # the non-default values, section by section (every TrainerConfig section is one level deep)
    delta = {
        section: {key: value for key, value in values.items() if defaults[section].get(key) != value}
        if isinstance(values, dict) else values
        for section, values in run.config.to_dict().items()
        if values != defaults[section]
    }
    payload = {"factors": run.factors, "config": delta, "seed": run.seed, "version": IDENTITY_VERSION}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert run.run_id == hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_run_ids_are_stable_and_change_with_seed_config_and_levels():
    first, again = plan_of(seeds=2), plan_of(seeds=2)
    ids = [r.run_id for r in first.runs]
    assert ids == [r.run_id for r in again.runs]
    assert len(set(ids)) == 64  # every cell x seed differs
    other_lr = expand(build_spec({"name": "tiny", "trainer": {**TINY, "optim": {"lr": 2e-6}}, "seeds": 2}))
    assert not set(ids) & {r.run_id for r in other_lr.runs}
    run = first.runs[0]
    assert make_run_id(run.factors, run.config, run.seed) == run.run_id
    assert make_run_id(run.factors, run.config, run.seed + 1) != run.run_id
    assert make_run_id({**run.factors, "overlong_filter": 1}, run.config, run.seed) != run.run_id


def test_adding_a_seed_only_adds_runs():
    one, two = plan_of(seeds=1), plan_of(seeds=2)
    old = {r.run_id for r in one.runs}
    new = [r for r in two.runs if r.run_id not in old]
    assert old <= {r.run_id for r in two.runs}
    assert len(new) == 32 and all(r.seed == 1 for r in new)


def test_a_knob_factor_applies_its_value_at_each_level():
    plan = plan_of(factors=["clip_higher", {"eps_high": [0.2, 0.28]}], seeds=[7])
    assert [f.short for f in plan.factors] == ["CH", "eps_high"]
    for run in plan.runs:
        ch, high = run.cell.levels
        assert run.config.techniques.clip_higher is bool(ch)
        assert run.config.algorithm.eps_high == (0.28 if high else 0.2)
        assert run.config.schedule.seed == 7
    labels = {plan.label(c) for c in plan.cells}
    assert labels == {"baseline", "CH", "eps_high=0.28", "CH+eps_high=0.28"}  # OF, SP, TL stay on: not GRPO


def test_techniques_outside_the_factors_keep_the_base_value():
    trainer = {**TINY, "techniques": {t: False for t in TECHNIQUES}}
    plan = expand(build_spec({"name": "t", "trainer": trainer, "factors": ["dynamic_sampling"]}))
    assert [plan.label(c) for c in plan.cells] == ["GRPO", "DS"]
    assert not any(plan.runs[1].config.techniques.model_dump()[t] for t in TECHNIQUES[:4])


# ----------------------------------------------------------------------------------- compute
def test_estimate_scales_from_the_quickstart_reference():
    reference = TrainerConfig(**TINY)
    assert estimate_run_seconds(reference) == pytest.approx(REFERENCE_SECONDS)
    double = TrainerConfig(**{**TINY, "schedule": {"total_steps": 40}})
    assert estimate_run_seconds(double) == pytest.approx(2 * REFERENCE_SECONDS)
    large = TrainerConfig(**{**TINY, "model": {"builtin_size": "large"}})  # the 1.30M-parameter policy: 3x the CPU
    assert estimate_run_seconds(large) == pytest.approx(3 * REFERENCE_SECONDS)

    plan = plan_of(design="cumulative", executor={"address": "ray://head:10001", "max_concurrent": 3})
    est = plan.estimate(seconds_per_run=60)
    assert (est.runs, est.cells, est.parallelism, est.measured) == (6, 6, 3, True)
    assert est.run_seconds == 360 and est.wall_s == 120  # 6 runs x 60 s / 3 at a time
    # tokens: 20 steps x 8 samples x 32 tokens x prompts per round (64, or 3 x 64 with dynamic sampling)
    assert est.tokens_upper == 20 * 8 * 32 * (5 * 64 + 3 * 64)
    rough = plan.estimate()
    assert not rough.measured and rough.seconds_per_run == pytest.approx(REFERENCE_SECONDS)


def test_local_parallelism_is_bounded_by_the_cpus(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert plan_of(executor={"cpus_per_run": 2}).estimate().parallelism == 4
    assert plan_of(executor={"max_concurrent": 16}).estimate().parallelism == 8
    assert plan_of(executor={"max_concurrent": 3}).estimate().parallelism == 3


# ---------------------------------------------------------------------------------- printout
def test_printout_of_the_half_fraction_states_supports_aliases_and_compute():
    text = format_plan(plan_of(design="fractional", seeds=2, ledger="postgresql+psycopg://db/ledger"))
    for words in [
        "experiment  tiny",
        "fractional 2^(5-1) = 16 cells, resolution V, generators E=ABCD",
        "A  OF  techniques.overlong_filter   off / on",
        "runs        32 = 16 unique cells x 2 seeds",
        "none of the 120 complete orderings",
        "two-factor interactions (aliased with three-factor interactions)",
        "Shapley values only from a fitted model",
        "aliases     I = OF:CH:SP:TL:DS",
        "OF:CH = SP:TL:DS",
        "rough",
        "ledger   postgresql+psycopg://db/ledger",
        "tracking sqlite:///dapo-runs/mlflow.db",
        "outputs  dapo-runs/",
    ]:
        assert words in text, words


def test_printout_names_few_orderings_and_counts_many():
    few = format_plan(plan_of(design="cumulative", orderings=[FIVE, ["CH", "OF", "SP", "TL", "DS"]]))
    assert "orderings   2 of 120: paper, CH>OF>SP>TL>DS" in few
    assert "aliases" not in few
    many = format_plan(plan_of(), seconds_per_run=30)
    assert "orderings   120 of 120 (the paper's included)" in many
    assert "exact Shapley" in many and "(given)" in many


def test_cells_are_deduplicated_and_keys_follow_factor_order():
    cell = Cell((1, 0, 1, 1, 0))
    assert cell.key == "10110"
    for design in ("full", "fractional", "one_at_a_time", "cumulative"):
        plan = plan_of(design=design)
        assert len(plan.cells) == len(set(plan.cells))
        assert len(plan.runs) == len(plan.cells) * len(plan.seeds)
    assert math.factorial(5) == plan_of().orderings_count


def test_run_ids_hash_only_the_non_default_config_values():
    from dapo_ablate.ablation.experiment.identity import config_delta, make_run_id
    from dapo_ablate.core.config import TrainerConfig

    config = TrainerConfig(optim={"lr": 5e-4}, techniques={"dynamic_sampling": False})
    assert config_delta(config) == {"optim": {"lr": 5e-4}, "techniques": {"dynamic_sampling": False}}
    assert config_delta(TrainerConfig()) == {}
    # a field given its default value explicitly is the same run; any other value is another run
    same = TrainerConfig(optim={"lr": 5e-4, "warmup_steps": TrainerConfig().optim.warmup_steps},
                         techniques={"dynamic_sampling": False})
    assert make_run_id({"a": 1}, same, 0) == make_run_id({"a": 1}, config, 0)
    other = TrainerConfig(optim={"lr": 4e-4}, techniques={"dynamic_sampling": False})
    assert make_run_id({"a": 1}, other, 0) != make_run_id({"a": 1}, config, 0)


def test_run_ids_hash_the_identity_version_not_the_package_version(monkeypatch):
    """An upgrade of dapo-ablate keeps every finished run's id (resuming does not retrain);
    only a change of IDENTITY_VERSION (earlier results made stale) changes them."""
    import importlib.metadata

    ids = [run.run_id for run in plan_of().runs]
    real_version = importlib.metadata.version

    def bumped(name: str) -> str:
        return "99.0.0" if name == "dapo-ablate" else real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", bumped)
    assert [run.run_id for run in plan_of().runs] == ids
    monkeypatch.setattr(identity, "IDENTITY_VERSION", "99.0.0")
    changed = [run.run_id for run in plan_of().runs]
    assert not set(changed) & set(ids)
