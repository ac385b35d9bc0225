"""One RL step: the built-in trainer vs TRL's GRPOTrainer, same model, batch and algorithm.

    pip install -e ".[bench]"          # TRL, for this benchmark only
    python benchmarks/vs_trl.py [--steps 4] [--threads 1] [--micro 64]

Both train the built-in 0.3M policy on the built-in task: 64 prompts x 8 responses per step, a
32-token ceiling, temperature 1.0 and top-p 1.0, one optimizer update per step (one mini-batch of
all 512 responses), DAPO's loss (token-level, clip 0.2 / 0.28), Overlong Filtering (truncated
responses masked), the soft overlong penalty (8-token cache), no KL, dynamic sampling off (TRL has
none), AdamW at lr 5e-4, one thread. TRL: GRPOTrainer(loss_type="dapo", epsilon_high=0.28,
mask_truncated_completions=True, reward = correctness + trl.rewards.get_soft_overlong_punishment).
The built-in trainer uses its default HF engine.

Both accumulate the one update's gradient over micro-batches of `--micro` responses (the
built-in trainer: batch.micro_batch_size, length-sorted, so each micro-batch pays only for its own
widest response; TRL: per_device_train_batch_size = micro with gradient_accumulation_steps =
512 / micro, its generation still one batch of 512). `--micro 512` runs the whole batch at once.

A step is timed from the start of generation to the end of the optimizer update (TRL: from its
on_step_begin to on_step_end callbacks, which hold its generation, scoring and update). The first
step of each is a warm-up; the figure is the median of the following `--steps - 1` steps, in wall
time and in process CPU time (time.process_time; on a shared machine the wall time also counts
waiting for a core, the CPU time does not). The two run one after the other in one process; the
ratios TRL / built-in are printed on the last line.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from dapo_ablate.core.config import load_trainer_config
from dapo_ablate.core.policy import BuiltinRecipe, builtin_checkpoint
from dapo_ablate.core.tasks import generate_problems
from dapo_ablate.core.trainer import _setup, _train_step
from dapo_ablate.core.verifier import Verifier

PROMPTS, G, MAX_NEW, CACHE, LR = 64, 8, 32, 8, 5e-4


def builtin_config(steps: int, threads: int, micro: int = 64):
    """examples/dapo_cpu.yaml with the benchmark's shared settings (dynamic sampling off, one update)."""
    cfg = load_trainer_config(Path(__file__).resolve().parent.parent / "examples" / "dapo_cpu.yaml")
    return cfg.with_overrides({
        "techniques.dynamic_sampling": False, "model.threads": threads, "rollout.top_p": 1.0,
        "rollout.temperature": 1.0, "rollout.max_response_len": MAX_NEW, "algorithm.group_size": G,
        "algorithm.overlong_cache": CACHE, "algorithm.eps_low": 0.2, "algorithm.eps_high": 0.28,
        "batch.prompts_per_step": PROMPTS, "batch.mini_batch_size": PROMPTS * G, "batch.epochs": 1,
        "batch.micro_batch_size": micro, "optim.lr": LR, "optim.warmup_steps": 0, "schedule.total_steps": steps,
    })


def time_builtin(steps: int, threads: int, micro: int) -> tuple[list[float], list[float]]:
    run = _setup(builtin_config(steps, threads, micro), None)
    times, cpu = [], []
    for step in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        signals = _train_step(run, step)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        print(f"built-in step {step}: {times[-1]:.2f} s, cpu {cpu[-1]:.2f} s (rollout {signals['time_rollout_s']:.2f}, "
              f"update {signals['time_update_s']:.2f}, mean length {signals['response_length']:.1f}, "
              f"torch threads {torch.get_num_threads()})")
        if signals.get("updates") != 1.0:
            raise SystemExit(f"built-in step {step} made {signals.get('updates')} optimizer updates, expected 1")
    return times, cpu


def time_trl(steps: int, threads: int, micro: int, out_dir: str) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    torch.set_num_threads(threads)
    path = str(builtin_checkpoint(BuiltinRecipe()))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    problems = generate_problems(PROMPTS * steps, seed=0)
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
    verifier = Verifier(method="auto")

    def correctness(completions, answer, completion_ids, **_):
        # truncated responses count as wrong, as in the built-in trainer
        eos = tokenizer.eos_token_id
        ok = verifier(completions, answer)
        return [1.0 if (eos in ids and good) else -1.0 for good, ids in zip(ok, completion_ids)]

    args = GRPOConfig(
        output_dir=out_dir, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        per_device_train_batch_size=micro, gradient_accumulation_steps=PROMPTS * G // micro,
        num_iterations=1, num_generations=G, max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0,
        top_k=0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, mask_truncated_completions=True,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_steps=steps,
        seed=0, dataloader_num_workers=0, shuffle_dataset=False, disable_tqdm=True,
    )
    times: list[float] = []
    cpu: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)
            print(f"TRL step {len(times)}: {times[-1]:.2f} s, cpu {cpu[-1]:.2f} s, torch threads {torch.get_num_threads()}")

    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=dataset,
        reward_funcs=[correctness, get_soft_overlong_punishment(MAX_NEW, CACHE)], callbacks=[StepTimer()],
    )
    trainer.train()
    if len(times) != steps:
        raise SystemExit(f"TRL ran {len(times)} optimizer steps, expected {steps}")
    return times, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro", type=int, default=64, help=f"responses per micro-batch, a divisor of {PROMPTS * G}")
    ap.add_argument("--out", default="/tmp/vs_trl")
    args = ap.parse_args()
    if args.steps < 1 or args.micro < 1 or (PROMPTS * G) % args.micro:
        raise SystemExit(f"--steps must be >= 1 and --micro a divisor of {PROMPTS * G}; got {args.steps} and {args.micro}")
    ours, ours_cpu = time_builtin(args.steps, args.threads, args.micro)
    theirs, theirs_cpu = time_trl(args.steps, args.threads, args.micro, args.out)

    def med(xs: list[float]) -> float:
        return statistics.median(xs[1:] or xs)

    a, b, ac, bc = med(ours), med(theirs), med(ours_cpu), med(theirs_cpu)
    print(f"one RL step (64 prompts x 8, 32-token ceiling, micro-batch {args.micro}, {args.threads} thread(s), "
          f"median of steps 2-{args.steps}): built-in {a:.2f} s (cpu {ac:.2f}), TRL GRPOTrainer {b:.2f} s "
          f"(cpu {bc:.2f}); ratio {b / a:.2f}x wall, {bc / ac:.2f}x cpu")


if __name__ == "__main__":
    main()
