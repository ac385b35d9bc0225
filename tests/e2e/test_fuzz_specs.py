"""Fuzzing what a user writes: experiment specs, command-line overrides, sweep specs and trainer
configs (tests/e2e/test_fuzz_strategies.py has the strategies and the property).

Each example goes through the entry point the command line uses (`validate`, `run --dry-run` and
`sweep --dry-run` through typer's CliRunner; for `train`, the app functions its command calls before
training: `load_config` and `check_inputs`), in a fresh folder that is also the working directory.
The property: success, or exit 2 with one sentence naming the file or the field; never a traceback
or another exception, never a hang; and nothing written anywhere (these commands write nothing).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from hypothesis import event, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from dapo_ablate.ablation.app import train as train_app
from dapo_ablate.ablation.app.errors import UserError
from dapo_ablate.ablation.experiment.adaptive_spec import AdaptiveSpec
from dapo_ablate.ablation.experiment.spec import ExperimentSpec
from dapo_ablate.cli.main import app
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.sweeps.spec import Dimension, SweepSpec

from test_fuzz_strategies import (
    FUZZ,
    PATH_FIELDS,
    RAW_YAML,
    RELATIVE,
    TEXTS,
    TRAINER_PATHS,
    VALUES,
    files_under,
    hang_guard,
    model_paths,
    mutations,
    one_sentence_or_success,
    set_dotted,
    typed_values,
)
from tiny_configs import QUICKSTART_SHAPE


SPEC_PATHS = model_paths(ExperimentSpec) + model_paths(AdaptiveSpec, "adaptive.") + ["settings"]
SWEEP_PATHS = (model_paths(SweepSpec) + [f"space.eps_high.{name}" for name in Dimension.model_fields]
               + ["space.lr", "space.overlong_cache.choices", "space.algorithm.group_size"])  # fmt: skip
SPEC_TYPED = {**typed_values(ExperimentSpec), **typed_values(AdaptiveSpec, "adaptive.")}
SWEEP_TYPED = {**typed_values(SweepSpec), **typed_values(Dimension, "space.eps_high.")}
TRAINER_TYPED = typed_values(TrainerConfig)
FIELD_NAMES = tuple(sorted(set(SPEC_PATHS) | set(SWEEP_PATHS)))
"""A sentence that does not name the file names one of these fields (`executor.address`, `seeds`)."""
TRAINER_PLACES = {"data.train", "data.eval", "model.path"}
"""A trainer's files: fuzzed with relative names (see PATH_FIELDS)."""
PATH_FIELDS.update(TRAINER_PLACES | {f"trainer.{place}" for place in TRAINER_PLACES})


@contextmanager
def fresh_folder() -> Iterator[Path]:
    """A new empty folder, the working directory inside the block (relative stores land in it)."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="dapo-fuzz-") as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(before)


def spec_text(base: dict, changes: list[tuple[str, Any]], raw: tuple[str, str] | None, unicode: bool) -> str:
    """``base`` with ``changes`` as YAML (as a dumper writes it), then ``raw`` YAML text for one field."""
    data = yaml.safe_load(yaml.safe_dump(base))
    for path, value in changes:
        set_dotted(data, path, value)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=unicode)
    if raw is not None:
        field, value = raw
        text += f"{field}: {value}\n"  # a later key wins in PyYAML: this field now holds the raw text
    return text


def experiment(out: str = "out") -> dict:
    return {"name": "fuzz", "trainer": QUICKSTART_SHAPE, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
            "output_dir": out, "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}}  # fmt: skip


def sweep() -> dict:
    return {"name": "fuzz", "trainer": QUICKSTART_SHAPE, "space": {"eps_high": {"low": 0.2, "high": 0.4}}, "n_trials": 4,
            "output_dir": "out", "ledger": "sqlite:///out/ledger.db", "tracking": {"uri": "sqlite:///out/mlflow.db"}}  # fmt: skip


def check_command(args: list[str], path: Path, root: Path) -> None:
    """The property for one command line: success or one sentence, and nothing written under ``root``."""
    before = files_under(root)
    with hang_guard():
        result = CliRunner().invoke(app, args)
    event(f"exit {result.exit_code}")  # --hypothesis-show-statistics: how many got through
    one_sentence_or_success(result, (str(path), path.name, "override", *FIELD_NAMES))
    assert files_under(root) == before, "the command wrote files"


def sometimes(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """None three times in four, else a draw of ``strategy`` (raw YAML breaks most files it enters)."""
    return st.one_of(st.none(), st.none(), st.none(), strategy)


TOP_FIELDS = st.sampled_from(list(ExperimentSpec.model_fields))
COMMANDS = st.sampled_from([["validate"], ["run", "--dry-run"]])


@FUZZ
@given(changes=mutations(SPEC_PATHS, SPEC_TYPED), raw=sometimes(st.tuples(TOP_FIELDS, RAW_YAML)), unicode=st.booleans(),
       command=COMMANDS)  # fmt: skip
def test_a_fuzzed_experiment_spec_is_planned_or_refused_in_one_sentence(changes, raw, unicode, command):
    with fresh_folder() as root:
        path = root / "spec.yaml"
        path.write_text(spec_text(experiment(), changes, raw, unicode), encoding="utf-8")
        check_command([command[0], str(path), *command[1:]], path, root)


def override_value(value: Any) -> str:
    """A value as a user would type it after `=`: YAML flow text (or the text itself)."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


