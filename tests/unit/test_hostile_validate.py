"""`validate`, `run --dry-run` and `sweep --dry-run` catch what the spec and the environment can
tell before Ray starts: each case exits 2 with one sentence starting "error: "
that names the field, and nothing is written (not even the output folder)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli.main import app

from tiny_configs import QUICKSTART_SHAPE
from test_hostile_input import spec_data


EXPERIMENT_COMMANDS = [["validate"], ["run", "--dry-run"]]


def sweep_data(tmp_path: Path, **fields) -> dict:
    data = spec_data(tmp_path, name="hostile-sweep", space={"eps_high": {"low": 0.28, "high": 0.4}}, n_trials=2)
    for key in ("factors", "seeds"):
        data.pop(key)
    data.update(fields)
    return data


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (links not followed) with its kind, and a file's size and
    modification time (a folder's changes with the write probe, created and removed at once)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.join(folder, name)] = (os.lstat(os.path.join(folder, name)).st_mode,)
        for name in files:
            stat = os.lstat(os.path.join(folder, name))
            out[os.path.join(folder, name)] = (stat.st_mode, stat.st_size, stat.st_mtime_ns)
    return out


def refused(tmp_path: Path, args: list[str], data: dict, needle: str) -> str:
    """Invoke the command on `data` written as a spec; assert the one-sentence refusal."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, [args[0], str(path), *args[1:]])
    message = result.output.strip()
    assert result.exit_code == 2, result.output
    assert message.startswith("error: ") and message.count("\n") == 0, message
    assert "Traceback" not in message and needle in message, message
    assert snapshot(tmp_path) == before  # nothing written, not even a probe file
    return message


# ------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
def test_a_300_character_name_is_refused(tmp_path, args):
    message = refused(tmp_path, args, spec_data(tmp_path, name="x" * 300), "`name`")
    assert "300 characters" in message


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
def test_a_name_too_long_for_the_output_folders_file_system_is_refused(tmp_path, args):
    # 150 characters pass the spec's length rule, but in UTF-8 they are 300 bytes: more than the
    # 255 bytes a file name may have on this file system (os.pathconf PC_NAME_MAX)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "é" * (limit // 2 + 10)
    message = refused(tmp_path, args, spec_data(tmp_path, name=name), "`name`")
    assert f"{limit} bytes" in message


@pytest.mark.parametrize("name", ["two\nlines", "tab\there", "bell\x07", "right-to-left\u202eoverride"])
def test_control_characters_in_a_name_are_refused(tmp_path, name):
    refused(tmp_path, ["validate"], spec_data(tmp_path, name=name), "`name`")


def test_control_characters_in_a_setting_name_are_refused(tmp_path):
    settings = [{"name": "short\n", "overrides": {}}, {"name": "long", "overrides": {}}]
    refused(tmp_path, ["validate"], spec_data(tmp_path, settings=settings), "`settings`")


def test_control_characters_in_factor_and_knob_names_are_refused(tmp_path):
    refused(tmp_path, ["validate"], spec_data(tmp_path, factors=["clip_higher\n"]), "`factors`")
    refused(tmp_path, ["validate"], spec_data(tmp_path, factors=[{"eps_high\n": [0.28, 0.3]}]), "`factors`")


# ------------------------------------------------------------------------------------ seeds
@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("seeds", [[10**23], [0, -1], [2**32]])
def test_seeds_outside_the_rngs_range_are_refused(tmp_path, args, seeds):
    refused(tmp_path, args, spec_data(tmp_path, seeds=seeds), "`seeds")  # 10^23: `seeds[0]`, past 64 bits


@pytest.mark.parametrize("seed", [10**23, -1])
def test_a_trainer_seed_outside_the_rngs_range_is_refused(tmp_path, seed):
    trainer = {**QUICKSTART_SHAPE, "schedule": {**QUICKSTART_SHAPE["schedule"], "seed": seed}}
    refused(tmp_path, ["validate"], spec_data(tmp_path, trainer=trainer), "schedule.seed")


# ------------------------------------------------------------------------------ folders, stores
def loop(tmp_path: Path) -> Path:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
def test_an_output_dir_in_a_symlink_loop_is_refused(tmp_path, args):
    message = refused(tmp_path, args, spec_data(tmp_path, output_dir=str(loop(tmp_path) / "runs")), "`output_dir`")
    assert "symbolic link" in message


