"""What reaches verl's Hydra command line.

A ``trainer.verl.overrides`` entry may not touch a key a technique decides in any of Hydra's forms
(``key=``, ``+key``, ``++key=``, ``~key``, a parent replaced by a dict or deleted, a config group's
package); each is refused in one sentence naming the override and the factor. Names and paths that
end up in verl's overrides are quoted as Hydra's override grammar needs (checked against the
grammar's quoting rule, written out below), and what no quoting carries (``${``, a control
character) is refused by ``validate`` in one sentence. verl itself is not imported here; the
composition into verl's own config runs in CI (tests/unit/test_verl_compose.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends.verl import (
    VerlTranslationError,
    hydra_value,
    override_key,
    override_targets,
    verl_overrides,
)
from dapo_ablate.cli.main import app

from support import ROOT

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"
A = "actor_rollout_ref.actor"


def _cell(**verl: object):
    config = expand(load_spec(EXAMPLE)).runs[0].config
    return config.with_overrides({f"verl.{key}": value for key, value in verl.items()})


@pytest.mark.parametrize("override, key, factor", [
    (f"{A}.policy_loss.loss_mode=vanilla", f"{A}.policy_loss.loss_mode", "techniques.overlong_filter"),
    (f"{A}.policy_loss={{loss_mode:vanilla}}", f"{A}.policy_loss.loss_mode", "techniques.overlong_filter"),
    ("algorithm.filter_groups={enable:false}", "algorithm.filter_groups.enable", "techniques.dynamic_sampling"),
    ("~algorithm.filter_groups", "algorithm.filter_groups.enable", "techniques.dynamic_sampling"),
    ("~algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable", "techniques.dynamic_sampling"),
    (f"++{A}.clip_ratio_high=0.4", f"{A}.clip_ratio_high", "techniques.clip_higher"),
    (f"+{A}.loss_agg_mode=token-mean", f"{A}.loss_agg_mode", "techniques.token_level_loss"),
    ("+reward.reward_kwargs={max_resp_len:1}", "reward.reward_kwargs.overlong_buffer_cfg.enable", "techniques.soft_overlong"),
    ("reward.reward_kwargs.overlong_buffer_cfg.len.x=1", "reward.reward_kwargs.overlong_buffer_cfg.len", "techniques.soft_overlong"),
    ("trainer={use_v1:false}", "trainer.use_v1", "techniques.dynamic_sampling"),
    ("algorithm@algorithm.filter_groups=other", "algorithm.filter_groups.enable", "techniques.dynamic_sampling"),
    ("reward/reward_manager=naive", "reward.reward_manager.name", "techniques.soft_overlong"),
    (" algorithm.filter_groups.metric =seq_reward", "algorithm.filter_groups.metric", "techniques.dynamic_sampling"),
])
def test_an_override_touching_a_factors_key_in_any_hydra_form_is_refused_naming_both(override: str, key: str, factor: str):
    with pytest.raises(VerlTranslationError) as err:
        verl_overrides(_cell(overrides=[override]))
    message = str(err.value)
    assert message.startswith(f"trainer.verl.overrides entry {override!r} ") and f" {key}, which {factor} decides" in message
    assert message.endswith(f"set {factor} (or its knob) instead and leave {key} out of the overrides") and "\n" not in message


def test_overrides_beside_the_factors_keys_pass_and_come_last():
    extra = ["trainer.device=npu", "+ray_kwargs.ray_init.num_cpus=16", f"{A}.clip_ratio=0.3", "~trainer.val_only",
             "actor_rollout_ref.model.use_remove_padding=false", "algorithm.filter_groups_extra=1"]
    assert verl_overrides(_cell(overrides=extra))[-len(extra):] == extra
    assert override_key("++a.b@pkg=1") == "a.b" and override_targets("g/h@a.b=x") == ["g.h", "a.b"] and override_targets("~a") == ["a"]


def hydra_unquoted(value: str) -> str:
    """What Hydra's override grammar gives for a single-quoted value (the rule of its OverrideLexer's
    QUOTED_VALUE: inside the quotes a run of n backslashes before a quote, or before the end, stands
    for n // 2 backslashes, and an odd run escapes the quote itself; other backslashes are literal)."""
    assert value[0] == value[-1] == "'" and len(value) >= 2
    body = value[1:-1]
    out, i = [], 0
    for match in re.finditer(r"(\\+)('|$)", body):
        out.append(body[i:match.start()])
        run = len(match.group(1))
        if match.group(2):
            assert run % 2 == 1, "an unescaped quote inside would end the value"
            out.append("\\" * (run // 2) + "'")
        else:
            assert run % 2 == 0, "an odd run before the end would escape the closing quote"
            out.append("\\" * (run // 2))
        i = match.end()
    out.append(body[i:])
    assert "'" not in re.sub(r"\\+'", "", body), "a bare quote inside would end the value"
    return "".join(out)


@pytest.mark.parametrize("value", [
    "runs/GRPO (v2)", "it's", "a,b", "x=y", "data [test]", "{a:1}", "ünïcode/modèle", " lead", "trail ", "a  b",
    "ends\\", "a\\'b", "back\\slash", "null", "true", "12", "1e5", "1.", "-inf",
])
def test_a_value_hydra_cannot_take_unquoted_is_single_quoted_so_it_reads_back_the_same(value: str):
    quoted = hydra_value(value)
    assert quoted.startswith("'") and hydra_unquoted(quoted) == value


@pytest.mark.parametrize("value", ["/models/Qwen2.5-32B", "GRPO s0", "OF+CH+SP+TL+DS s0", "s3://bucket/aime-2024.parquet",
                                   "dapo-paper-verl", "v1.2", "exp-1"])
def test_a_plain_name_or_path_stays_as_it_was(value: str):
    assert hydra_value(value) == value


def _spec_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_quotes_odd_names_and_paths_in_the_entrypoints_it_prints(tmp_path: Path, monkeypatch):
    spec_path = _spec_with(tmp_path, name="dapo (paper) ünï", trainer__model__path="/models/Qwen2.5-32B 'v2'",
                           trainer__data__train="/data/dapo,17k.parquet")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("  [GRPO s0] "))
    words = dict(word.split("=", 1) for word in shlex.split(line.split("] ", 1)[1])[3:])
    assert hydra_unquoted(words["actor_rollout_ref.model.path"]) == "/models/Qwen2.5-32B 'v2'"
    assert hydra_unquoted(words["data.train_files"]) == "/data/dapo,17k.parquet"
    assert hydra_unquoted(words["trainer.project_name"]) == "dapo (paper) ünï"
    assert words["trainer.experiment_name"] == "GRPO s0"
    assert hydra_unquoted(words["trainer.default_local_dir"]).endswith("/checkpoints")


@pytest.mark.parametrize("changes, sentence", [
    ({"trainer__model__path": "/models/${oc.env:HOME}/q-32B"},
     "trainer.model.path ('/models/${oc.env:HOME}/q-32B') holds ${, which verl's OmegaConf config resolves as an interpolation "
     "on backend verl; rename it without it"),
    ({"trainer__data__eval": "/data/aime\t2024.parquet"},
     "trainer.data.eval ('/data/aime\\t2024.parquet') holds the control character U+0009, which verl's command line cannot carry "
     "on backend verl; rename it without it"),
    ({"name": "paper ${x}"},
     "name (the experiment's, verl's trainer.project_name) ('paper ${x}') holds ${, which verl's OmegaConf config resolves"),
    ({"trainer__verl__overrides": ["algorithm.filter_groups={enable:false}"]},
     "trainer.verl.overrides entry 'algorithm.filter_groups={enable:false}' replaces or deletes a parent of "
     "algorithm.filter_groups.enable, which techniques.dynamic_sampling decides on backend verl"),
])
def test_validate_refuses_what_verl_cannot_take_in_one_sentence_writing_nothing(changes: dict, sentence: str, tmp_path: Path, monkeypatch):
    spec_path = _spec_with(tmp_path, **changes)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 2, result.output
    assert sentence in " ".join(result.output.split()).replace("( ", "(")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
