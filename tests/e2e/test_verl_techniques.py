"""Each technique changes what verl computes, in the configs the product composes for the paper's cells.

The 32 cells of examples/paper_verl.yaml are translated by the product (``backends.verl.verl_overrides``
and ``job_env``) and composed into verl 0.9.1's own Hydra config (``ppo_trainer``); verl's own code
then runs on small fixed batches in this process (no Ray, no model, no training job):

- the actor update's loss path, as verl's V1 trainer and FSDP engine drive it for one mini-batch on
  one rank in one micro-batch: the trainer mode the config names, taken from verl's trainer registry
  (verl's ``sync``, or the product's ``dapo_overlong_filter``) and built on the config (its own checks
  run), its ``_update_actor`` run against an in-memory stand-in for TransferQueue (verl's constructor
  and its own update, which would start the workers, are stubbed out); the engine's count of
  ``loss_mask``; verl's ``ppo_loss`` with the actor config verl builds from the composed one and the
  policy loss its registry returns for it (``vanilla``, or the product's, imported as verl imports
  the modules the job's environment names), under the job's environment; backpropagated to the
  response tokens' log-probs. (Micro-batches and data-parallel ranks: tests/e2e/test_verl_v1_loss.py.
  No model runs: the log-probs are given.)
- the reward manager verl loads from the composed config (``load_reward_manager``: ``dapo``, scoring
  with verl's ``math_dapo`` rule, the paper data's source), on responses written with the CPU tests'
  character tokenizer.

What each technique must change, in every cell against the cell that differs from it only there
(Dynamic Sampling, which acts on the rollouts, is seen in verl's eviction metric in test_verl_real.py):

- Clip-Higher: verl's ``actor/pg_clipfrac`` (verl 0.9.1 logs no separate upper-clip fraction; the
  batch's negative-advantage tokens are clipped alike either way) falls from 7/12 to 4/12, and
  positive-advantage tokens whose ratio (1.24) lies between 1 + eps_low and 1 + eps_high get a gradient
  only with it on.
- Token-Level Loss: each token's weight in verl's loss (its log-prob's gradient over -advantage, at
  ratio 1) is 1 / (tokens in the batch) with it on, and 1 / (responses x its response's tokens) off;
  the two losses differ.
- Soft Overlong Punishment: verl's reward is the score plus the product's own ``soft_overlong_penalty``
  (``core.algorithms``, with the cell's max_response_len, overlong_cache and penalty factor) in every
  cell with it on, so a response past max_response_len - overlong_cache is rewarded less than the same
  answer shorter, right or wrong; the score alone with it off.
- Overlong Filtering: a response at max_response_len gets no gradient and is out of the loss and of
  its divisor (the loss and the kept tokens' gradients equal those of the same cell without Overlong
  Filtering on the batch without that response); with it off, every token of that response gets a
  gradient and the loss differs.

And why ``algorithm.kl_coef`` > 0 is refused with Overlong Filtering: verl's ``ppo_loss`` adds its KL
term over every response token, the truncated ones' included, divided by the kept tokens.

Each assertion fails when the product's mapping of that technique breaks (checked by breaking
``backends.verl._decided_overrides`` or ``job_env`` one technique at a time).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from verl_env import require_verl


pytestmark = pytest.mark.verl
require_verl()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402  (verl's dependency)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils import losses as verl_losses  # noqa: E402

from dapo_ablate.ablation.runtime.backends.verl import MAX_RESPONSE_LEN_ENV, job_env  # noqa: E402
from dapo_ablate.core.algorithms import soft_overlong_penalty  # noqa: E402
from dapo_ablate.core.config import TrainerConfig  # noqa: E402
from dapo_ablate.core.contracts import TECHNIQUES  # noqa: E402

from test_verl_compose import paper_cells  # noqa: E402

VERL_CONFIG_DIR = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"
DATA_SOURCE = "math_dapo"  # DAPO-Math-17k's data_source in verl's format (examples/paper_verl.yaml's data)
PROMPT_LEN = 3


@dataclass
class Cell:
    config: TrainerConfig
    verl: DictConfig
    """verl's config as the job composes it from the cell's overrides (interpolations resolved on access)."""
    actor: object
    """verl's actor config built from it (FSDPActorConfig), as verl's workers build it."""
    env: dict[str, str]
    """The job's environment (``job_env``)."""
    loss_inputs: tuple[str, ...] = ()
    """What verl's actor loss path reads of the cell: the actor config, the trainer mode, the job's
    environment. Cells alike there share one computation of a batch (`actor_update`)."""

    @property
    def key(self) -> tuple[bool, ...]:
        return tuple(getattr(self.config.techniques, name) for name in TECHNIQUES)

    def on(self, technique: str) -> bool:
        return getattr(self.config.techniques, technique)


