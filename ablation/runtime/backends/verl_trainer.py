"""Overlong Filtering's global count for verl's V1 trainer: the trainer mode ``dapo_overlong_filter``.

verl's V1 engine divides every micro-batch's loss by one number counted before it splits a
mini-batch into micro-batches: the sum of the mini-batch's ``loss_mask`` over all data-parallel
ranks (``batch_num_tokens``). That makes verl's own aggregation an exact global mean, but only of
what ``loss_mask`` marks, and verl sets it to the whole ``response_mask`` when a response is
generated. This trainer is verl's synchronous V1 trainer (``trainer.v1.trainer_mode=sync``) with one
step added before each actor update: every response's ``loss_mask`` in TransferQueue is rewritten to
the Overlong Filtering loss's units (``verl_loss.loss_units_masks``: kept tokens, or one mark per
kept response). verl reads ``loss_mask`` for nothing else in the update (the loss itself, the
entropy and the KL term read ``response_mask``, which stays as generated); the rewrite costs one
TransferQueue read and write of a [responses, length] mask per step.

The translation selects this mode together with the loss (``backends.verl``); the trainer refuses
to start with any other policy loss, so the rewritten count never reaches a loss that does not
expect it. verl finds the mode by name in its trainer registry, where importing this module puts it
(``verl_loss`` imports it once verl has imported ``verl.trainer.ppo.v1``).
"""

from __future__ import annotations

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from dapo_ablate.ablation.runtime.backends.verl_loss import LOSS_NAME, loss_units_masks, response_ceiling

TRAINER_MODE = LOSS_NAME


def rewritten_loss_mask(response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """A jagged [responses, j] ``response_mask`` (as TransferQueue holds it) -> the jagged
    ``loss_mask`` whose sum is the loss's global divisor."""
    masks = loss_units_masks(list(response_mask.unbind()), response_ceiling(), loss_agg_mode)
    return torch.nested.as_nested_tensor(masks, layout=torch.jagged)


@register_trainer(TRAINER_MODE)
class OverlongFilterTrainer(PPOTrainerSync):
    """verl's sync V1 trainer; before each actor update, ``loss_mask`` = the loss's units."""

    def __init__(self, config, *args, **kwargs):
        loss_mode = config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla")
        if loss_mode != LOSS_NAME:
            raise ValueError(f"trainer.v1.trainer_mode={TRAINER_MODE} rewrites loss_mask for the {LOSS_NAME} loss only; "
                             f"set actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME} or trainer_mode=sync")
        super().__init__(config, *args, **kwargs)

    def _update_actor(self, batch, metrics):
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        loss_mask = rewritten_loss_mask(data["response_mask"], self.config.actor_rollout_ref.actor.loss_agg_mode)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"loss_mask": loss_mask}, batch_size=len(batch)))
        return super()._update_actor(batch, metrics)
