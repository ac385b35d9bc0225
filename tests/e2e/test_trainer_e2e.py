"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_trainer.py
describes; its docstring says what they check."""

import json
import subprocess
import sys

import pytest
import torch

from dapo_ablate.core.config import TrainerConfig, load_trainer_config
from dapo_ablate.core.trainer import train

from test_trainer import ROOT, TINY  # noqa: F401, F811 - shared with the fast part


class Crash(RuntimeError):
    pass


def crash_after(step_to_crash: int):
    def callback(kind, step, data):
        if kind == "step" and step == step_to_crash:
            raise Crash(step)

    return callback


def test_same_config_same_result_and_resume_matches_uninterrupted(tmp_path):
    config = TrainerConfig(**TINY)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]  # noqa: E731
    a = train(config, tmp_path / "a")
    b = train(config, tmp_path / "b")
    assert strip(a.signals) == strip(b.signals) and strip(a.eval) == strip(b.eval)
    # the crash hits during step 3, after step 2's checkpoint and before step 3's
    with pytest.raises(Crash):
        train(config, tmp_path / "c", callbacks=[crash_after(3)])
    assert torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=True)["result"]["steps"] == 2
    seen = []
    c = train(config, tmp_path / "c", callbacks=[lambda kind, step, data: seen.append(step) if kind == "step" else None])
    assert seen == [3, 4]  # resumed after step 2, not restarted
    assert strip(c.signals) == strip(a.signals)
    assert strip(c.eval) == strip(a.eval)
    assert (c.tokens_generated, c.tokens_discarded) == (a.tokens_generated, a.tokens_discarded)
    assert (tmp_path / "c" / "result.json").is_file()


def test_cli_train_writes_result_json(tmp_path):
    cfg = tmp_path / "c.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump({**TINY, "schedule": {"total_steps": 1, "eval_every": 0}}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "dapo_ablate.cli.main", "train", str(cfg), "--out", str(out),
                           "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "result.json").read_text())
    for key in ("eval", "signals", "tokens_generated", "tokens_discarded", "wall_s"):
        assert key in data
    assert {"step", "avg@4", "pass@4", "maj@4"} <= set(data["eval"][0])


@pytest.mark.slow
def test_quickstart_config_learns(tmp_path):
    """examples/dapo_cpu.yaml raises held-out avg@32 by at least 0.10 (the bar the quickstart is held to)."""
    config = load_trainer_config(ROOT / "examples" / "dapo_cpu.yaml")
    result = train(config, tmp_path)
    first, last = result.eval[0]["avg@32"], result.eval[-1]["avg@32"]
    assert 0.10 <= first <= 0.60
    assert last - first >= 0.10, (first, last)


def test_compute_columns_leave_out_the_shared_one_off_work(tmp_path):
    """wall_s counts the steps and their evaluations; loading the policy and the (cached) step-0
    evaluation are recorded apart, so a run that found the cache warm is not cheaper on paper."""
    config = TrainerConfig(**{**TINY, "schedule": {"total_steps": 1, "eval_every": 0}})
    cold = train(config, eval_cache_dir=tmp_path)
    warm = train(config, eval_cache_dir=tmp_path)
    for r in (cold, warm):
        assert r.setup_s > 0 and r.initial_eval_s > 0 and r.wall_s > 0
    assert cold.eval[0] == {**warm.eval[0], "time_eval_s": cold.eval[0]["time_eval_s"]}
    assert cold.eval_tokens == warm.eval_tokens and cold.eval_problems == 8