@pytest.fixture(scope="module")
def cells() -> dict[tuple[bool, ...], Cell]:
    """The paper's 32 cells in verl's config. Hydra composes verl's ``ppo_trainer`` once and applies each
    cell's overrides to a copy with its own override code (what ``compose`` does after loading the
    defaults, which takes ~0.35 s of CPU a cell here); one cell composed whole must give the same config."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs

    translated = paper_cells()
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        base = compose(config_name="ppo_trainer")
        whole = compose(config_name="ppo_trainer", overrides=translated[-1][1])
    parser = OverridesParser.create()
    found = {}
    for config, overrides in translated:
        composed = copy.deepcopy(base)
        ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(overrides), composed)
        if overrides is translated[-1][1]:
            assert OmegaConf.to_yaml(composed) == OmegaConf.to_yaml(whole)
        env = job_env(config, "sqlite:///unused.db")
        import_external_libs(env["VERL_USE_EXTERNAL_MODULES"].split(","))  # what `import verl` does in the job
        actor = omega_conf_to_dataclass(composed.actor_rollout_ref.actor)
        cell = Cell(config, composed, actor, env, (repr(actor), composed.trainer.v1.trainer_mode, repr(sorted(env.items()))))
        found[cell.key] = cell
    assert len(found) == 32
    return found


def partner(cells: dict, cell: Cell, technique: str) -> Cell:
    """The cell that differs from `cell` only in `technique`."""
    key = list(cell.key)
    key[TECHNIQUES.index(technique)] = not key[TECHNIQUES.index(technique)]
    return cells[tuple(key)]


# --- verl's actor update on one mini-batch ----------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One response: its advantage and each token's ratio new / old probability (one float: all tokens)."""

    length: int
    advantage: float
    ratios: tuple[float, ...] | float = 1.0


@dataclass
class Update:
    loss: float
    grads: list[torch.Tensor]
    """d loss / d log-prob of each response's tokens."""
    metrics: dict[str, float]


class InMemoryTransferQueue:
    """TransferQueue's ``kv_batch_get`` / ``kv_batch_put`` over the fields of one batch."""

    def __init__(self, fields: dict[str, torch.Tensor]):
        self.fields = dict(fields)

    def kv_batch_get(self, keys, partition_id, select_fields):
        return TensorDict({name: self.fields[name] for name in select_fields}, batch_size=[len(keys)])

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields.items()))


