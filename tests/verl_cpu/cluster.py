"""A Ray head for real verl cells and the spec that runs them through ``dapo-ablate run`` (test
support, shared by tests/e2e/test_verl_real.py and benchmarks/gpu_smoke_verl.py).

`start_head` starts ``ray start --head`` with every port it would otherwise take from a fixed
default chosen free (other Ray clusters may run on the machine) and GPUs real or fake; `verl_spec`
writes an experiment spec of small verl cells (the factor Dynamic Sampling, in one or two settings)
and the tiny model, data and reward of `fixtures` it names: 2 steps of 8 prompts x 4 responses of
at most 24 tokens, the reward of ``char_reward.py``, and on CPU the overrides of
`fixtures.CPU_OVERRIDES` through ``trainer.verl.overrides`` (the product's escape hatch for a
cluster's own settings).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent
SOURCE = "verl_cpu_chars"  # fixtures.DATA_SOURCE
OTHERS = ("overlong_filter", "clip_higher", "soft_overlong", "token_level_loss")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_head(root: Path, env: dict[str, str], gpus: int = 1) -> tuple[str, str]:
    """`ray start --head` (16 CPUs, `gpus` GPUs: on CPU fake ones, verl's resource pool asks for
    GPUs) in ``root/ray``; returns (GCS address, Job API address) once it is up."""
    port, dashboard = free_port(), free_port()
    subprocess.run(
        [str(BIN / "ray"), "start", "--head", "--num-cpus=16", f"--num-gpus={gpus}", f"--temp-dir={root / 'ray'}",
         f"--port={port}", "--node-ip-address=127.0.0.1", f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
         f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}", "--disable-usage-stats"],
        env=env, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    return f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}"


def verl_spec(folder: Path, address: str, *, cpu: bool = True, settings: bool = True, run_timeout_s: float = 1500,
              extra: list[str] | None = None, techniques: dict[str, bool] | None = None, max_concurrent: int = 1) -> Path:
    """The spec of small verl cells, the factor Dynamic Sampling. `settings`: in two settings,
    ``grpo`` (the four other techniques off) and ``dapo`` (on): 4 runs, each technique off in two
    and on in two; otherwise in the base trainer alone, its `techniques` (unset: the defaults, all
    on). `cpu`: the CPU overrides (a GPU machine needs none but `extra`). `max_concurrent`: the
    driver's jobs at once (the cluster needs that many GPUs)."""
    from verl_cpu.fixtures import CPU_OVERRIDES, write_dataset, write_reward_fn, write_tiny_model

    folder.mkdir(parents=True, exist_ok=True)
    model = write_tiny_model(folder / "model")
    train, val = write_dataset(folder / "data")
    reward, reward_name = write_reward_fn(folder)
    out = folder / "out"
    overrides = [*(CPU_OVERRIDES if cpu else []), f"reward.custom_reward_function.path={reward}",
                 f"reward.custom_reward_function.name={reward_name}", "trainer.total_epochs=1", *(extra or [])]
    trainer = {
        "backend": "verl",
        "model": {"path": str(model)},
        "data": {"train": str(train), "eval": str(val)},
        "rollout": {"engine": "vllm", "max_response_len": 24, "eval_k": 4, "temperature": 1.0, "top_p": 1.0},
        "algorithm": {"group_size": 4, "overlong_cache": 8},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "batch": {"prompts_per_step": 8, "mini_batch_size": 16, "micro_batch_size": 16},
        "schedule": {"total_steps": 2, "eval_every": 2},
        "verl": {"max_prompt_length": 64, "overrides": overrides},
        **({"techniques": dict(techniques)} if techniques else {}),
    }
    spec: dict[str, Any] = {
        "name": "verl-cpu" if cpu else "verl-gpu", "trainer": trainer, "seeds": 1, "metric": "avg@4",
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"address": address, "gpus_per_run": 1, "gpus_per_node": 1, "cpus_per_run": 1,
                     "max_concurrent": max_concurrent,
                     "retries": 0, "run_timeout_s": run_timeout_s},
    }
    spec["factors"] = ["dynamic_sampling"]
    if settings:
        spec["settings"] = [{"name": name, "overrides": {"techniques": {t: on for t in OTHERS}}}
                            for name, on in (("grpo", False), ("dapo", True))]
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
