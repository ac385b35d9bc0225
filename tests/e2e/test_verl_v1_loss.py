"""Overlong Filtering through verl's own V1 loss path (``verl.workers.utils.losses.ppo_loss``), on
V1-shaped batches: responses kept unpadded (jagged nested tensors) and padded per micro-batch to
the micro-batch's own longest response only.

The truncation rule must come from each response's length against the configured ceiling
(``DAPO_ABLATE_MAX_RESPONSE_LEN``, which the verl backend puts in every job's environment), not
from the padded tensor's width: a batch of untruncated 100 / 300 / 500-token responses under a
512-token ceiling keeps all three (a width rule drops the 500-token one), and a 512-token response
is dropped. Runs in the verl environment (``pytest -m verl``; .ci/run builds it).
"""

from __future__ import annotations

import pytest

from verl_env import require_verl


pytestmark = pytest.mark.verl
require_verl()

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402  (verl's dependency)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils import losses as verl_losses  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

from dapo_ablate.ablation.runtime.backends import verl_loss  # noqa: E402  (registers dapo_overlong_filter)
from dapo_ablate.ablation.runtime.backends.verl import MAX_RESPONSE_LEN_ENV  # noqa: E402
from support import HANG_GUARD_S

CEILING = 512
PROMPT_LENS = [3, 4, 5]


def actor_config(loss_mode: str, loss_agg_mode: str) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3, use_dynamic_bsz=False, rollout_n=1,
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=loss_agg_mode,
        policy_loss={"loss_mode": loss_mode},
    )


def v1_batch(response_lens: list[int], seed: int = 0, drop: tuple[int, ...] = ()) -> tuple[TensorDict, dict]:
    """A micro-batch as V1 hands it to the loss: jagged prompts, responses and per-token fields,
    the model's log-probs over whole sequences; `drop`: rows whose mask is zeroed (a reference
    batch with those responses taken out)."""
    g = torch.Generator().manual_seed(seed)

    def jagged(rows):
        return torch.nested.nested_tensor(rows, layout=torch.jagged)

    masks = [torch.zeros(n) if i in drop else torch.ones(n) for i, n in enumerate(response_lens)]
    data = TensorDict({
        "prompts": jagged([torch.randint(0, 50, (n,), generator=g) for n in PROMPT_LENS]),
        "responses": jagged([torch.randint(0, 50, (n,), generator=g) for n in response_lens]),
        "response_mask": jagged(masks),
        "old_log_probs": jagged([-torch.rand(n, generator=g) * 3 for n in response_lens]),
        "advantages": jagged([torch.full((n,), a) for n, a in zip(response_lens, [1.0, -0.5, 0.7])]),
    }, batch_size=[len(response_lens)])
    kept = int(sum(m.sum() for m in masks))
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=kept, global_batch_size=len(response_lens) - len(drop))
    sequences = [p + r for p, r in zip(PROMPT_LENS, response_lens)]
    log_probs = jagged([-torch.rand(n, generator=g) * 3 for n in sequences])
    return data, {"log_probs": log_probs}


def loss_and_metrics(loss_mode: str, mode: str, response_lens: list[int], drop: tuple[int, ...] = ()):
    data, output = v1_batch(response_lens, drop=drop)
    loss, metrics = verl_losses.ppo_loss(actor_config(loss_mode, mode), output, data)
    return float(loss), {name: metric.values[0] for name, metric in metrics.items() if hasattr(metric, "values")}


@pytest.fixture(autouse=True)
def ceiling(monkeypatch):
    monkeypatch.setenv(MAX_RESPONSE_LEN_ENV, str(CEILING))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_untruncated_responses_are_all_kept_though_the_longest_fills_the_micro_batch(mode: str):
    ours, metrics = loss_and_metrics("dapo_overlong_filter", mode, [100, 300, 500])
    vanilla, _ = loss_and_metrics("vanilla", mode, [100, 300, 500])
    assert metrics["actor/overlong_filtered_frac"] == 0.0
    assert ours == pytest.approx(vanilla, abs=1e-6)  # nothing was dropped
    without_longest, _ = loss_and_metrics("vanilla", mode, [100, 300, 500], drop=(2,))
    assert abs(ours - without_longest) > 1e-4  # what the width rule computed: the 500-token response dropped


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_a_response_at_the_ceiling_is_dropped_from_the_loss_and_its_denominator(mode: str):
    ours, metrics = loss_and_metrics("dapo_overlong_filter", mode, [100, 300, CEILING])
    assert metrics["actor/overlong_filtered_frac"] == pytest.approx(1 / 3)
    reference, _ = loss_and_metrics("vanilla", mode, [100, 300, CEILING], drop=(2,))
    assert ours == pytest.approx(reference, abs=1e-6)


def test_without_the_ceiling_in_the_environment_the_loss_refuses_to_guess(monkeypatch):
    monkeypatch.delenv(MAX_RESPONSE_LEN_ENV)
    with pytest.raises(RuntimeError, match=MAX_RESPONSE_LEN_ENV):
        loss_and_metrics("dapo_overlong_filter", "token-mean", [100, 300, 500])


def test_the_loss_module_and_the_translation_name_the_same_variable():
    assert verl_loss.MAX_RESPONSE_LEN_ENV == MAX_RESPONSE_LEN_ENV


def test_verl_imports_the_loss_module_named_in_the_jobs_environment():
    """A job's environment names our module in VERL_USE_EXTERNAL_MODULES; `import verl` imports it,
    and the name the overrides select resolves to our loss."""
    import os
    import subprocess
    import sys

    from dapo_ablate.ablation.runtime.backends.verl import LOSS_MODULE, OVERLONG_FILTER_LOSS

    code = ("import verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn; "
            f"print(get_policy_loss_fn({OVERLONG_FILTER_LOSS!r}).__module__)")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "VERL_USE_EXTERNAL_MODULES": LOSS_MODULE},
                            capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == LOSS_MODULE