KNOWN_VALUE = st.sampled_from(sorted(SPEC_TYPED)).flatmap(lambda key: SPEC_TYPED[key].map(lambda value: (key, value)))
OVERRIDE = st.one_of(
    KNOWN_VALUE.map(lambda item: f"{item[0]}={override_value(item[1])}"),
    KNOWN_VALUE.map(lambda item: f"{item[0]}={override_value(item[1])}"),
    st.builds(lambda key, value: f"{key}={override_value(value)}", st.sampled_from(SPEC_PATHS) | TEXTS, VALUES | RAW_YAML),
    st.builds(lambda key, value: f"{key}={value}", st.sampled_from(sorted(PATH_FIELDS)), RELATIVE),
    TEXTS,  # no `=` at all
).filter(lambda item: not item.startswith("-"))  # a leading '-' is an option to the command line itself


@FUZZ
@given(overrides=st.lists(OVERRIDE, min_size=1, max_size=4), command=COMMANDS)
def test_fuzzed_overrides_are_applied_or_refused_in_one_sentence(overrides, command):
    with fresh_folder() as root:
        path = root / "spec.yaml"
        path.write_text(yaml.safe_dump(experiment()))
        check_command([command[0], str(path), *overrides, *command[1:]], path, root)


@FUZZ
@given(changes=mutations(SWEEP_PATHS, SWEEP_TYPED), raw=sometimes(st.tuples(st.sampled_from(list(SweepSpec.model_fields)), RAW_YAML)),
       unicode=st.booleans())  # fmt: skip
def test_a_fuzzed_sweep_spec_is_planned_or_refused_in_one_sentence(changes, raw, unicode):
    with fresh_folder() as root:
        path = root / "sweep.yaml"
        path.write_text(spec_text(sweep(), changes, raw, unicode), encoding="utf-8")
        check_command(["sweep", str(path), "--dry-run"], path, root)


TRAINER_OVERRIDE = st.builds(
    lambda key, value: f"{key}={override_value(value)}", st.sampled_from(TRAINER_PATHS) | TEXTS, VALUES | RAW_YAML
)


@FUZZ
@given(changes=mutations(TRAINER_PATHS, TRAINER_TYPED), raw=sometimes(st.tuples(st.sampled_from(TRAINER_PATHS), RAW_YAML)),
       overrides=st.lists(TRAINER_OVERRIDE, max_size=2), unicode=st.booleans())  # fmt: skip
def test_a_fuzzed_trainer_config_is_built_or_refused_in_one_sentence(changes, raw, overrides, unicode):
    """`train`'s checks before it trains: the config file with its overrides, then the files it names."""
    with fresh_folder() as root:
        path = root / "trainer.yaml"
        path.write_text(spec_text(QUICKSTART_SHAPE, changes, raw, unicode), encoding="utf-8")
        before = files_under(root)
        with hang_guard():
            try:
                train_app.check_inputs(train_app.load_config(path, overrides))
                event("built")
            except UserError as err:
                event("refused")
                message = str(err)
                assert "\n" not in message and message.strip() == message, message
                assert any(name in message for name in (str(path), "`", "override", *TRAINER_PATHS)), message
        assert files_under(root) == before


def test_a_sweep_ranges_unknown_key_is_echoed_as_the_trainer_configs_are():
    """sweeps/spec.py shows an unknown key through core/config_errors.shown_key: on one line, cut."""
    from dapo_ablate.ablation.experiment.spec import SpecError
    from dapo_ablate.sweeps.spec import build_sweep

    for key, shown in (("lo\nw", "'lo\\nw'"), ("k" * 80, "'" + "k" * 56 + "..."), ("lo", "lo")):
        data = {**sweep(), "space": {"eps_high": {"low": 0.2, "high": 0.4, key: 1}}}
        try:
            build_sweep(data)
        except SpecError as error:
            assert f"unknown key `{shown}`; use type, low, high" in str(error) and "\n" not in str(error)
        else:
            raise AssertionError(f"{key!r} was accepted")