def test_an_output_dir_through_a_link_to_nothing_is_refused(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "missing")
    message = refused(tmp_path, ["validate"], spec_data(tmp_path, output_dir=str(tmp_path / "gone" / "runs")), "`output_dir`")
    assert "symbolic link to nothing" in message


def test_a_ledger_in_a_symlink_loop_is_refused(tmp_path):
    refused(tmp_path, ["validate"], spec_data(tmp_path, ledger=f"sqlite:///{loop(tmp_path)}/ledger.db"), "`ledger`")


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("location", ["/proc/dapo-artifacts", "file:///proc/dapo-artifacts"])
def test_an_unwritable_artifact_location_is_refused(tmp_path, args, location):
    uri = f"sqlite:///{tmp_path}/out/mlflow.db"
    data = spec_data(tmp_path, tracking={"uri": uri, "artifact_location": location})
    refused(tmp_path, args, data, "`tracking.artifact_location`")


def test_an_artifact_location_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    data = spec_data(tmp_path, tracking={"uri": f"sqlite:///{tmp_path}/out/mlflow.db", "artifact_location": str(tmp_path / "file" / "art")})
    refused(tmp_path, ["validate"], data, "`tracking.artifact_location`")


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("field", ["tracking.uri", "ledger"])
def test_a_store_file_that_is_not_sqlite_is_refused_at_once(tmp_path, args, field):
    out = tmp_path / "out"
    out.mkdir()
    (out / "store.db").write_bytes(b"this is not a database\n" * 100)
    uri = f"sqlite:///{out}/store.db"
    data = spec_data(tmp_path, **({"ledger": uri} if field == "ledger" else {"tracking": {"uri": uri}}))
    message = refused(tmp_path, args, data, f"`{field}`")
    assert "not a SQLite database" in message


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("field", ["tracking.uri", "ledger"])
def test_a_store_path_that_is_a_directory_is_refused_at_once(tmp_path, args, field):
    (tmp_path / "out" / "store.db").mkdir(parents=True)
    uri = f"sqlite:///{tmp_path}/out/store.db"
    data = spec_data(tmp_path, **({"ledger": uri} if field == "ledger" else {"tracking": {"uri": uri}}))
    message = refused(tmp_path, args, data, f"`{field}`")
    assert "is a directory" in message


def test_an_existing_sqlite_store_and_an_empty_file_pass(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    sqlite3.connect(out / "mlflow.db").execute("CREATE TABLE t (x)").connection.close()
    (out / "ledger.db").touch()  # an empty file is a fresh SQLite database
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(tmp_path)))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("ledger", ["dapo-runs/ledger.db", "http://example.invalid/ledger", "mysql://u@127.0.0.1/x"])
def test_a_ledger_url_that_is_not_a_ledger_database_is_refused(tmp_path, args, ledger):
    refused(tmp_path, args, spec_data(tmp_path, ledger=ledger), "`ledger`")


# --------------------------------------------------------------------------------- context
LONG = {**QUICKSTART_SHAPE, "rollout": {**QUICKSTART_SHAPE["rollout"], "max_response_len": 200}}


@pytest.mark.parametrize("args", EXPERIMENT_COMMANDS, ids=" ".join)
def test_a_response_ceiling_beyond_the_models_context_is_refused(tmp_path, args):
    # the built-in policy attends over 96 positions: a 200-token ceiling fails every run
    message = refused(tmp_path, args, spec_data(tmp_path, trainer=LONG), "max_response_len")
    assert "at most 95" in message


def test_a_setting_or_a_knob_level_beyond_the_context_is_refused(tmp_path):
    settings = [{"name": "short", "overrides": {}}, {"name": "long", "overrides": {"rollout.max_response_len": 200}}]
    assert "long" in refused(tmp_path, ["validate"], spec_data(tmp_path, settings=settings), "max_response_len")
    factors = ["clip_higher", {"max_response_len": [32, 200]}]
    refused(tmp_path, ["validate"], spec_data(tmp_path, factors=factors), "max_response_len")