def jagged(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(values, layout=torch.jagged)  # keeps autograd, unlike nested_tensor


def loss_mask_at_update(cell: Cell, response_mask: torch.Tensor) -> torch.Tensor:
    """The ``loss_mask`` verl's actor update reads: verl's agent loop stores it as the response mask;
    the trainer mode the config names (verl's registry) is built on the config (its own checks run;
    verl's base constructor, which would start the workers, only keeps the config) and runs its
    ``_update_actor`` on the batch; verl's own update (stubbed: it would dispatch to the workers)
    reads the field."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from dapo_ablate.ablation.runtime.backends import verl_trainer

    trainer_cls = get_trainer_cls(cell.verl.trainer.v1.trainer_mode)
    with mock.patch.object(PPOTrainer, "__init__", lambda self, config: setattr(self, "config", config)):
        trainer = trainer_cls(config=cell.verl)  # as verl's TaskRunner builds it
    store = InMemoryTransferQueue({"response_mask": response_mask, "loss_mask": response_mask})
    seen = []

    def verl_update(self, batch, metrics):
        seen.append(store.fields["loss_mask"])
        return batch

    n = response_mask.size(0)
    batch = KVBatchMeta(keys=[f"r{i}" for i in range(n)], tags=[{} for _ in range(n)], partition_id="train")
    with mock.patch.object(PPOTrainer, "_update_actor", verl_update), mock.patch.object(verl_trainer, "tq", store):
        trainer._update_actor(batch, {})
    assert len(seen) == 1, "verl's own actor update did not run exactly once"
    return seen[0]


UPDATES: dict[tuple, Update] = {}


def actor_update(cell: Cell, rows: list[Row], seed: int = 0, reference_shift: float | None = None) -> Update:
    """verl's V1 loss on `rows` as one mini-batch on one rank (one micro-batch): the engine's count of
    the trainer mode's ``loss_mask`` (``batch_num_tokens``), global_batch_size = the responses (verl's
    trainer: ppo_mini_batch_size x rollout.n), verl's ``ppo_loss``, both under the job's environment.
    `reference_shift`: the reference policy's log-probs are the old ones plus this (for a KL term).
    Computed once for cells whose loss inputs are the same (`Cell.loss_inputs`)."""
    key = (cell.loss_inputs, tuple(rows), seed, reference_shift)
    if key not in UPDATES:
        UPDATES[key] = _actor_update(cell, rows, seed, reference_shift)
    return UPDATES[key]


def _actor_update(cell: Cell, rows: list[Row], seed: int, reference_shift: float | None) -> Update:
    g = torch.Generator().manual_seed(seed)
    news, olds, sequences = [], [], []
    for row in rows:
        old = -torch.rand(row.length, generator=g, dtype=torch.float64) * 2
        ratios = torch.as_tensor(row.ratios, dtype=torch.float64).expand(row.length)
        new = (old + ratios.log()).requires_grad_()
        news.append(new)
        olds.append(old)
        # log_probs[t] scores token t + 1: the response's sit at PROMPT_LEN - 1 .. PROMPT_LEN + length - 2
        sequences.append(torch.cat([-torch.rand(PROMPT_LEN - 1, generator=g, dtype=torch.float64), new,
                                    torch.zeros(1, dtype=torch.float64)]))
    response_mask = jagged([torch.ones(row.length) for row in rows])
    with mock.patch.dict(os.environ, cell.env):  # the job's environment: the trainer mode and the loss read it
        loss_mask = loss_mask_at_update(cell, response_mask)
    data = TensorDict({
        "prompts": jagged([torch.randint(0, 50, (PROMPT_LEN,), generator=g) for _ in rows]),
        "responses": jagged([torch.randint(0, 50, (row.length,), generator=g) for row in rows]),
        "response_mask": response_mask, "loss_mask": loss_mask, "old_log_probs": jagged(olds),
        "advantages": jagged([torch.full((row.length,), row.advantage, dtype=torch.float64) for row in rows]),
    }, batch_size=[len(rows)])
    if reference_shift is not None:
        data["ref_log_prob"] = jagged([old + reference_shift for old in olds])
    count = int(sum(float(mask.sum()) for mask in loss_mask.unbind()))  # the engine's all_reduce, one rank
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=count, global_batch_size=len(rows))
    with mock.patch.dict(os.environ, cell.env):
        loss, metrics = verl_losses.ppo_loss(cell.actor, {"log_probs": jagged(sequences)}, data)
    loss.backward()
    values = {name: float(metric.values[0]) for name, metric in metrics.items() if hasattr(metric, "values")}
    return Update(loss.item(), [new.grad if new.grad is not None else torch.zeros_like(new) for new in news], values)


def on_off(cells: dict, technique: str):
    """(cell with `technique` on, the same cell with it off), for each of the 16 pairs."""
    return [(cell, partner(cells, cell, technique)) for cell in cells.values() if cell.on(technique)]


# --- Clip-Higher ----------------------------------------------------------------------------------

CLIP_ROWS = [  # 12 tokens; eps_low 0.2, eps_high 0.28 in the paper's spec
    Row(4, 1.0, (1.1, 1.24, 1.24, 1.35)),
    Row(2, 1.0, (1.24, 1.5)),
    Row(3, -1.0, (0.7, 1.24, 0.9)),
    Row(3, -1.0, (0.75, 1.0, 1.1)),
]


def clipped_share(rows: list[Row], eps_low: float, eps_high: float) -> float:
    """The tokens PPO's clip holds: ratio above 1 + eps_high with A > 0, below 1 - eps_low with A < 0."""
    flags = [(r > 1 + eps_high) if row.advantage > 0 else (r < 1 - eps_low) for row in rows for r in row.ratios]
    return sum(flags) / len(flags)


