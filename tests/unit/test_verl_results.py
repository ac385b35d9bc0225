"""A verl cell's result is read back from the MLflow run verl logged into.

verl's training needs GPUs; what it does to MLflow is small, and is done here twice: by verl 0.9.1's
own ``verl.utils.tracking.Tracking`` in the verl environment (DAPO_VERL_PYTHON, as in .ci/run), and
by a stand-in script that does what it does without verl installed: attach to the run named by
$MLFLOW_RUN_ID with ``mlflow.start_run(run_id=...)``, log its config as params, log each step's
metrics with ``mlflow.log_metrics(metrics, step=...)`` under verl's names with ``@`` written as
``_at_``, then ``mlflow.end_run()``. Everything else is our code on a real MLflow store: `job_env`
(what a verl job's environment gets), `result_from_mlflow` and the ledger.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_verl_results_e2e.py."""

from __future__ import annotations

import pytest

from dapo_ablate.ablation.runtime.backends.verl_results import (
    IncompleteRun,
    eval_sources,
    result_from_history,
    score_name,
)


def test_verl_metric_names_and_a_history_with_two_validation_sets():
    assert score_name("val-core/math_dapo/acc/mean_at_32") == "avg@32"
    assert score_name("val-core/aime/acc/best@32/mean") == "pass@32"
    assert score_name("val-core/aime/acc/maj_at_32/mean") == "maj@32"
    assert score_name("val-core/aime/acc/best_at_32/std") is None
    assert score_name("val-aux/aime/acc/mean_at_16") is None
    assert score_name("critic/score/mean") is None
    history = {"val-core/aime/acc/mean_at_32": [(0, 0.1), (5, 0.3)], "val-core/gsm8k/acc/mean_at_32": [(0, 0.7), (5, 0.8)],
               "critic/score/mean": [(1, -0.5), (5, 0.2)]}
    with pytest.raises(ValueError, match=r"several data sources \['aime', 'gsm8k'\]"):
        result_from_history(history, wall_s=1.0)
    result = result_from_history(history, wall_s=1.0, source="aime")
    assert result["eval_curve"] == [{"step": 0, "avg@32": 0.1}, {"step": 5, "avg@32": 0.3}]
    assert result["metrics"] == {"avg@32": 0.3, "steps": 5}
    assert "tokens_generated" not in result  # no batch sizes given: no token totals made up


def test_a_data_source_with_a_slash_parses():
    # verl's own GSM8K preprocessing writes data_source "openai/gsm8k"
    assert score_name("val-core/openai/gsm8k/acc/mean_at_32") == "avg@32"
    assert score_name("val-core/openai/gsm8k/acc/best@32/mean") == "pass@32"
    assert score_name("val-core/openai/gsm8k/acc/best_at_32/std") is None
    history = {"val-core/openai/gsm8k/acc/mean_at_4": [(0, 0.1), (2, 0.4)], "critic/score/mean": [(1, 0.0), (2, 0.5)]}
    assert eval_sources(history) == ["openai/gsm8k"]
    result = result_from_history(history, wall_s=1.0, total_steps=2)
    assert result["metrics"] == {"avg@4": 0.4, "steps": 2}


def test_a_missing_final_validation_fails_the_run_instead_of_recording_an_earlier_step():
    # verl validated at steps 0 and 3 of 4; the step-4 validation write was lost, training metrics were not
    history = {"val-core/aime/acc/mean_at_32": [(0, 0.1), (3, 0.3)],
               "critic/score/mean": [(1, 0.0), (2, 0.1), (3, 0.2), (4, 0.3)]}
    with pytest.raises(IncompleteRun, match=r"no evaluation at the final step 4 \(the last one is at step 3\)"):
        result_from_history(history, wall_s=1.0, total_steps=4)
    with pytest.raises(IncompleteRun, match="final step 4"):
        result_from_history(history, wall_s=1.0)  # the schedule not given: still the last logged step
    partial = {**history, "val-core/aime/acc/mean_at_32": [(0, 0.1), (4, 0.3)],
               "val-core/aime/acc/maj_at_32/mean": [(0, 0.2)]}
    with pytest.raises(IncompleteRun, match=r"evaluation at the final step 4 lacks maj@32"):
        result_from_history(partial, wall_s=1.0, total_steps=4)
    with pytest.raises(IncompleteRun, match="ended after 4 of 5 training steps"):
        result_from_history(partial, wall_s=1.0, total_steps=5)
