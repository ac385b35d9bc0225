"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_verl_compose.py
describes; its docstring says what they check."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl import (
    OVERLONG_FILTER_LOSS,
    OVERLONG_FILTER_TRAINER,
    verl_overrides,
)

from test_verl_compose import EXAMPLE, paper_cells  # noqa: F401, F811 - shared with the fast part

pytestmark = pytest.mark.verl_env  # the verl environment's python, from this one (.ci/run's verl part)


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
        "algorithm.filter_groups.max_inflight_gen_batches", "trainer.use_v1", "trainer.v1.trainer_mode", "trainer.nnodes", "trainer.n_gpus_per_node",
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
        # the loss comes with the trainer mode that makes verl count its units (verl_trainer)
        assert values["trainer.v1.trainer_mode"] == (OVERLONG_FILTER_TRAINER if t.overlong_filter else "sync")
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
