"""design: adaptive in the spec and the plan: stage 1 is the resolution V fraction (every
cell below 5 factors, or the user's fraction) at the spec's seeds; the runs the looks add join the
plan; the name is bound to the rules the error guarantee rests on, not to the budgets."""

from __future__ import annotations

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.plan import format_plan
from dapo_ablate.ablation.experiment.spec import SpecError, build_spec
from dapo_ablate.ablation.store.binding import experiment_digest

from tiny_configs import TINY_TRAINER
from support import ROOT


THREE = ["overlong_filter", "clip_higher", "dynamic_sampling"]


def spec_of(**fields):
    return build_spec({"name": "adapt", "trainer": TINY_TRAINER, "design": "adaptive", "seeds": 2, **fields})


def test_stage_one_is_the_resolution_v_half_fraction_of_five_factors_at_the_spec_seeds():
    plan = expand(spec_of())
    assert (len(plan.cells), len(plan.runs), plan.resolution, plan.generators) == (16, 32, 5, ["E=ABCD"])
    assert {run.seed for run in plan.runs} == {0, 1}
    assert plan.spec.adaptive.max_seeds == 6 and plan.spec.adaptive.spending == "obrien_fleming"  # the defaults
    text = format_plan(plan)
    assert "adaptive: stage 1 fractional 2^(5-1), resolution V, grown look by look" in text
    assert "32 so far in 16 cells (stage 1: 2 seeds each); each look adds 1 seed where undecided, at most 6 per cell and 192 runs in all" in text


def test_below_five_factors_stage_one_is_every_cell_and_the_users_fraction_is_taken():
    assert len(expand(spec_of(factors=THREE)).cells) == 8
    quarter = expand(spec_of(factors=THREE + ["soft_overlong", "token_level_loss", {"eps_high": [0.2, 0.28]}],
                             resolution=4))
    assert len(quarter.cells) == 16 and quarter.resolution == 4  # 2^(6-2), the fewest runs of resolution IV


def test_the_looks_runs_join_the_plan_and_a_cell_outside_stage_one_folds_over():
    spec = spec_of()
    first = expand(spec)
    outside = next(key for key in ("00000", "10000") if key not in {cell.key for cell in first.cells})
    grown = expand(spec, [(first.cells[0].key, 2), (outside, 0), (outside, 1)])
    assert len(grown.runs) == 35 and len(grown.cells) == 17
    assert {(run.cell.key, run.seed) for run in first.runs} < {(run.cell.key, run.seed) for run in grown.runs}
    folded = expand(spec, [("".join(map(str, levels)), 0) for levels in
                           ((a, b, c, d, e) for a in (0, 1) for b in (0, 1) for c in (0, 1) for d in (0, 1) for e in (0, 1))])
    assert len(folded.cells) == 32 and folded.resolution is None and not folded.aliases
    assert "exact Shapley and Banzhaf values" in folded.supports


@pytest.mark.parametrize(("fields", "words"), [
    ({"design": "full", "adaptive": {}}, "`adaptive`: only applies to design: adaptive (this is full); remove it"),
    ({"seeds": 8, "adaptive": {"max_seeds": 3}}, "`seeds`: stage 1 has 8 seeds, above adaptive.max_seeds (3)"),
    ({"factors": ["overlong_filter"]}, "`factors`: design: adaptive needs at least 2 factors"),
    ({"adaptive": {"alpha": 0.7}}, "`adaptive.alpha`"),
    ({"adaptive": {"spending": "haybittle"}}, "`adaptive.spending`"),
    ({"settings": [{"name": "a", "overrides": {}}, {"name": "b", "overrides": {}}]}, "does not take transfer settings"),
    ({"factors": THREE, "resolution": 5}, "no 2^(3-p) fraction of 3 factors reaches resolution V"),
    ({"adaptive": {"effect_of_interest": 0.02}}, "for 2 pp write effect_of_interest: 2"),  # a fraction typed: pp, as everywhere
    ({"adaptive": {"effect_of_interest": 150}}, "cannot exceed 100"),
])
def test_bad_adaptive_specs_are_one_sentence(fields, words):
    with pytest.raises(SpecError) as raised:
        spec_of(**fields)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_the_name_is_bound_to_alpha_spending_and_effect_but_not_to_the_budgets():
    base = experiment_digest(spec_of())
    assert experiment_digest(spec_of(adaptive={"max_seeds": 10, "max_runs": 50, "max_tokens": 10**9})) == base
    for rule in ({"alpha": 0.1}, {"spending": "pocock"}, {"effect_of_interest": 1.0}):
        assert experiment_digest(spec_of(adaptive=rule)) != base, rule
    assert experiment_digest(build_spec({"name": "adapt", "trainer": TINY_TRAINER, "seeds": 2})) != base


def test_the_adaptive_example_is_valid_and_plans_the_full_2_3_at_two_seeds():

    from dapo_ablate.ablation.experiment.spec import load_spec

    spec = load_spec(ROOT / "examples" / "adaptive.yaml")
    plan = expand(spec)
    assert spec.design == "adaptive" and spec.adaptive.max_seeds == 4 and len(plan.runs) == 16
    assert plan.spec.trainer.model.path == "builtin"
