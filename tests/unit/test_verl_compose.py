"""The TrainerConfig -> verl translation composes into verl's own Hydra config (verl 0.9.1).

verl's pins clash with this environment (transformers<5.11), so verl lives in its own virtual
environment with Hydra (``pip install --no-deps verl==0.9.1 hydra-core omegaconf``; .ci/run builds
it). Its python is found through ``DAPO_VERL_PYTHON``; without it the test skips, unless
``DAPO_REQUIRE_VERL=1`` (as in .ci/run), where a missing environment fails.

The overrides of all 32 cells of examples/paper_verl.yaml are composed with Hydra's compose API
into ``verl/trainer/config/ppo_trainer.yaml`` in struct mode, so an override naming a key verl does
not have fails; the composed values of the toggles are read back per cell, and the algorithm, actor
and rollout sections are built into verl's own config classes (whose checks run).

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_verl_compose_e2e.py."""

from __future__ import annotations

import math

import pytest

from dapo_ablate.ablation.runtime.backends.verl import (
    VerlTranslationError,
    job_shape,
    verl_overrides,
)
from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.core.config import TrainerConfig

from support import ROOT


EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


def paper_cells() -> list[tuple[TrainerConfig, list[str]]]:
    plan = expand(load_spec(EXAMPLE))
    return [(run.config, verl_overrides(run.config, nnodes=16, gpus_per_node=8, project="paper-verl", run_name=run.name,
                                        run_dir=f"/runs/{run.run_id}")) for run in plan.runs]


def override_value(overrides: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model": {"path": "builtin"}, "rollout": {"engine": "hf"}}, "trainer.model.path"),
        ({"rollout": {"engine": "hf"}}, "trainer.rollout.engine"),
        ({"algorithm": {"reward_wrong": 0.0}}, "trainer.algorithm.reward_correct/reward_wrong"),
        ({"batch": {"mini_batch_size": 8, "micro_batch_size": 4}}, "trainer.batch.mini_batch_size"),
        # Overlong Filtering's loss sees neither verl's KL term nor rollout importance weights
        # (tests/e2e/test_verl_techniques.py shows verl's KL term keeping the truncated tokens)
        ({"techniques": {"overlong_filter": True}, "algorithm": {"kl_coef": 0.001}}, "trainer.algorithm.kl_coef"),
        ({"techniques": {"overlong_filter": True}, "algorithm": {"tis_cap": 2.0}}, "trainer.algorithm.tis_cap"),
    ],
)
def test_what_verl_cannot_do_is_refused_in_one_sentence(change: dict, field: str):
    base = paper_cells()[0][0].to_dict()
    for section, values in change.items():
        base[section] = {**base[section], **values}
    with pytest.raises(VerlTranslationError) as err:
        verl_overrides(TrainerConfig(**base))
    message = str(err.value)
    assert message.startswith(field) and "backend verl" in message and "\n" not in message
    if "techniques" in change:  # the same knob without Overlong Filtering translates
        base["techniques"] = {**base["techniques"], "overlong_filter": False}
        assert verl_overrides(TrainerConfig(**base))


def test_job_shape_splits_gpus_into_whole_nodes_and_refuses_the_rest():
    assert job_shape(128, 8) == (16, 8) and job_shape(2, 8) == (1, 2) and job_shape(8, 8) == (1, 8) and job_shape(12, 4) == (3, 4)
    for gpus, per_node, words in ((12, 8, "whole number of nodes"), (0, 8, "at least 1"), (1.5, 8, "whole number of GPUs")):
        with pytest.raises(VerlTranslationError) as err:
            job_shape(gpus, per_node)
        assert str(err.value).startswith("executor.gpus_per_run") and words in str(err.value)


def test_an_extra_override_of_a_key_a_technique_decides_is_refused():
    base = paper_cells()[0][0]
    for override in ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "+algorithm.filter_groups.enable=true", "trainer.use_v1=false"):
        config = base.with_overrides({"verl.overrides": [override]})
        with pytest.raises(VerlTranslationError, match=r"which techniques\.\w+ decides"):
            verl_overrides(config)
    allowed = base.with_overrides({"verl.overrides": ["trainer.device=npu"]})
    assert verl_overrides(allowed)[-1] == "trainer.device=npu"


