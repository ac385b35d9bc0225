"""SweepSpec: canonical forms, and one-sentence errors with exit status 2 for bad sweeps."""

from __future__ import annotations

import typer
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli import sweep_cmd
from dapo_ablate.sweeps.spec import build_sweep, grid_values, load_sweep
from dapo_ablate.sweeps.study import distributions

from support import ROOT

TINY = {
    "rollout": {"eval_k": 4, "max_response_len": 32},
    "algorithm": {"group_size": 4, "overlong_cache": 8},
    "batch": {"prompts_per_step": 8, "mini_batch_size": 16},
}
SPACE = {"eps_high": {"low": 0.2, "high": 0.4}}


def sweep(**fields):
    return {"name": "s", "trainer": TINY, "space": SPACE, "n_trials": 4, **fields}


def app() -> typer.Typer:
    app = typer.Typer()
    sweep_cmd.register(app)
    return app


def test_canonical_space_types_and_defaults():
    spec = build_sweep(sweep(space={
        "algorithm.eps_high": {"low": 0.2, "high": 0.4},          # dotted name -> leaf; float from the knob
        "lr": {"low": 1e-4, "high": 1e-3, "log": True},
        "group_size": {"low": 4, "high": 8, "step": 2},            # int from the knob
        "overlong_cache": {"choices": [4, 8]},                     # categorical from choices
        "clip_higher": {"choices": [True, False]},
    }))
    assert list(spec.space) == ["eps_high", "lr", "group_size", "overlong_cache", "clip_higher"]
    assert [d.type for d in spec.space.values()] == ["float", "float", "int", "categorical", "categorical"]
    assert spec.metric == "avg@4" and spec.direction == "maximize"
    assert (spec.sampler.type, spec.pruner.type, spec.seeds_per_trial, spec.factors) == ("tpe", "median", 1, None)
    dists = distributions(spec)
    assert dists["lr"].log and dists["group_size"].step == 2 and dists["overlong_cache"].choices == (4, 8)
    assert spec.knob_paths["eps_high"] == "algorithm.eps_high"


def test_grid_defaults_n_trials_to_its_size_and_factors_are_canonical():
    spec = build_sweep(sweep(
        n_trials=None, sampler="grid",
        space={"eps_high": {"low": 0.2, "high": 0.4, "step": 0.1}, "overlong_cache": {"choices": [4, 8]}},
        factors=["CH", {"optim.lr": [1e-4, 2e-4]}],
    ))
    assert grid_values(spec.space["eps_high"]) == [0.2, 0.3, 0.4]
    assert spec.n_trials == 6 and spec.factors == ["clip_higher", {"lr": [1e-4, 2e-4]}]


def test_trainer_file_is_read_relative_to_the_sweep(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "t.yaml").write_text(yaml.safe_dump(TINY))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep(trainer="cfg/t.yaml")))
    monkeypatch.chdir(ROOT)
    assert load_sweep(tmp_path / "sweep.yaml").trainer.rollout.eval_k == 4


def test_the_example_sweep_is_valid():
    spec = load_sweep(ROOT / "examples" / "sweep.yaml")
    assert spec.trainer.model.threads == 1 and spec.n_trials >= 4


BAD = [
    ({"space": {}}, "`space`: is empty; name at least one knob"),
    ({"space": {"eps_hihg": {"low": 0.2, "high": 0.4}}}, "`space`: unknown knob 'eps_hihg'"),
    ({"space": {"eps_high": {"low": 0.4, "high": 0.3}}}, "`space.eps_high`: low (0.4) is above high (0.3); swap them"),
    ({"space": {"lr": {"low": 0.0, "high": 1e-3, "log": True}}}, "`space.lr`: a log scale needs positive bounds but low is 0.0"),
    ({"space": {"lr": {"low": -1e-3, "high": 1e-3, "log": True}}}, "a log scale needs positive bounds"),
    ({"space": {"overlong_cache": {"type": "categorical"}}}, "a categorical knob needs a non-empty list of choices"),
    ({"space": {"overlong_cache": {"choices": []}}}, "a categorical knob needs a non-empty list of choices"),
    ({"space": {"overlong_cache": {"choices": "4, 8"}}}, "choices: [4, 8, 12], got '4, 8'"),
    ({"space": ["eps_high"]}, "`space`: must be a mapping of knob -> range, got ['eps_high']"),
    ({"space": {"eps_high": {"low": "low", "high": 0.4}}}, "low 'low' is not a finite number"),
    ({"space": {"eps_high": {"low": 0.2, "high": 0.4, 1: 2}}}, "unknown key `1`"),
    ({"n_trials": "many"}, "`n_trials`: Input should be a valid integer, unable to parse string as an integer, got 'many'"),
    ({"sampler": {"type": "tpe", "seed": -1}}, "`sampler.seed`: Input should be greater than or equal to 0, got -1"),
    ({"space": {"eps_high": {"low": 0.2, "high": 0.4}}, "sampler": "grid"},
     "`space.eps_high`: the grid sampler cannot enumerate the continuous range of eps_high; give it a step or choices"),
    ({"space": {"eps_high": {"low": 0.2}}}, "`space.eps_high`: a float range needs `high`"),
    ({"space": {"group_size": {"type": "float", "low": 4, "high": 8}}}, "knob group_size takes integers; use type: int"),
    ({"space": {"group_size": {"low": 4, "high": 8.5}}}, "high 8.5 is not an integer"),
    ({"space": {"eps_high": {"low": 0.2, "high": 0.4, "lo": 1}}}, "unknown key `lo`"),
    ({"space": {"eps_high": {"low": 0.2, "high": 0.4, "log": True, "step": 0.1}}}, "a log scale cannot have a step"),
    ({"space": {"eps_high": {"low": 0.1, "high": 0.4}}}, "with eps_high at its low bound 0.1 the trainer config is invalid"),
    ({"space": {"overlong_cache": {"choices": [8, 32]}}}, "with overlong_cache at its choice 32 the trainer config is invalid"),
    ({"space": {"path": {"low": 1, "high": 2}}}, "knob path is not numeric"),
    ({"n_trials": None}, "`n_trials`: is required with sampler tpe"),
    ({"n_trials": 0}, "`n_trials`"),
    ({"space": {"overlong_cache": {"choices": [4, 8]}}, "sampler": "grid", "n_trials": 3},
     "`n_trials`: 3 trials exceed the grid's 2 points"),
    ({"metric": "avg@32"}, "`metric`: avg@32 needs rollout.eval_k = 32"),
    ({"factors": ["clip_higher", "nope"]}, "`factors`: unknown factor 'nope'"),
    ({"factors": [{"eps_high": [0.2, 0.3]}]}, "eps_high is both a factor and a searched knob"),
    ({"factors": ["OF", "CH", "SP", "TL", "DS"], "factor_design": "full"}, "factor_design full with 5 factors"),
    ({"pruner": {"type": "median", "reduction_factor": 3}}, "`pruner`: reduction_factor only applies to pruner type successive_halving"),
    ({"sampler": {"type": "random", "n_startup_trials": 3}}, "n_startup_trials only applies to sampler type tpe"),
    ({"samplr": "tpe"}, "unknown key `samplr`"),
]


