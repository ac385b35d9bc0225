"""``python -m dapo_ablate.core.build_policy SIZE TASK WARMUP_STEPS THREADS``: build one built-in
policy into the cache, its progress on stdout. `dapo-ablate run` starts it before Ray for a policy
that neither ships nor is cached, so the build shows on the console instead of in a Ray job's log;
it builds exactly what a run would (the same recipe, CPU kernels pinned as a run pins them, the
run's thread count)."""

from __future__ import annotations

import sys

from .config import ModelConfig
from .numerics import pin_cpu_numerics
from .policy import builtin_checkpoint, builtin_recipe


def main(argv: list[str] | None = None) -> None:
    size, task, steps, threads = argv if argv is not None else sys.argv[1:]
    pin_cpu_numerics()
    import torch

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its shard-writing bar: noise beside the build's own lines
    if int(threads) > 0:
        torch.set_num_threads(int(threads))
    model = ModelConfig(builtin_size=size, builtin_warmup_steps=int(steps))
    folder = builtin_checkpoint(builtin_recipe(model, task), log=lambda line: print(line, flush=True))
    print(f"built-in policy ready: {folder}", flush=True)


if __name__ == "__main__":
    main()
