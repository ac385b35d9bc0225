"""The worked example's specs (examples/predict_small.yaml, examples/confirm_large.yaml) validate,
describe the two built-in model sizes as their settings, and the confirm spec's look policy
watches exactly the two named terms (confirm mode), not every term."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dapo_ablate.ablation.app.adaptive import SequentialLooks, confirm_watch, look_policy
from dapo_ablate.ablation.app.errors import UserError
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.reports.predictions import FORMAT, write_predictions

from support import ROOT

FILES = ("predict_small.yaml", "confirm_large.yaml", "dapo_cpu.yaml", "dapo_cpu_large.yaml")


def _prediction(term: str, direction: str, estimate: float) -> dict:
    return {"statistic": "interaction" if ":" in term else "main", "term": term, "direction": direction,
            "estimate": estimate, "ci_low": estimate - 0.02, "ci_high": estimate + 0.02, "se": 0.01, "df": 8.0,
            "from_setting": {"name": "dapo-small", "model_family": "builtin", "model_size": "small"}, "for_setting": {}}


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    folder = tmp_path / "examples"
    folder.mkdir()
    for name in FILES:
        shutil.copy(ROOT / "examples" / name, folder / name)
    return folder


def test_the_two_sizes_are_the_settings(examples: Path):
    small, large = load_spec(examples / "predict_small.yaml"), load_spec(examples / "confirm_large.yaml")
    (info_small,), (info_large,) = small.setting_infos(), large.setting_infos()
    assert (info_small.model_family, info_small.model_size, info_small.task) == ("builtin", "small", "addition")
    assert (info_large.model_family, info_large.model_size, info_large.task) == ("builtin", "large", "addition")
    assert small.factor_names == large.factor_names and large.design == "adaptive"
    assert small.trainer.model_copy(update={"model": large.trainer.model}) == large.trainer  # only the size differs


def test_the_confirm_spec_watches_the_named_terms_only(examples: Path):
    spec = load_spec(examples / "confirm_large.yaml")
    with pytest.raises(UserError, match=r"confirm\.predictions .*report-small/predictions\.yaml.*cannot read it"):
        confirm_watch(spec)  # before predict_small's report has written it
    target = examples.parent / "dapo-runs" / "report-small" / "predictions.yaml"
    target.parent.mkdir(parents=True)
    write_predictions(target, {"format": FORMAT, "metric": "avg@32", "confidence": 0.95, "predictions": [
        _prediction("soft_overlong", "negative", -0.05), _prediction("dynamic_sampling", "zero", 0.01),
        _prediction("soft_overlong:dynamic_sampling", "positive", 0.03)]})  # fmt: skip
    confirm = confirm_watch(spec)
    assert [p["term"] for p in confirm["predicted"]] == ["soft_overlong", "dynamic_sampling"]
    assert [p["direction"] for p in confirm["predicted"]] == ["negative", "zero"]
    assert confirm["margin"] == pytest.approx(0.02) and confirm["setting"] == "dapo-large"
    policy = look_policy(spec)
    assert isinstance(policy, SequentialLooks)
    assert policy.settings.watch == ("soft_overlong", "dynamic_sampling")  # confirm mode: not every term
    # without confirm.terms the default is every main effect and interaction predicted away from zero
    default = spec.model_copy(update={"confirm": spec.confirm.model_copy(update={"terms": None})})
    assert [p["term"] for p in confirm_watch(default)["predicted"]] == ["soft_overlong", "soft_overlong:dynamic_sampling"]
    wrong = spec.model_copy(update={"confirm": spec.confirm.model_copy(update={"terms": ["clip_higher"]})})
    with pytest.raises(UserError, match="confirm.terms: 'clip_higher' is not a main effect or two-factor interaction"):
        confirm_watch(wrong)