def test_clip_higher_lowers_verls_clip_fraction_and_lets_tokens_between_the_bounds_move(cells):
    between = [(i, j) for i, row in enumerate(CLIP_ROWS) for j, r in enumerate(row.ratios) if row.advantage > 0 and r == 1.24]
    assert len(between) == 3
    for with_ch, without in on_off(cells, "clip_higher"):
        algo = with_ch.config.algorithm
        on, off = actor_update(with_ch, CLIP_ROWS), actor_update(without, CLIP_ROWS)
        assert on.metrics["actor/pg_clipfrac"] == pytest.approx(clipped_share(CLIP_ROWS, algo.eps_low, algo.eps_high)) == 4 / 12
        assert off.metrics["actor/pg_clipfrac"] == pytest.approx(clipped_share(CLIP_ROWS, algo.eps_low, algo.eps_low)) == 7 / 12
        assert all(on.grads[i][j] != 0 and off.grads[i][j] == 0 for i, j in between), (with_ch.key, on.grads, off.grads)
        assert on.loss < off.loss  # the unclipped tokens' ratios above 1.2 now count: a larger objective


# --- Token-Level Loss -----------------------------------------------------------------------------

AGGREGATION_ROWS = [Row(2, 1.0), Row(6, -0.5)]  # ratio 1: each token's loss is -advantage, its gradient -advantage x weight


def token_weights(update: Update, rows: list[Row]) -> list[list[float]]:
    return [[round(float(g) / -row.advantage, 12) for g in grads] for grads, row in zip(update.grads, rows)]


def test_token_level_loss_weighs_every_token_alike_and_without_it_every_response(cells):
    tokens, responses = sum(r.length for r in AGGREGATION_ROWS), len(AGGREGATION_ROWS)
    per_token = [[round(1 / tokens, 12)] * r.length for r in AGGREGATION_ROWS]  # 1/8 each
    per_response = [[round(1 / (responses * r.length), 12)] * r.length for r in AGGREGATION_ROWS]  # 1/4, 1/12
    for with_tl, without in on_off(cells, "token_level_loss"):
        on, off = actor_update(with_tl, AGGREGATION_ROWS), actor_update(without, AGGREGATION_ROWS)
        assert token_weights(on, AGGREGATION_ROWS) == per_token, with_tl.key
        assert token_weights(off, AGGREGATION_ROWS) == per_response, without.key
        assert on.loss == pytest.approx((-1.0 * 2 + 0.5 * 6) / 8) and off.loss == pytest.approx((-1.0 + 0.5) / 2)


# --- Overlong Filtering ---------------------------------------------------------------------------

def filter_rows(ceiling: int) -> list[Row]:
    """Two responses below the ceiling and one at it (truncated), ratios inside the clip bounds."""
    return [Row(3, 1.0, (1.05, 0.97, 1.1)), Row(ceiling, 0.5, 1.08), Row(5, -1.0, (0.95, 1.02, 1.1, 0.9, 1.0))]


def test_overlong_filtering_takes_truncated_responses_out_of_verls_loss_and_its_divisor(cells):
    for with_of, without in on_off(cells, "overlong_filter"):
        ceiling = with_of.config.rollout.max_response_len
        assert with_of.env[MAX_RESPONSE_LEN_ENV] == str(ceiling)
        rows = filter_rows(ceiling)
        kept = [rows[0], rows[2]]
        on, off = actor_update(with_of, rows), actor_update(without, rows)
        reference = actor_update(without, kept)  # the same cell without Overlong Filtering, the truncated response left out
        assert not on.grads[1].any() and bool(off.grads[1].ne(0).all()), with_of.key
        assert on.loss == pytest.approx(reference.loss, abs=1e-12), with_of.key
        for got, expected in zip([on.grads[0], on.grads[2]], reference.grads):
            assert torch.allclose(got, expected, atol=1e-15, rtol=1e-12), with_of.key
        assert abs(off.loss - reference.loss) > 1e-3
        assert on.metrics["actor/overlong_filtered_frac"] == pytest.approx(1 / 3)
        assert "actor/overlong_filtered_frac" not in off.metrics


# --- Soft Overlong Punishment ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from verl_cpu.fixtures import write_tokenizer

    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def rewards(cell: Cell, tokenizer, responses: list[list[int]], ground_truth: str) -> list[float]:
    """verl's reward of each response: the reward manager verl loads from the cell's config, run as
    verl's reward loop runs it (``run_single`` on one response, right-padded)."""
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    manager = load_reward_manager(cell.verl, tokenizer)
    assert type(manager).__name__ == "DAPORewardManager"
    prompt = torch.tensor([tokenizer.encode("q") * PROMPT_LEN])
    width = max(map(len, responses))
    found = []
    for ids in responses:
        response = torch.full((1, width), tokenizer.pad_token_id)
        response[0, :len(ids)] = torch.tensor(ids)
        mask = torch.cat([torch.ones(1, PROMPT_LEN), (torch.arange(width) < len(ids)).float().unsqueeze(0)], dim=1)
        data = DataProto.from_dict(
            tensors={"prompts": prompt, "responses": response, "attention_mask": mask.long()},
            non_tensors={"data_source": np.array([DATA_SOURCE], dtype=object),
                         "reward_model": np.array([{"ground_truth": ground_truth}], dtype=object)},
        )
        found.append(manager.loop.run_until_complete(manager.run_single(data))["reward_score"])
    return [float(r) for r in found]