def test_with_overlong_filtering_an_override_adding_a_loss_term_over_every_token_is_refused():
    """verl's ppo_loss adds an entropy bonus and a KL loss over every response token, the truncated
    ones' included: with Overlong Filtering an extra override may not switch them on (the same
    reason algorithm.kl_coef is refused with it); without it they stay the user's to set."""
    base = paper_cells()[0][0]
    for override in ("actor_rollout_ref.actor.entropy_coeff=0.001", "actor_rollout_ref.actor.use_kl_loss=true",
                     "++actor_rollout_ref.actor.kl_loss_coef=0.1"):
        filtered = base.with_overrides({"techniques.overlong_filter": True, "verl.overrides": [override]})
        with pytest.raises(VerlTranslationError, match=r"which techniques\.overlong_filter \(verl adds this term over every token"):
            verl_overrides(filtered)
    for override in ("actor_rollout_ref.actor.entropy_coeff=0.001", "actor_rollout_ref.actor.use_kl_loss=true"):
        unfiltered = base.with_overrides({"techniques.overlong_filter": False, "verl.overrides": [override]})
        assert verl_overrides(unfiltered)[-1] == override


@pytest.mark.parametrize("clip_higher", [True, False])
@pytest.mark.parametrize("dynamic_sampling", [True, False])
@pytest.mark.parametrize("gen_prompts_per_round, inflight_with_ds", [(None, 3), (1000, 2), (2048, 4)])
def test_clip_ratio_high_and_the_inflight_bound_follow_the_configs_derived_values(
    clip_higher: bool, dynamic_sampling: bool, gen_prompts_per_round: int | None, inflight_with_ds: int
):
    """eps_high 0.28, eps_low 0.2, 512 prompts per step (the paper's). In flight with Dynamic Sampling:
    None -> 3 x 512 = 1536 prompts per round, ceil(1536 / 512) = 3; 1000 -> ceil(1.95) = 2; 2048 -> 4.
    Without it a round is one step's 512 prompts, so 1, whatever gen_prompts_per_round says."""
    config = paper_cells()[0][0].with_overrides({
        "techniques.clip_higher": clip_higher, "techniques.dynamic_sampling": dynamic_sampling,
        "algorithm.gen_prompts_per_round": gen_prompts_per_round,
    })
    overrides = verl_overrides(config)
    clip_high = float(override_value(overrides, "actor_rollout_ref.actor.clip_ratio_high"))
    inflight = int(override_value(overrides, "algorithm.filter_groups.max_inflight_gen_batches"))
    assert clip_high == pytest.approx(0.28 if clip_higher else 0.2)
    assert inflight == (inflight_with_ds if dynamic_sampling else 1)
    assert clip_high == config.eps_high_effective
    assert inflight == math.ceil(config.gen_prompts_per_round / config.batch.prompts_per_step)


def test_the_translation_asks_the_config_for_eps_high_and_prompts_per_round(monkeypatch):
    """Values no rule of the translation's own would give: only the config's properties can be their source."""
    config = paper_cells()[0][0].with_overrides({"techniques.clip_higher": False, "techniques.dynamic_sampling": False})
    monkeypatch.setattr(TrainerConfig, "eps_high_effective", property(lambda self: 0.77))
    monkeypatch.setattr(TrainerConfig, "gen_prompts_per_round", property(lambda self: 5 * self.batch.prompts_per_step))
    overrides = verl_overrides(config)
    assert override_value(overrides, "actor_rollout_ref.actor.clip_ratio_high") == "0.77"
    assert override_value(overrides, "algorithm.filter_groups.max_inflight_gen_batches") == "5"


@pytest.mark.parametrize("total_steps, eval_every, test_freq, evaluations", [
    (100, 20, "20", 6),  # 0, 20, ..., 100
    (50, 7, "7", 9),  # 0, 7, ..., 49, and the last step, 50
    (30, 0, "30", 2),  # only at the start and the end: verl validates the last step only when test_freq > 0
])
def test_verl_validates_where_the_builtin_trainer_evaluates(total_steps: int, eval_every: int, test_freq: str, evaluations: int):
    base = paper_cells()[0][0].to_dict()
    config = TrainerConfig(**{**base, "schedule": {**base["schedule"], "total_steps": total_steps, "eval_every": eval_every}})
    assert override_value(verl_overrides(config), "trainer.test_freq") == test_freq
    assert config.schedule.evaluations == evaluations
    assert evaluations == 1 + sum(config.schedule.evaluates_after(step) for step in range(1, total_steps + 1))