def test_missing_and_invalid_yaml_files(tmp_path):
    result = CliRunner().invoke(app(), ["sweep", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "sweep file" in result.stderr and "does not exist" in result.stderr
    (tmp_path / "x.yaml").write_text("name: [")
    result = CliRunner().invoke(app(), ["sweep", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2 and "not valid YAML" in result.stderr


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    data = sweep(factors=["clip_higher"], seeds_per_trial=2, output_dir=str(tmp_path / "out"),
                 ledger=f"sqlite:///{tmp_path}/out/ledger.db", tracking={"uri": f"sqlite:///{tmp_path}/out/mlflow.db"})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app(), ["sweep", str(path), "--dry-run", "--n-trials", "6"])
    assert result.exit_code == 0, result.output
    assert "over 6 trials" in result.output and "eps_high" in result.output
    assert "per trial: 4 runs (2 cells x 2 seeds)" in result.output
    assert not (tmp_path / "out").exists()


def test_sweep_command_passes_its_options_to_run_sweep(tmp_path, monkeypatch):
    from dapo_ablate.ablation.app import sweep as app_sweep
    from dapo_ablate.sweeps import runner

    asked = {}

    def fake_run_sweep(spec, **options):
        asked.update(options, name=spec.name)
        return runner.SweepSummary(spec.name, 4, states={"COMPLETE": 4}, counted=4, best_number=2,
                                   best_value=0.5, best_params={"eps_high": 0.3})

    monkeypatch.setattr(app_sweep, "run_sweep", fake_run_sweep)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep()))
    result = CliRunner().invoke(app(), ["sweep", str(path), "--address", "ray://head:10001", "--n-trials", "9", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert asked == {"address": "ray://head:10001", "n_trials": 9, "cell_fn": None, "progress": False, "name": "s"}
    assert "s: 4/4 trials finished" in result.output and "best trial 2: avg@4 50.0 pp eps_high=0.3" in result.output


def test_report_of_a_sweep_never_run_is_one_sentence(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep(ledger=f"sqlite:///{tmp_path}/none/ledger.db")))
    result = CliRunner().invoke(app(), ["sweep-report", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no study named 's' yet" in result.stderr
    assert not (tmp_path / "none").exists()


def test_samplers_seeded_per_trial_never_replay_draws_after_a_resume():
    import optuna

    from dapo_ablate.sweeps.study import _PerTrialRandomSampler, _PerTrialTPESampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}

    def draws(make, stops):
        storage, values = optuna.storages.InMemoryStorage(), []
        for count in stops:  # each stop is a driver invocation with a freshly built sampler
            study = optuna.create_study(study_name="s", storage=storage, sampler=make(), load_if_exists=True)
            for _ in range(count):
                trial = study.ask(space)
                values.append(trial.params["x"])
                study.tell(trial, trial.params["x"])
        return values

    for make in (lambda: _PerTrialRandomSampler(seed=0), lambda: _PerTrialTPESampler(seed=0, n_startup_trials=4)):
        resumed, fresh = draws(make, [2, 2, 3]), draws(make, [7])
        assert len(set(resumed)) == 7 and resumed == fresh
    # Optuna's own samplers, rebuilt with the same seed, replay their first draws (the bug this fixes)
    plain = draws(lambda: optuna.samplers.RandomSampler(seed=0), [2, 2])
    assert plain[:2] == plain[2:]
