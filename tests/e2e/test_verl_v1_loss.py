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


def v1_batch(response_lens: list[int], seed: int = 0, drop: tuple[int, ...] = (), units: str | None = None) -> tuple[TensorDict, dict]:
    """A micro-batch as V1 hands it to the loss: jagged prompts, responses and per-token fields,
    the model's log-probs over whole sequences; `drop`: rows whose mask is zeroed (a reference
    batch with those responses taken out); `units`: count batch_num_tokens as the engine does once
    the trainer mode rewrote loss_mask for that loss_agg_mode (else: the kept tokens)."""
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
    if units is not None:
        kept = int(sum(m.sum() for m in verl_loss.loss_units_masks(masks, CEILING, units)))
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=kept, global_batch_size=len(response_lens) - len(drop))
    sequences = [p + r for p, r in zip(PROMPT_LENS, response_lens)]
    log_probs = jagged([-torch.rand(n, generator=g) * 3 for n in sequences])
    return data, {"log_probs": log_probs}


def loss_and_metrics(loss_mode: str, mode: str, response_lens: list[int], drop: tuple[int, ...] = ()):
    data, output = v1_batch(response_lens, drop=drop, units=mode if loss_mode == "dapo_overlong_filter" else None)
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


@pytest.fixture(scope="module")
def fresh_verl_import() -> list[str]:
    """What a fresh process with a job's environment prints (verl imported once for both tests
    below, about 20 CPU-seconds): the module of the loss named in the overrides, once ``import
    verl`` ran; whether verl's V1 trainer package was imported by then; and the trainer class the
    overrides' trainer mode names once that package is imported (as verl's TaskRunner does)."""
    import os
    import subprocess
    import sys

    from dapo_ablate.ablation.runtime.backends.verl import LOSS_MODULE, OVERLONG_FILTER_LOSS, OVERLONG_FILTER_TRAINER

    code = ("import sys, verl; v1_with_verl = 'verl.trainer.ppo.v1' in sys.modules; "
            "from verl.trainer.ppo.core_algos import get_policy_loss_fn; "
            f"print(get_policy_loss_fn({OVERLONG_FILTER_LOSS!r}).__module__); print(v1_with_verl); "
            "from verl.trainer.ppo.v1 import get_trainer_cls; "
            f"print(get_trainer_cls({OVERLONG_FILTER_TRAINER!r}).__name__)")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "VERL_USE_EXTERNAL_MODULES": LOSS_MODULE},
                            capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-3:]


def test_verl_imports_the_loss_module_named_in_the_jobs_environment(fresh_verl_import: list[str]):
    """A job's environment names our module in VERL_USE_EXTERNAL_MODULES; `import verl` imports it,
    and the name the overrides select resolves to our loss."""
    from dapo_ablate.ablation.runtime.backends.verl import LOSS_MODULE

    assert fresh_verl_import[0] == LOSS_MODULE


# --- the exact global mean across micro-batches and data-parallel ranks ---------------------------
#
# verl's FSDP engine (``forward_backward_batch``) sums a mini-batch's ``loss_mask`` over the
# data-parallel group (an all_reduce), splits the mini-batch into micro-batches, and backpropagates
# each micro-batch's ``ppo_loss``; FSDP then averages the ranks' gradients. Two ranks are emulated here
# in one process: each rank's mini-batch is V1-shaped (jagged), its ``loss_mask`` is what the trainer
# mode ``dapo_overlong_filter`` writes (`rewritten_loss_mask`), the all_reduce is the sum of both ranks'
# counts, and each micro-batch goes through verl's real ``ppo_loss`` with the non-tensor fields the
# engine sets (dp_size, batch_num_tokens, global_batch_size). The objective FSDP descends is
# (1 / dp_size) x the sum of every micro-batch loss on every rank; it must equal the built-in trainer's
# loss (``core.algorithms.clipped_policy_loss``) of the whole global mini-batch with the truncated
# responses masked, and every micro-batch must carry exactly its own kept units' share.

SMALL_CEILING = 16
RANKS = [  # response lengths per rank: truncated (= ceiling) rows spread unevenly over micro-batches
    [16, 3, 11, 16, 16, 7, 2],
    [5, 16, 9, 13, 1, 14, 16],
]
MICRO = [[2, 3, 7], [1, 5, 7]]  # jagged micro-batch ends per rank (the same count on both, as verl requires)