def answer(tokenizer, length: int, value: str) -> list[int]:
    """A response of exactly `length` tokens ending in ``answer: <value>`` (math_dapo reads the last line)."""
    tail = tokenizer.encode(f"\nanswer: {value}")
    return tokenizer.encode("x") * (length - len(tail)) + tail


def test_soft_overlong_punishment_lowers_verls_reward_of_over_long_responses_in_every_cell_with_it(cells, tokenizer):
    some = next(iter(cells.values())).config
    ceiling, cache = some.rollout.max_response_len, some.algorithm.overlong_cache
    lengths = [32, ceiling - cache, ceiling - cache // 2, ceiling]  # short, at the ramp's start, halfway, at the ceiling
    responses = {value: [answer(tokenizer, n, value) for n in lengths] for value in ("7", "8")}
    assert all(len(ids) == n for ids, n in zip(responses["7"], lengths))
    for cell in cells.values():
        algo = cell.config.algorithm
        penalty = [0.0] * len(lengths)
        if cell.on("soft_overlong"):
            penalty = soft_overlong_penalty(torch.tensor(lengths), cell.config.rollout.max_response_len, algo.overlong_cache,
                                            algo.overlong_penalty_factor).tolist()
        for value, score in (("7", 1.0), ("8", -1.0)):  # right and wrong
            got = rewards(cell, tokenizer, responses[value], "7")
            assert got == pytest.approx([score + p for p in penalty], abs=1e-6), (cell.key, value, got)
        if cell.on("soft_overlong"):
            assert penalty[0] == penalty[1] == 0 and penalty[2] < 0 and math.isclose(penalty[3], -algo.overlong_penalty_factor)


def test_a_kl_term_would_keep_truncated_tokens_in_verls_loss_so_the_translation_refuses_it(cells):
    """Why ``algorithm.kl_coef`` > 0 is refused with Overlong Filtering (``check_translatable``):
    verl's ``ppo_loss`` adds the KL term itself, over the response mask (a truncated response's tokens
    included), and with token-mean divides it by the engine's count, which the trainer mode made the
    kept tokens. Shown with the refusal bypassed: the cell's own verl config with verl's KL loss on."""
    from verl.trainer.ppo.core_algos import kl_penalty
    from verl.utils.config import omega_conf_to_dataclass

    from dapo_ablate.ablation.runtime.backends.verl import VerlTranslationError, verl_overrides

    cell = next(c for c in cells.values() if c.on("overlong_filter") and c.on("token_level_loss"))
    with pytest.raises(VerlTranslationError, match="kl_coef"):
        verl_overrides(cell.config.with_overrides({"algorithm.kl_coef": 0.001}))
    composed = copy.deepcopy(cell.verl)
    OmegaConf.update(composed, "actor_rollout_ref.actor.use_kl_loss", True)
    OmegaConf.update(composed, "actor_rollout_ref.actor.kl_loss_coef", 0.001)
    actor = omega_conf_to_dataclass(composed.actor_rollout_ref.actor)
    with_kl = Cell(cell.config, composed, actor, cell.env, (repr(actor), *cell.loss_inputs[1:]))
    ceiling = cell.config.rollout.max_response_len
    rows = [Row(3, 0.0), Row(ceiling, 0.0), Row(5, 0.0)]  # no advantage: every gradient is the KL term's
    update = actor_update(with_kl, rows, reference_shift=0.3)
    assert bool(update.grads[1].ne(0).all())  # the truncated response is trained on, through the KL term
    kl_sum = sum(float(kl_penalty(torch.zeros(r.length), torch.full((r.length,), 0.3), "low_var_kl").sum()) for r in rows)
    assert update.loss == pytest.approx(0.001 * kl_sum / (3 + 5), rel=1e-6)  # every token's KL over the kept tokens
