"""TrainerConfig: the paper's defaults, cross-field rules, and one-sentence errors."""

import pytest

from dapo_ablate.core.config import (
    ConfigError,
    TrainerConfig,
    build_trainer_config,
    load_trainer_config,
    resolve_knob,
)

from support import ROOT


def test_defaults_are_the_papers():
    c = TrainerConfig()
    assert all(getattr(c.techniques, t) for t in ("overlong_filter", "clip_higher", "soft_overlong",
                                                  "token_level_loss", "dynamic_sampling"))
    assert (c.optim.lr, c.optim.warmup_steps, c.optim.grad_clip) == (1e-6, 20, 1.0)
    assert (c.batch.prompts_per_step, c.algorithm.group_size, c.batch.mini_batch_size) == (512, 16, 512)
    # 512 prompts x 16 responses / 512 per mini-batch = 16 optimizer updates per rollout step
    assert c.batch.prompts_per_step * c.algorithm.group_size // c.batch.mini_batch_size == 16
    assert (c.algorithm.eps_low, c.algorithm.eps_high) == (0.2, 0.28)
    assert (c.rollout.max_response_len, c.algorithm.overlong_cache) == (20480, 4096)
    assert c.rollout.max_response_len - c.algorithm.overlong_cache == 16384  # the penalty's start
    assert (c.rollout.temperature, c.rollout.top_p) == (1.0, 1.0)
    assert (c.rollout.eval_k, c.rollout.eval_temperature, c.rollout.eval_top_p) == (32, 1.0, 0.7)
    assert c.algorithm.kl_coef == 0.0


def test_eps_high_is_used_only_with_clip_higher():
    on = TrainerConfig()
    off = on.with_overrides({"techniques.clip_higher": False})
    assert on.eps_high_effective == 0.28 and off.eps_high_effective == 0.2


def test_config_is_frozen_and_hash_is_stable():
    c = TrainerConfig()
    with pytest.raises(Exception):
        c.optim.lr = 1.0  # type: ignore[misc]
    assert c.digest() == TrainerConfig().digest()
    assert c.digest() != c.with_overrides({"schedule.seed": 1}).digest()


@pytest.mark.parametrize(
    "data, words",
    [
        ({"optim": {"lrr": 1}}, ["optim.lrr", "unknown key"]),
        ({"optim": {"lr": "fast"}}, ["optim.lr", "got 'fast'"]),
        ({"schedule": {"total_steps": 2.5}}, ["schedule.total_steps", "fractional part (2.5)"]),
        ({"techniques": {"clip_higher": "maybe"}}, ["techniques.clip_higher", "valid boolean", "got 'maybe'"]),
        ({"rollout": [1, 2]}, ["`rollout`", "got [1, 2]"]),
        ({"optim": {"lr": "x" * 500}}, ["optim.lr", "got 'xxxxx", "...;"]),
        ({"algorithm": {"eps_low": 0.3, "eps_high": 0.2}}, ["eps_high", "eps_low"]),
        ({"algorithm": {"overlong_cache": 40000}}, ["overlong_cache", "max_response_len"]),
        ({"batch": {"prompts_per_step": 4, "mini_batch_size": 5}, "algorithm": {"group_size": 4}}, ["mini_batch_size"]),
        ({"model": {"path": "/no/such/model"}}, ["model.path", "/no/such/model"]),
        ({"data": {"train": "/no/such/file.parquet"}}, ["data.train", "does not exist"]),
        ({"data": {"train": "é" * 200 + ".jsonl"}}, ["data.train", "cannot be read (File name too long)"]),
        ({"data": {"eval": "/dev/zero"}}, ["data.eval", "is not a regular file"]),
        ({"rollout": {"engine": "vllm"}}, ["vllm", "model.path"]),
        ({"model": {"param_dtype": "bfloat16"}}, ["param_dtype", "float32", "model.dtype"]),
    ],
)
def test_bad_config_gets_one_sentence_naming_the_field(data, words):
    with pytest.raises(ConfigError) as err:
        build_trainer_config(data, source="x.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("x.yaml")
    for word in words:
        assert word in message


def test_yaml_round_trip_and_relative_paths(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: train.jsonl}\nschedule: {total_steps: 3}\n")
    c = load_trainer_config(path)
    assert c.schedule.total_steps == 3 and c.data.train == str(tmp_path / "train.jsonl")


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_trainer_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_trainer_config(bad)


def test_a_wrong_type_echoes_the_value_given_on_one_line():
    with pytest.raises(ConfigError) as err:  # the value's control characters are escaped, not printed
        build_trainer_config({"optim": {"lr": "1e-3\nrm -rf"}}, source="x.yaml")
    assert str(err.value) == (
        "x.yaml: `optim.lr`: Input should be a valid number, unable to parse string as a number, "
        "got '1e-3\\nrm -rf'; fix this value"
    )
    with pytest.raises(ConfigError) as err:  # a validator's own sentence is not echoed twice
        build_trainer_config({"algorithm": {"eps_low": 0.3, "eps_high": 0.2}}, source="x.yaml")
    assert ", got " not in str(err.value)


def test_resolve_knob():
    assert resolve_knob("eps_high") == "algorithm.eps_high"
    assert resolve_knob("optim.lr") == "optim.lr"
    with pytest.raises(ConfigError, match="unknown knob"):
        resolve_knob("nope")


def test_paper_example_is_a_valid_config_once_its_paths_exist(tmp_path):
    """examples/paper_qwen32b.yaml holds the paper's values; only its paths are machine-specific."""
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "paper_qwen32b.yaml").read_text())
    (tmp_path / "model").mkdir()
    (tmp_path / "train.parquet").write_text("")
    (tmp_path / "aime.jsonl").write_text("")
    data["model"]["path"] = str(tmp_path / "model")
    data["data"]["train"], data["data"]["eval"] = str(tmp_path / "train.parquet"), str(tmp_path / "aime.jsonl")
    c = build_trainer_config(data)
    assert c.rollout.engine == "vllm" and c.eps_high_effective == 0.28
    assert c.batch.prompts_per_step * c.algorithm.group_size // c.batch.mini_batch_size == 16
    assert c.gen_prompts_per_round == 1536


