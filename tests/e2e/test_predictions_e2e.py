"""The slower cases of tests/unit/test_predictions.py (simulated experiments by the hundred): in this
tree so the fast tier stays near a minute."""

from __future__ import annotations

import pandas as pd

from dapo_ablate.core.contracts import SettingInfo
from dapo_ablate.reports import write_report
from dapo_ablate.reports.simulate import simulate_settings

from test_predictions import FACTORS, _null_verdicts, _report  # noqa: F401, F811 - shared with the fast part


def test_null_terms_are_contradicted_below_the_stated_rate():
    verdicts = [v for seed in range(60) for v in _null_verdicts(seed)]  # 60 pairs x 5 terms
    contradicted = verdicts.count("contradicted") / len(verdicts)
    assert contradicted <= 0.025  # at most alpha / 2 per term (alpha 5%)
    assert set(verdicts) <= {"confirmed", "inconclusive", "contradicted"}
    assert verdicts.count("confirmed") > 0.5 * len(verdicts)  # mostly confirmed nulls within +-2 pp at this noise


def test_predictions_are_confirmed_in_every_setting_of_a_transfer_study(tmp_path):
    first = _report(tmp_path, "first", {("clip_higher",): 0.05}, seed=3)
    results = simulate_settings(FACTORS, 0.4, {"a": {("clip_higher",): 0.05}, "b": {("clip_higher",): -0.05}},
                                rng=4, seeds=3, noise_sd=0.01)
    out = tmp_path / "transfer"
    infos = (SettingInfo("a", model_type="base"), SettingInfo("b", model_type="instruct"))
    written = write_report(results, FACTORS, out, formats=["csv"], settings=infos,
                           predictions=str(first / "predictions.yaml"))
    assert {"confirmation.csv", "prediction_ranks.csv", "predictions.yaml", "settings.csv"} <= set(written)
    table = pd.read_csv(out / "confirmation.csv")
    clip = table[(table["statistic"] == "main") & (table["term"] == "clip_higher")].set_index("setting")["verdict"]
    assert clip.to_dict() == {"a": "confirmed", "b": "contradicted"}
    settings = pd.read_csv(out / "settings.csv")
    assert list(settings["model_type"]) == ["base", "instruct"]
