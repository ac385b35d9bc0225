"""GPU smoke of the verl backend (``bash benchmarks/gpu_smoke.sh verl``): real verl DAPO cells on one
GPU, submitted by ``dapo-ablate run`` through Ray's Job API, offline, one line of figures.

Needs a verl environment on the GPU machine (``pip install -e ".[verl]"``; the script says so and
exits 2 without one). Nothing is downloaded: the model (a 105k-parameter random Qwen2 and its
character tokenizer), the data and the reward are the CPU test's (tests/verl_cpu/fixtures.py), made
on the spot. A ``ray start --head`` with the real GPU in a private folder runs two cells (Dynamic
Sampling off and on, the four other techniques on), 2 steps each, on verl's GPU defaults except
flash-attn with padding removal where flash-attn imports, else ``attn_implementation=sdpa`` and
``use_remove_padding=false`` (the figures line says which). Prints
``gpu_smoke verl:`` with each run's status, avg@4, steps and wall seconds, then
stops everything it started. ``--cpu`` runs the same on this CPU machine with the CPU plugin
(tests/verl_cpu; what tests/e2e/test_verl_real.py does with four cells).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
BIN = Path(sys.executable).parent
SDPA_OVERRIDES = ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                  "actor_rollout_ref.model.use_remove_padding=false"]
"""Without flash-attn: transformers' SDPA attention, padding kept (verl's padding removal needs flash-attn)."""


def gpu_overrides() -> tuple[list[str], str]:
    """verl's GPU defaults (bf16 FSDP, vLLM rollouts) with flash-attn and padding removal where
    flash-attn imports, else SDPA with padding kept; and which of the two, for the figures line."""
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return SDPA_OVERRIDES, "attention sdpa, padding kept (flash-attn not importable)"
    return ["actor_rollout_ref.model.use_remove_padding=true"], "attention flash_attention_2, padding removed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU with the test plugin (tests/verl_cpu)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    try:
        import verl  # noqa: F401
    except ImportError as err:
        print(f"gpu_smoke verl: verl is not importable here ({err}); install the cluster's Python: pip install -e \".[verl]\"",
              file=sys.stderr)
        return 2
    from verl_cpu.cluster import start_head, verl_spec
    from verl_cpu.fixtures import CPU_ENV, RUN_MARKER_VAR, RunWatch, new_run_marker

    work = args.out or Path(f"/tmp/gsv_{secrets.token_hex(4)}")
    marker = new_run_marker()
    root = Path(f"/tmp/gsr_{marker}")  # short: Ray's socket paths live under it
    root.mkdir()
    env = {**os.environ, **(CPU_ENV if args.cpu else {}), RUN_MARKER_VAR: marker,
           "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    started = time.monotonic()
    watch = RunWatch(marker, str(root))
    try:
        with watch:
            address, _ = start_head(root, env, gpus=1)
            extra, attention = ([], "the CPU plugin's overrides") if args.cpu else gpu_overrides()
            spec = verl_spec(work, address, cpu=args.cpu, settings=False, run_timeout_s=900, extra=extra)
            run = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--no-progress"], env=env, cwd=work,
                                 capture_output=True, text=True, timeout=2400)
    finally:
        watch.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    figures = summary(work / "out", "verl-cpu" if args.cpu else "verl-gpu")
    print(f"gpu_smoke verl: exit {run.returncode}, {time.monotonic() - started:.0f} s in all, peak PSS "
          f"{watch.peak_pss_bytes / 2**30:.1f} GiB; {attention}; " + "; ".join(figures))
    if run.returncode:
        print((run.stdout + run.stderr)[-3000:], file=sys.stderr)
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    return run.returncode


def summary(out: Path, experiment: str) -> list[str]:
    from dapo_ablate.ablation.store.ledger import SQLLedger

    lines = []
    with SQLLedger(f"sqlite:///{out}/ledger.db") as ledger:
        results = {r["run_id"]: r for r in ledger.results(experiment)}
        for row in ledger.runs_table(experiment):
            result = results.get(row["run_id"])
            if result is None:
                lines.append(f"{row['run_id'][:8]} {row['status']} {(row['error'] or '')[:200]}")
                continue
            lines.append(f"{row['run_id'][:8]} {row['status']} avg@4 {result['metrics'].get('avg@4', float('nan')):.3f} "
                         f"steps {result['metrics'].get('steps')} wall {result.get('wall_s') or 0:.0f} s")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
