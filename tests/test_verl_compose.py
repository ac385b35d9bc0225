"""The TrainerConfig -> verl translation composes into verl's own Hydra config (verl 0.9.1).

verl's pins clash with this environment (transformers<5.11), so verl lives in its own virtual
environment with Hydra (``pip install --no-deps verl==0.9.1 hydra-core omegaconf``; .ci/run builds
it). Its python is found through ``DAPO_VERL_PYTHON``; without it the test skips, unless
``DAPO_REQUIRE_VERL=1`` (as in .ci/run), where a missing environment fails.

The overrides of all 32 cells of examples/paper_verl.yaml are composed with Hydra's compose API
into ``verl/trainer/config/ppo_trainer.yaml`` in struct mode, so an override naming a key verl does
not have fails; the composed values of the toggles are read back per cell, and the algorithm, actor
and rollout sections are built into verl's own config classes (whose checks run).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl import (
    OVERLONG_FILTER_LOSS,
    VerlTranslationError,
    job_shape,
    verl_overrides,
)
from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.core.config import TrainerConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "paper_verl.yaml"

# Runs in the verl environment: reads [[override, ...], ...] on stdin, composes each list,
# prints one JSON line per list: {"ok": true, "values": {...}} or {"ok": false, "error": "..."}.
COMPOSE = r"""
import importlib.util, json, os, site, sys
site.addsitedir(sys.argv[1])  # this environment's torch, after verl's own packages
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
config_dir = os.path.join(importlib.util.find_spec("verl").submodule_search_locations[0], "trainer", "config")
read = ["actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.actor.loss_agg_mode", "algorithm.filter_groups.enable",
        "algorithm.filter_groups.max_inflight_gen_batches", "trainer.use_v1", "trainer.nnodes", "trainer.n_gpus_per_node",
        "reward.reward_kwargs.overlong_buffer_cfg.enable", "reward.reward_manager.name",
        "actor_rollout_ref.rollout.val_kwargs.n", "actor_rollout_ref.actor.ppo_mini_batch_size"]
with initialize_config_dir(config_dir=config_dir, version_base=None):
    for overrides in json.load(sys.stdin):
        try:
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
            values = {key: OmegaConf.select(cfg, key) for key in read}
            OmegaConf.resolve(cfg)
            for node in (cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout):
                omega_conf_to_dataclass(node)  # verl's own config classes and their checks
            print(json.dumps({"ok": True, "values": values}))
        except Exception as err:
            print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"}))
"""


def verl_python() -> str:
    python = os.environ.get("DAPO_VERL_PYTHON", "")
    if not python or not Path(python).is_file():
        if os.environ.get("DAPO_REQUIRE_VERL") == "1":
            pytest.fail(f"DAPO_REQUIRE_VERL=1 but DAPO_VERL_PYTHON ({python!r}) is not a python with verl installed")
        pytest.skip("no verl environment (set DAPO_VERL_PYTHON to its python; .ci/run builds one)")
    return python


def compose(python: str, override_lists: list[list[str]]) -> list[dict]:
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run([python, "-c", COMPOSE, site_packages], input=json.dumps(override_lists), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(override_lists), result.stdout[-2000:] + result.stderr[-2000:]
    return lines


def paper_cells() -> list[tuple[TrainerConfig, list[str]]]:
    plan = expand(load_spec(EXAMPLE))
    return [(run.config, verl_overrides(run.config, nnodes=16, gpus_per_node=8, project="paper-verl", run_name=run.name,
                                        run_dir=f"/runs/{run.run_id}")) for run in plan.runs]


def test_the_overrides_of_all_32_cells_compose_into_verls_config_and_a_wrong_key_fails():
    python = verl_python()
    cells = paper_cells()
    assert len(cells) == 32 and len({tuple(o) for _, o in cells}) == 32
    wrong = [*cells[0][1], "actor_rollout_ref.actor.clip_ratio_hgih=0.28"]  # a key verl does not have
    bad_value = [*cells[0][1], "actor_rollout_ref.actor.loss_agg_mode=token-meen"]  # refused by verl's ActorConfig
    results = compose(python, [overrides for _, overrides in cells] + [wrong, bad_value])
    for (config, _), result in zip(cells, results[:-2]):
        assert result["ok"], result["error"]
        values, t = result["values"], config.techniques
        assert values["actor_rollout_ref.actor.policy_loss.loss_mode"] == (OVERLONG_FILTER_LOSS if t.overlong_filter else "vanilla")
        assert values["actor_rollout_ref.actor.clip_ratio_high"] == pytest.approx(0.28 if t.clip_higher else 0.2)
        assert values["actor_rollout_ref.actor.loss_agg_mode"] == ("token-mean" if t.token_level_loss else "seq-mean-token-mean")
        assert values["algorithm.filter_groups.enable"] is t.dynamic_sampling
        assert values["algorithm.filter_groups.max_inflight_gen_batches"] == (3 if t.dynamic_sampling else 1)  # 1536 / 512
        assert values["trainer.use_v1"] is True  # the legacy trainer would ignore filter_groups
        assert (values["trainer.nnodes"], values["trainer.n_gpus_per_node"]) == (16, 8)
        assert values["reward.reward_kwargs.overlong_buffer_cfg.enable"] is t.soft_overlong
        assert values["reward.reward_manager.name"] == "dapo"
        assert values["actor_rollout_ref.rollout.val_kwargs.n"] == 32
        assert values["actor_rollout_ref.actor.ppo_mini_batch_size"] == 32  # 512 responses / 16 per prompt
    assert not results[-2]["ok"] and "clip_ratio_hgih" in results[-2]["error"]
    assert not results[-1]["ok"] and "token-meen" in results[-1]["error"]


def test_the_added_reward_keys_are_the_ones_verls_dapo_reward_manager_reads():
    """`+reward.reward_kwargs.*` adds keys Hydra cannot check; verl's dapo manager must read them."""
    python = verl_python()
    source = subprocess.run(
        [python, "-c", "import importlib.util, os; p = importlib.util.find_spec('verl').submodule_search_locations[0]; "
         "print(open(os.path.join(p, 'experimental/reward_loop/reward_manager/dapo.py')).read())"],
        capture_output=True, text=True, check=True,
    ).stdout
    added = {o.split("=")[0] for o in verl_overrides(paper_cells()[0][0]) if o.startswith("+")}
    assert added == {f"+reward.reward_kwargs.overlong_buffer_cfg.{k}" for k in ("enable", "len", "penalty_factor", "log")} | {
        "+reward.reward_kwargs.max_resp_len"}
    assert 'config.reward.get("reward_kwargs", {}).get("overlong_buffer_cfg"' in source
    assert 'config.reward.get("reward_kwargs", {}).get("max_resp_len"' in source
    for attribute in ("enable", "len", "penalty_factor", "log"):
        assert f"overlong_buffer_cfg.{attribute}" in source


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model": {"path": "builtin"}, "rollout": {"engine": "hf"}}, "trainer.model.path"),
        ({"rollout": {"engine": "hf"}}, "trainer.rollout.engine"),
        ({"algorithm": {"reward_wrong": 0.0}}, "trainer.algorithm.reward_correct/reward_wrong"),
        ({"batch": {"mini_batch_size": 8, "micro_batch_size": 4}}, "trainer.batch.mini_batch_size"),
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
        with pytest.raises(VerlTranslationError, match="a technique decides"):
            verl_overrides(config)
    allowed = base.with_overrides({"verl.overrides": ["trainer.device=npu"]})
    assert verl_overrides(allowed)[-1] == "trainer.device=npu"


def override_value(overrides: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key)


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
