"""ExperimentSpec: loading, defaults, canonical forms, and one-sentence errors naming the field."""

import os
from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.experiment.spec import (
    DEFAULT_LEDGER,
    DEFAULT_TRACKING_URI,
    ExperimentSpec,
    SpecError,
    build_spec,
    load_spec,
)
from dapo_ablate.core.config import TECHNIQUES, ConfigError, TrainerConfig, build_trainer_config

from tiny_configs import QUICKSTART_SHAPE


# The CPU quickstart's scale: 64 prompts x 8 samples, a 32-token ceiling, eval_k = 8.
TINY = QUICKSTART_SHAPE


def spec_dict(**fields):
    return {"name": "tiny", "trainer": TINY, **fields}


def write_yaml(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults():
    spec = build_spec(spec_dict())
    assert spec.factors == list(TECHNIQUES)  # the paper's order
    assert spec.design == "full" and spec.orderings == "paper"
    assert spec.seeds == [0]
    assert spec.metric == "avg@8"  # avg@k of the trainer's eval_k (avg@32 with the paper's)
    assert build_spec({"name": "paper", "trainer": {}}).metric == "avg@32"
    assert spec.ledger == DEFAULT_LEDGER == "sqlite:///dapo-runs/ledger.db"
    assert spec.tracking.uri == DEFAULT_TRACKING_URI == "sqlite:///dapo-runs/mlflow.db"
    assert spec.output_dir == "dapo-runs"
    ex = spec.executor
    assert (ex.address, ex.cpus_per_run, ex.gpus_per_run, ex.max_concurrent, ex.retries, ex.lease_s) == (
        None, 1.0, 0.0, None, 1, 120.0,
    )
    assert isinstance(spec.trainer, TrainerConfig) and spec.trainer.rollout.eval_k == 8


def test_load_spec_reads_a_trainer_file_relative_to_the_spec(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    write_yaml(folder / "cfg" / "trainer.yaml", TINY)
    path = write_yaml(folder / "factorial.yaml", spec_dict(trainer="cfg/trainer.yaml", seeds=2))
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    spec = load_spec(path)
    assert spec.trainer == TrainerConfig(**TINY)
    assert spec.seeds == [0, 1]


def test_canonical_factors_seeds_and_orderings():
    spec = build_spec(
        spec_dict(
            factors=["OF", "clip_higher", {"algorithm.eps_high": [0.2, "0.28"]}, {"max_response_len": ["32", 64]}],
            design="cumulative",
            orderings=[["CH", "overlong_filter", "eps_high", "rollout.max_response_len"]],
            seeds=[3, 1],
        )
    )
    assert spec.factors == ["overlong_filter", "clip_higher", {"eps_high": [0.2, 0.28]}, {"max_response_len": [32, 64]}]
    assert spec.factor_names == ["overlong_filter", "clip_higher", "eps_high", "max_response_len"]
    assert spec.orderings == [["clip_higher", "overlong_filter", "eps_high", "max_response_len"]]
    assert spec.seeds == [3, 1]


def test_file_knob_levels_resolve_relative_to_the_spec(tmp_path, monkeypatch):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"prompt": "1+1", "answer": "2"}\n')
    path = write_yaml(tmp_path / "factorial.yaml", spec_dict(factors=[{"train": ["a.jsonl", "b.jsonl"]}]))
    monkeypatch.chdir("/")
    spec = load_spec(path)
    assert spec.factors == [{"train": [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]}]


def test_knob_levels_are_checked_together():
    # eps_low = 0.3 alone is invalid against the base eps_high 0.28, but every cell here pairs it with eps_high >= 0.3
    spec = build_spec(spec_dict(factors=[{"eps_low": [0.2, 0.3]}, {"eps_high": [0.3, 0.4]}]))
    assert spec.factor_names == ["eps_low", "eps_high"]
    with pytest.raises(SpecError, match=r"eps_low=0.3, eps_high=0.25"):
        build_spec(spec_dict(factors=[{"eps_low": [0.2, 0.3]}, {"eps_high": [0.25, 0.28]}]))


def test_to_dict_round_trips_and_digest_tracks_content():
    spec = build_spec(spec_dict(factors=["clip_higher", {"eps_high": [0.2, 0.28]}], seeds=2, design="one_at_a_time"))
    again = build_spec(spec.to_dict())
    assert again == spec and again.digest() == spec.digest()
    assert build_spec(spec_dict(seeds=3)).digest() != build_spec(spec_dict(seeds=2)).digest()
    assert isinstance(ExperimentSpec.model_validate(spec.to_dict()), ExperimentSpec)


def test_fractional_and_cumulative_options_are_accepted():
    assert build_spec(spec_dict(design="fractional", resolution="IV")).resolution == 4
    assert build_spec(spec_dict(design="fractional", generators=["E=-ABCD"])).generators == ["E=-ABCD"]
    assert build_spec(spec_dict(design="cumulative", orderings="all")).orderings == "all"


# Each case: spec fields -> words the single-sentence error must contain (the field among them).
BAD_SPECS = [
    ({"bogus": 1}, ["unknown key `bogus`"]),
    ({"ledger": "memory://"}, ["`ledger`", "one process", "sqlite:///"]),
    ({"executor": {"cpus": 2}}, ["unknown key `executor.cpus`"]),
    ({"trainer": {**TINY, "optim": {"lrr": 1}}}, ["unknown key `trainer.optim.lrr`"]),
    ({"trainer": {**TINY, "rollout": {"eval_k": 8, "max_response_len": 4}}}, ["`trainer`", "overlong_cache"]),
    ({"trainer": "missing.yaml"}, ["`trainer`", "missing.yaml", "does not exist"]),
    ({"name": ""}, ["`name`"]),
    ({"factors": ["foo"]}, ["`factors`", "unknown factor 'foo'", "eps_high"]),
    ({"factors": []}, ["`factors`", "empty"]),
    ({"factors": "clip_higher"}, ["`factors`", "list", "got 'clip_higher'"]),
    ({"factors": ["clip_higher", "CH"]}, ["`factors`", "clip_higher is listed twice"]),
    ({"factors": ["eps_high"]}, ["`factors`", "eps_high is a knob", "[low, high]"]),
    ({"factors": [{"no_such_knob": [1, 2]}]}, ["`factors`", "unknown knob 'no_such_knob'"]),
    ({"factors": [{"clip_higher": [False, True]}]}, ["`factors`", "clip_higher is a technique"]),
    ({"factors": [{"eps_high": [0.2, 0.24, 0.28]}]}, ["`factors`", "exactly two levels"]),
    ({"factors": [{"eps_high": [0.28, 0.28]}]}, ["`factors`", "same value 0.28"]),
    ({"factors": [{"eps_high": [0.1, 0.28]}]}, ["`factors`", "eps_high at its low level 0.1", "eps_low"]),
    ({"factors": [{"eps_high": [0.2, "wide"]}]}, ["`factors`", "high level 'wide'"]),
    ({"seeds": 0}, ["`seeds`", "0 is below 1"]),
    ({"seeds": -2}, ["`seeds`", "-2 is below 1"]),
    ({"seeds": []}, ["`seeds`", "empty"]),
    ({"seeds": [0, 1, 0]}, ["`seeds`", "seed 0 is listed twice"]),
    ({"seeds": [0, "a"]}, ["`seeds`", "must list integer seeds, got 'a'"]),
    ({"seeds": "three"}, ["`seeds`", "must be a count or a list of integer seeds, got 'three'"]),
    ({"seeds": True}, ["`seeds`", "got True"]),
    ({"seeds": "x" * 10_000}, ["`seeds`", "got 'xxxx", "...;"]),
    ({"name": ["a", "b"]}, ["`name`", "valid string, got ['a', 'b']"]),
    ({"executor": {"max_concurrent": "two"}}, ["`executor.max_concurrent`", "got 'two'"]),
    ({"executor": {"lease_s": -1}}, ["`executor.lease_s`", "greater than 0, got -1"]),
    ({"trainer": {**TINY, "schedule": {"total_steps": "many"}}}, ["`trainer.schedule.total_steps`", "got 'many'"]),
    ({"design": "random"}, ["`design`", "got 'random'"]),
    ({"design": "fractional", "factors": ["clip_higher", "dynamic_sampling"]}, ["`design`", "at least 3 factors (got 2)", "design: full"]),
    ({"design": "fractional", "factors": list(TECHNIQUES[:4]), "resolution": 5}, ["`design`", "resolution V", "the best is IV"]),
    ({"design": "fractional", "resolution": 2}, ["`resolution`", "below III"]),
    ({"design": "fractional", "generators": ["E=AB=C"]}, ["`generators`", "E=AB=C", "form"]),
    ({"design": "fractional", "generators": ["F=ABCD"]}, ["`generators`", "names F", "A..E"]),
    ({"design": "fractional", "generators": ["E=A"]}, ["`generators`", "resolution II"]),
    ({"design": "fractional", "generators": ["D=AB", "E=AC"], "resolution": 4}, ["`generators`", "resolution III", "below the requested IV"]),
    ({"resolution": 4}, ["`resolution`", "design: fractional"]),
    ({"orderings": "all"}, ["`orderings`", "design: cumulative"]),
    ({"design": "cumulative", "orderings": [["OF", "CH", "SP", "TL", "XX"]]}, ["`orderings`", "orderings[0] names 'XX'", "not among the factors"]),
    ({"design": "cumulative", "orderings": [["OF", "CH", "SP", "TL"]]}, ["`orderings`", "leaves out dynamic_sampling"]),
    ({"design": "cumulative", "orderings": [["OF", "CH", "SP", "TL", "DS"], list(TECHNIQUES)]}, ["`orderings`", "orderings[1] repeats orderings[0]"]),
    ({"design": "cumulative", "orderings": "some"}, ["`orderings`", "`paper`, `all`", "got 'some'"]),
    ({"metric": "avg@32"}, ["`metric`", "eval_k = 8", "avg@8"]),
    ({"metric": "mean"}, ["`metric`", "avg@k"]),
    ({"executor": {"max_concurrent": 0}}, ["`executor.max_concurrent`"]),
    ({"factors": list(TECHNIQUES) + [{n: [a, b]} for n, a, b in [
        ("lr", 1e-6, 2e-6), ("warmup_steps", 0, 20), ("weight_decay", 0.0, 0.1), ("kl_coef", 0.0, 0.1),
        ("eval_top_p", 0.7, 1.0), ("temperature", 0.9, 1.0), ("top_p", 0.9, 1.0), ("eval_temperature", 0.9, 1.0)]]},
     ["`factors`", "13 factors", "at most 12"]),
]


@pytest.mark.parametrize("fields, words", BAD_SPECS)
def test_bad_spec_gets_one_sentence_naming_the_field(tmp_path, fields, words):
    path = write_yaml(tmp_path / "factorial.yaml", spec_dict(**fields))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path)) or "missing.yaml" in message
    for word in words:
        assert word in message, message