def rank_rows(lengths: list[int], seed: int) -> list[dict]:
    """One rank's responses: prompt, response, old log-probs, advantage (shared by the tokens), and the
    model's log-probs over the whole sequence with the response's own in the slots verl reads."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        prompt = 2 + int(torch.randint(0, 4, (1,), generator=g))
        new = -torch.rand(n, generator=g, dtype=torch.float64) * 2
        rows.append({
            "prompt": torch.randint(0, 50, (prompt,), generator=g), "response": torch.randint(0, 50, (n,), generator=g),
            "old": new + torch.randn(n, generator=g, dtype=torch.float64) * 0.4, "new": new,
            "adv": float(torch.randn(1, generator=g)),
            # log_probs[t] scores token t + 1: the response's sit at prompt - 1 .. prompt + n - 2
            "seq": torch.cat([-torch.rand(prompt - 1, dtype=torch.float64), new, torch.zeros(1, dtype=torch.float64)]),
        })
    return rows


def micro_batch(rows: list[dict], loss_masks: list[torch.Tensor], count: int, mode: str) -> tuple[TensorDict, dict]:
    def jagged(values):
        return torch.nested.nested_tensor(values, layout=torch.jagged)

    data = TensorDict({
        "prompts": jagged([r["prompt"] for r in rows]), "responses": jagged([r["response"] for r in rows]),
        "response_mask": jagged([torch.ones(len(r["response"])) for r in rows]), "loss_mask": jagged(loss_masks),
        "old_log_probs": jagged([r["old"] for r in rows]),
        "advantages": jagged([torch.full((len(r["new"]),), r["adv"], dtype=torch.float64) for r in rows]),
    }, batch_size=[len(rows)])
    tu.assign_non_tensor(data, dp_size=len(RANKS), batch_num_tokens=count, global_batch_size=sum(map(len, RANKS)))
    return data, {"log_probs": jagged([r["seq"] for r in rows])}


def global_reference(ranks: list[list[dict]], token_level: bool) -> float:
    """The built-in trainer's loss of the whole global mini-batch, truncated responses masked."""
    from dapo_ablate.core.algorithms import clipped_policy_loss

    rows = [r for rank in ranks for r in rank]
    width = max(len(r["new"]) for r in rows)

    def padded(key):
        return torch.stack([torch.nn.functional.pad(r[key], (0, width - len(r[key]))) for r in rows])

    mask = torch.stack([torch.nn.functional.pad(torch.full((len(r["new"]),), float(len(r["new"]) < SMALL_CEILING),
                                                           dtype=torch.float64), (0, width - len(r["new"]))) for r in rows])
    advantages = torch.tensor([r["adv"] for r in rows], dtype=torch.float64)
    loss, _ = clipped_policy_loss(padded("new"), padded("old"), advantages, mask, eps_low=0.2, eps_high=0.28,
                                  token_level=token_level, clip_ratio_c=3.0)
    return float(loss)


def fsdp_objective(ranks: list[list[dict]], mode: str, rewrite: bool) -> tuple[float, list[float], list[float]]:
    """(the objective FSDP descends, every micro-batch's loss, every micro-batch's expected share of the
    global sum) with loss_mask rewritten by the trainer mode (`rewrite`) or left as verl generates it."""
    from dapo_ablate.ablation.runtime.backends.verl_trainer import rewritten_loss_mask

    loss_masks = []
    for rows in ranks:
        response_mask = torch.nested.nested_tensor([torch.ones(len(r["response"])) for r in rows], layout=torch.jagged)
        loss_masks.append(list((rewritten_loss_mask(response_mask, mode) if rewrite else response_mask).unbind()))
    count = int(sum(float(m.sum()) for masks in loss_masks for m in masks))  # the engine's all_reduce
    config = actor_config("dapo_overlong_filter", mode)
    losses, shares = [], []
    for rows, masks, ends in zip(ranks, loss_masks, MICRO):
        for start, end in zip([0, *ends[:-1]], ends):
            data, output = micro_batch(rows[start:end], masks[start:end], count, mode)
            losses.append(float(verl_losses.ppo_loss(config, output, data)[0]))
            shares.append(micro_share(rows[start:end], count, mode))
    return sum(losses) / len(RANKS), losses, shares


def micro_share(rows: list[dict], count: int, mode: str) -> float:
    """A micro-batch's exact part of the global loss, times dp_size (verl's agg_loss scaling): the
    sum of its kept tokens' losses (or kept responses' token means) over the global kept count."""
    from dapo_ablate.ablation.runtime.backends.verl_loss import _clipped_per_token

    total = 0.0
    for r in rows:
        if len(r["new"]) >= SMALL_CEILING:
            continue
        per_token = _clipped_per_token(r["old"], r["new"], torch.full_like(r["new"], r["adv"]), 0.2, 0.28, 3.0)[0]
        total += float(per_token.sum() if mode == "token-mean" else per_token.mean())
    return total / count * len(RANKS)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_jagged_micro_batches_on_two_ranks_give_the_exact_global_mean(mode: str, monkeypatch):
    monkeypatch.setenv(MAX_RESPONSE_LEN_ENV, str(SMALL_CEILING))
    ranks = [rank_rows(lengths, seed) for seed, lengths in enumerate(RANKS)]
    expected = global_reference(ranks, token_level=mode == "token-mean")
    objective, losses, shares = fsdp_objective(ranks, mode, rewrite=True)
    assert objective == pytest.approx(expected, abs=1e-9)
    assert losses == pytest.approx(shares, abs=1e-9)  # each micro-batch weighs exactly its own units
    # without the trainer mode's rewrite, verl's count holds the truncated tokens: not the global mean
    unrewritten, _, _ = fsdp_objective(ranks, mode, rewrite=False)
    assert abs(unrewritten - expected) > 1e-3


def test_the_trainer_mode_is_in_verls_registry_once_verl_imports_its_v1_package(fresh_verl_import: list[str]):
    """A fresh process with the job's environment: ``import verl`` registers the loss, and importing
    verl's V1 trainer package (as verl's TaskRunner does) registers the trainer mode the overrides select."""
    assert fresh_verl_import[1:] == ["False", "OverlongFilterTrainer"]  # not imported by `import verl` alone