def _float_fields() -> list[str]:
    from dapo_ablate.core.config import knob_paths

    out = []
    for leaf, dotted in knob_paths().items():
        section, _ = dotted.split(".")
        annotation = str(TrainerConfig.model_fields[section].annotation.model_fields[leaf].annotation)
        if "float" in annotation and "Literal" not in annotation:
            out.append(dotted)
    return out


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_are_refused_in_every_float_field(bad):
    fields = _float_fields()
    assert {"optim.lr", "algorithm.eps_high", "algorithm.tis_cap", "rollout.temperature"} <= set(fields)
    for dotted in fields:
        section, leaf = dotted.split(".")
        value = [bad, 0.9] if leaf == "betas" else bad
        with pytest.raises(ConfigError) as err:
            build_trainer_config({section: {leaf: value}}, source="x.yaml")
        message = str(err.value)
        assert dotted in message and "finite" in message and len(message.splitlines()) == 1, message


def test_counts_stop_at_two_to_the_31():
    """A count past 2^31 - 1 is a typo (and past 64 bits it would crash validate's float
    arithmetic): refused by its field, also when the config is built from a dict."""
    from dapo_ablate.core.config import MAX_COUNT

    with pytest.raises(ConfigError, match="schedule.total_steps"):
        build_trainer_config({"schedule": {"total_steps": 10**400}})
    assert build_trainer_config({"schedule": {"total_steps": MAX_COUNT}}).schedule.total_steps == MAX_COUNT


def test_the_value_echo_and_why_a_path_is_no_file_are_worded_in_one_place(tmp_path):
    """core/config_errors.py words these for every module (yamlio, sweeps, reports): a key or value
    on one line, cut at 60 characters; a long integer by its digits (a cut number reads as another
    number); a path whole and escaped; why a path is no file, with the caller's fix."""
    import errno
    import os
    from pathlib import Path

    from dapo_ablate.core.config_errors import not_a_file, not_a_file_error, shown_key, shown_path, shown_value

    assert shown_key("eps_high") == "eps_high" and shown_key("a\nb") == "'a\\nb'"
    assert shown_key("k" * 61) == "'" + "k" * 56 + "..."
    assert shown_value(10**64) == "an integer of 65 digits" and shown_value(-(10**28), 30) == "-1" + "0" * 28
    assert shown_value(-(10**29), 30) == "an integer of 30 digits" and shown_value(10**5000) == "an integer of about 5001 digits"
    assert shown_path(Path("a\nb.yaml")) == "'a\\nb.yaml'" and shown_path("x" * 100) == repr("x" * 100)
    os.symlink(tmp_path / "gone.yaml", tmp_path / "link.yaml")
    assert not_a_file(tmp_path / "link.yaml") == f"is a link to {shown_path(tmp_path / 'gone.yaml')}, which does not exist"
    os.symlink("loop", tmp_path / "loop")
    assert not_a_file(tmp_path / "loop") == "is a link loop" and not_a_file(tmp_path) == "is a directory"
    assert not_a_file(Path("/dev/zero")) == "is not a regular file (a pipe, socket or device)"
    refused = PermissionError(errno.EACCES, "Permission denied")
    assert not_a_file_error(refused, tmp_path / "x", "check the path") == "cannot be read (Permission denied); check its permissions"
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory")
    assert not_a_file_error(missing, tmp_path / "x", "check the path") == "does not exist; check the path"