def test_missing_name_and_trainer_are_required(tmp_path):
    with pytest.raises(SpecError, match=r"`name` is required; add it"):
        build_spec({"trainer": TINY}, source="x.yaml")
    with pytest.raises(SpecError, match=r"`trainer` is required; add it"):
        build_spec({"name": "x"}, source="x.yaml")


def test_missing_or_broken_spec_file(tmp_path):
    with pytest.raises(SpecError, match=r"^spec file .*nope.yaml' does not exist; check the path$"):
        load_spec(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_spec(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(listing)


def test_trainer_file_errors_name_the_trainer_file(tmp_path):
    write_yaml(tmp_path / "trainer.yaml", {**TINY, "optim": {"lr": -1}})
    path = write_yaml(tmp_path / "factorial.yaml", spec_dict(trainer="trainer.yaml"))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).startswith(str(tmp_path / "trainer.yaml")) and "`optim.lr`" in str(err.value)


@pytest.mark.parametrize("fields, sentence", [
    ({"factorz": ["clip_higher"]}, "unknown key `factorz`; did you mean `factors`?"),
    ({"executor": {"max_concurent": 1}}, "unknown key `executor.max_concurent`; did you mean `executor.max_concurrent`?"),
    ({"trainer": {"algorithm": {"eps_hihg": 0.3}}}, "unknown key `trainer.algorithm.eps_hihg`; did you mean `trainer.algorithm.eps_high`?"),
    ({"trainer": {"algorithm": {"zzz_unrelated": 1}}}, "unknown key `trainer.algorithm.zzz_unrelated`; remove it or check its spelling"),
])
def test_an_unknown_key_gets_the_closest_documented_one(tmp_path, fields, sentence):
    data = {"name": "x", "trainer": {}, "factors": ["clip_higher"], **fields}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert sentence in str(caught.value) and "\n" not in str(caught.value)


def test_an_unknown_trainer_key_in_a_config_file_gets_the_closest_one():
    with pytest.raises(ConfigError, match=r"unknown key `rollout.temprature`; did you mean `rollout.temperature`\?"):
        build_trainer_config({"rollout": {"temprature": 0.7}})


def test_more_factors_than_a_report_analyses_are_refused():
    knobs = [{"temperature": [0.9, 1.0]}, {"top_p": [0.9, 1.0]}, {"eps_low": [0.1, 0.2]}, {"kl_coef": [0.0, 0.1]},
             {"lr": [1e-6, 2e-6]}, {"warmup_steps": [0, 5]}, {"weight_decay": [0.0, 0.1]}, {"grad_clip": [1.0, 2.0]}]
    with pytest.raises(SpecError) as err:  # 13 factors: a fraction would plan them, no report could read them
        build_spec({"name": "x", "trainer": {}, "design": "fractional", "factors": [*TECHNIQUES, *knobs]})
    assert "`factors`" in str(err.value) and "at most 12" in str(err.value) and "\n" not in str(err.value)


def test_relative_paths_in_a_spec_file_are_read_from_its_folder_wherever_the_command_runs(tmp_path, monkeypatch):
    """One rule: `trainer`, a SQLite ledger and tracking store, the artifact location and output_dir
    (and their defaults) resolve against the spec file's folder, so `validate ../proj/spec.yaml`
    from another folder finds the same runs."""
    project = tmp_path / "proj" / "specs"
    project.mkdir(parents=True)
    (project / "trainer.yaml").write_text(yaml.safe_dump({"schedule": {"total_steps": 3}}))
    spec_file = project / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({
        "name": "rel", "trainer": "trainer.yaml", "factors": ["clip_higher"],
        "ledger": "sqlite:///../runs/ledger.db", "tracking": {"uri": "sqlite:///../runs/mlflow.db", "artifact_location": "art"},
        "output_dir": "../runs"}))
    seen = []
    for where in (tmp_path, project, tmp_path / "proj"):
        monkeypatch.chdir(where)
        spec = load_spec(os.path.relpath(spec_file, where))
        seen.append((spec.ledger, spec.tracking.uri, spec.tracking.artifact_location, spec.output_dir))
        assert spec.trainer.schedule.total_steps == 3
    assert seen[0] == seen[1] == seen[2] == (
        f"sqlite:///{tmp_path / 'proj' / 'runs' / 'ledger.db'}", f"sqlite:///{tmp_path / 'proj' / 'runs' / 'mlflow.db'}",
        str(project / "art"), str(tmp_path / "proj" / "runs"))
    spec_file.write_text(yaml.safe_dump({"name": "rel", "trainer": "trainer.yaml", "factors": ["clip_higher"]}))
    monkeypatch.chdir(tmp_path)
    spec = load_spec(spec_file)  # the defaults follow the same rule
    assert (spec.ledger, spec.output_dir) == (f"sqlite:///{project / 'dapo-runs' / 'ledger.db'}", str(project / "dapo-runs"))
    built = build_spec({"name": "code", "trainer": {}, "factors": ["clip_higher"]})  # built in code: relative to the current folder
    assert built.ledger == "sqlite:///dapo-runs/ledger.db"