# --------------------------------------------------------------------------------- trainer
@pytest.mark.parametrize("field", ["builtin_train_size", "num_eval_problems"])
def test_a_huge_builtin_problem_count_is_refused(tmp_path, field):
    trainer = {**QUICKSTART_SHAPE, "data": {field: 10**12}}
    refused(tmp_path, ["validate"], spec_data(tmp_path, trainer=trainer), field)


# ---------------------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("name", ["..", ".", "x" * 300, "two\nlines"])
def test_sweep_names_follow_the_experiment_names_rules(tmp_path, name):
    refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path, name=name), "`name`")


def test_a_sweep_name_too_long_for_the_file_system_is_refused(tmp_path):
    name = "é" * (os.pathconf(tmp_path, "PC_NAME_MAX") // 2 + 10)
    refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path, name=name), "`name`")


@pytest.mark.parametrize("step", [1e-11, 1e-9, 5e-324])
def test_a_grid_with_a_tiny_float_step_is_refused_before_any_list_is_built(tmp_path, step):
    space = {"eps_high": {"low": 0.28, "high": 0.4, "step": step}}
    message = refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path, space=space, sampler="grid", n_trials=None), "`space`")
    assert "grid" in message


def test_sweep_seeds_outside_the_rngs_range_are_refused(tmp_path):
    refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path, sampler={"type": "tpe", "seed": 2**32}), "sampler")
    refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path, seeds_per_trial=10**9), "seeds_per_trial")


def test_a_sweeps_stores_are_checked_like_an_experiments(tmp_path):
    (tmp_path / "out" / "mlflow.db").mkdir(parents=True)
    refused(tmp_path, ["sweep", "--dry-run"], sweep_data(tmp_path), "`tracking.uri`")


def test_grid_sizes_are_counted_without_listing_a_value():
    from dapo_ablate.sweeps.spec import build_sweep, grid_count

    # a random sweep may take a fine step; its grid is only counted (listing it would take hours)
    spec = build_sweep({"name": "fine", "trainer": QUICKSTART_SHAPE, "n_trials": 2, "sampler": "random",
                        "space": {"eps_high": {"low": 0.28, "high": 0.4, "step": 1e-11},
                                  "group_size": {"low": 2, "high": 2 * 10**9, "step": 2}}})
    # (0.4 - 0.28) / 1e-11 = 1.2e10 steps, + 1; (2 * 10^9 - 2) // 2 + 1 = 10^9 values (counts stop at 2^31 - 1)
    assert grid_count(spec.space["eps_high"]) == 12_000_000_001
    assert spec.grid_size == 12_000_000_001 * 1_000_000_000


def test_check_contexts_covers_a_sweeps_space():
    from dapo_ablate.ablation.runtime.preflight import check_contexts
    from dapo_ablate.ablation.store.errors import ExecutorError
    from dapo_ablate.sweeps.spec import build_sweep

    data = {"name": "long", "trainer": QUICKSTART_SHAPE, "n_trials": 2, "space": {"max_response_len": {"low": 32, "high": 200}}}
    with pytest.raises(ExecutorError, match=r"`space`: with max_response_len=200: .* at most 95"):
        check_contexts(build_sweep(data))
    check_contexts(build_sweep({**data, "space": {"max_response_len": {"low": 32, "high": 95}}}))


def test_a_store_file_in_a_symlink_loop_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlflow.db").symlink_to(tmp_path / "out" / "mlflow.db")
    refused(tmp_path, ["validate"], spec_data(tmp_path), "`tracking.uri`")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_store_file_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    sqlite3.connect(tmp_path / "out" / "ledger.db").close()
    (tmp_path / "out" / "ledger.db").chmod(0o444)
    refused(tmp_path, ["validate"], spec_data(tmp_path), "read-only")


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]])
def test_more_cpus_per_run_than_this_machine_has_is_refused_before_run_as_run_refuses_it(tmp_path: Path, command: list[str]):
    """validate and the dry run accepted executor.cpus_per_run=1e9, which `run` then refused."""
    from support import write_spec

    spec = write_spec(tmp_path)
    result = CliRunner().invoke(app, [command[0], str(spec), "executor.cpus_per_run=1e9", *command[1:]])
    assert result.exit_code == 2, result.output
    assert f"executor.cpus_per_run (1e+09) exceeds this machine's {os.cpu_count()} CPUs" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
