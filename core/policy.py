"""The policy: a Hugging Face causal LM and its tokenizer, from a local folder or built in.

The built-in policy is a tiny Qwen2-architecture model (one token per character plus one `Answer:`
token) warm-started by a short supervised phase on the built-in task. Two sizes
(`model.builtin_size`): `small` (0.3M parameters, the quickstart's) and `large` (1.3M). Each built-in
task (`data.builtin_task`) has its own warm-start: the comparison task adds its words to the
vocabulary, so its policy is another checkpoint. A checkpoint is saved as an ordinary Hugging Face
folder, cached on disk under a hash of its recipe (size, task, warm-start), so it is built once per
machine and then loaded by the same code path as any user checkpoint. The two default small
policies (addition and comparison) ship in the package instead (`SHIPPED_DIGESTS`, checked by
digest): every machine starts from the same weights, and nobody waits for their build.

A user's folder is checked before transformers sees it (`check_model_folder`): an empty or garbage
folder is one sentence naming it and what is missing, not a traceback from deep in
`from_pretrained` (an empty folder even loads a one-token tokenizer that encodes every prompt to
nothing). `check_context` refuses a prompt + response ceiling beyond the model's positions from its
config.json alone, so `validate` can call it before anything starts; torch is imported only by the
functions that build or load a model, which keeps these checks light.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import comparison, tasks
from .atomic import open_lock
from .comparison import ComparisonSpec
from .config import BUILTIN, ConfigError, ModelConfig
from .tasks import ANSWER_TOKEN, TaskSpec

if TYPE_CHECKING:
    import torch

RECIPE_VERSION = 1

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
"""A folder's weights, as `from_pretrained` finds them (one file, or shards with their index)."""
TOKENIZER_PATTERNS = ("tokenizer.json", "vocab.json", "vocab.txt", "*.model", "*.tiktoken")
"""A tokenizer's vocabulary: a fast tokenizer's tokenizer.json, a BPE vocab.json, a WordPiece
vocab.txt, a SentencePiece or tiktoken model. tokenizer_config.json alone is not one."""
MAX_MODEL_CONFIG_BYTES = 2**20  # a config.json is a few KB
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
"""Where Hugging Face configs keep the number of positions (Qwen, Llama: the first; GPT-2: n_positions)."""
SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn")
"""RoPE scalings that stretch the positions by `factor` (as vLLM counts them); llama3's already
reports the stretched length in max_position_embeddings."""


@dataclass(frozen=True)
class BuiltinRecipe:
    """Everything that determines the built-in model's weights (hashed into its cache key).
    The defaults are the small policy on the addition task (`BUILTIN_SIZES`, `BUILTIN_TASKS`)."""

    task: TaskSpec | ComparisonSpec = field(default_factory=TaskSpec)
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 96
    warmup_steps: int = 600
    batch_size: int = 128
    lr: float = 5e-3
    seed: int = 0
    version: int = RECIPE_VERSION

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def task_name(self) -> str:
        """The `data.builtin_task` this recipe warm-starts on."""
        return "comparison" if isinstance(self.task, ComparisonSpec) else "addition"

    @property
    def symbols(self) -> tuple[str, ...]:
        """The task's tokens beyond the addition task's characters (none for addition)."""
        return comparison.COMPARISON_SYMBOLS if isinstance(self.task, ComparisonSpec) else ()

    def warmstart_example(self, rng: random.Random) -> tuple[str, str]:
        """(prompt, noisy worked solution) of this recipe's task."""
        module = comparison if isinstance(self.task, ComparisonSpec) else tasks
        return module.warmstart_example(rng, self.task)


BUILTIN_SIZES: dict[str, dict[str, Any]] = {
    "small": {},  # BuiltinRecipe's defaults: hidden 96, 3 layers, MLP 256 (0.3M parameters)
    "large": {"hidden_size": 160, "num_layers": 4, "intermediate_size": 512, "lr": 2e-3},  # 1.3M parameters
}
"""`model.builtin_size` -> the recipe's shape (heads stay 4 query / 2 key-value) and warm-start
learning rate: at the small policy's 5e-3 the large one fitted the traces worse in 600 steps
(step-0 avg@32 0.251 on addition against 0.612 at 2e-3)."""

BUILTIN_TASKS: dict[str, TaskSpec | ComparisonSpec] = {"addition": TaskSpec(), "comparison": ComparisonSpec()}
"""`data.builtin_task` -> the task spec its warm-start draws from (addition: 2-6 numbers, whatever
the run's difficulty mix: the mix is a prompt distribution shift for one policy)."""


def builtin_recipe(cfg: ModelConfig, task: str = "addition") -> BuiltinRecipe:
    """The recipe of the configured built-in policy: its size, its task's warm-start, its steps."""
    return BuiltinRecipe(task=BUILTIN_TASKS[task], warmup_steps=cfg.builtin_warmup_steps, **BUILTIN_SIZES[cfg.builtin_size])


@dataclass
class Policy:
    """A causal LM with its tokenizer and the prompt formatting that goes with them."""

    model: torch.nn.Module
    tokenizer: Any
    use_chat_template: bool = True
    source: str = ""

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def eos_token_ids(self) -> list[int]:
        """Every token that ends a response: the tokenizer's EOS and the generation config's."""
        ids = {self.eos_token_id}
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if extra is not None:
            ids |= set(extra) if isinstance(extra, (list, tuple)) else {int(extra)}
        return sorted(ids)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def encode_prompt(self, prompt: str | list[dict]) -> list[int]:
        """Token ids of a prompt; chat-list prompts go through the tokenizer's chat template."""
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(prompt, list):
            if not template:
                text = "\n".join(m["content"] for m in prompt)
                return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            prompt_messages = prompt
        elif self.use_chat_template and template:
            prompt_messages = [{"role": "user", "content": prompt}]
        else:
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = self.tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def cache_root() -> Path:
    """Where built artefacts live: $DAPO_ABLATE_CACHE, else ~/.cache/dapo-ablate."""
    return Path(os.environ.get("DAPO_ABLATE_CACHE", Path.home() / ".cache" / "dapo-ablate")).expanduser()


def _load_errors() -> tuple[type[BaseException], ...]:
    """What `from_pretrained` raises for a folder it cannot use: an unreadable or unknown config
    (OSError, ValueError), garbage tokenizer.json (JSONDecodeError), garbage or empty safetensors
    (SafetensorError), a pickled .bin refused by weights_only (UnpicklingError), an empty .bin
    (EOFError), weights of another shape (RuntimeError)."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError)
    try:
        from safetensors import SafetensorError
    except ImportError:  # an older safetensors without the public name
        return errors
    return (*errors, SafetensorError)


LOAD_ERRORS = _load_errors()


def _load_problem(error: BaseException) -> str:
    """A load error's gist on one line (torch's weights_only refusal runs to a paragraph of advice
    that ends by suggesting weights_only=False: not repeated here)."""
    if isinstance(error, pickle.UnpicklingError):
        return "its .bin weights pickle objects other than tensors, refused without running them"
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def load_policy(cfg: ModelConfig, builtin_task: str = "addition") -> Policy:
    """Load the configured policy (building and caching the built-in one on first use).
    builtin_task (`data.builtin_task`) picks the built-in policy's warm-start; a folder ignores it.
    A user's folder that is empty, incomplete or garbage raises ConfigError naming it."""
    if cfg.path == BUILTIN:
        path = builtin_checkpoint(builtin_recipe(cfg, builtin_task))
    else:
        path = Path(cfg.path).expanduser()
        check_model_folder(path, trust_remote_code=cfg.trust_remote_code)
    try:
        tokenizer, model = _from_pretrained(path, cfg.trust_remote_code)
    except LOAD_ERRORS as error:
        if cfg.path == BUILTIN:
            raise  # our own cache: a bug, with its traceback
        raise ConfigError(f"model.path {cfg.path!r} cannot be loaded by transformers ({_load_problem(error)}); "
                          "re-save the model and tokenizer there with save_pretrained") from None
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    return Policy(model=model, tokenizer=tokenizer, use_chat_template=cfg.use_chat_template, source=str(path))


def _from_pretrained(path: Path, trust_remote_code: bool) -> tuple[Any, torch.nn.Module]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32  # master weights; cfg.dtype is the compute dtype (autocast), see ModelConfig.dtype
    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust_remote_code)
    return tokenizer, model


# ----------------------------------------------------------------------- a user's checkpoint folder
def check_model_folder(path: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """The parsed config.json of a Hugging Face checkpoint folder, checked without loading it:
    a folder, with a readable config.json, weights and (unless trust_remote_code, whose code may
    read anything) a tokenizer's vocabulary. Raises ConfigError naming the folder and what is missing."""
    folder, name = Path(path).expanduser(), f"model.path {str(path)!r}"
    if not folder.is_dir():
        raise ConfigError(f"{name} is not a folder; give a local Hugging Face checkpoint folder or `builtin`")
    config = _read_model_config(folder, name)
    missing = []
    if not _has_any(folder, WEIGHT_PATTERNS):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not trust_remote_code and not _has_any(folder, TOKENIZER_PATTERNS):
        missing.append("tokenizer (tokenizer.json, vocab.json or tokenizer.model)")
    if missing:
        raise ConfigError(f"{name} has no {' and no '.join(missing)}; save the model and its tokenizer there "
                          "with save_pretrained")
    return config


def _has_any(folder: Path, patterns: tuple[str, ...]) -> bool:
    return any(match.is_file() for pattern in patterns for match in folder.glob(pattern))


def _read_model_config(folder: Path, name: str) -> dict[str, Any]:
    """config.json of ``folder`` as a dict, or ConfigError (missing, not a regular file, too large,
    not UTF-8 JSON, not an object)."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ConfigError(f"{name} has no config.json, so it is no Hugging Face checkpoint folder; save the model "
                          "there with save_pretrained")
    if not config_path.is_file() or config_path.stat().st_size > MAX_MODEL_CONFIG_BYTES:
        raise ConfigError(f"{name}: config.json is not a regular file of at most 1 MiB; re-save the model config")
    try:
        config = json.loads(config_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise ConfigError(f"{name}: config.json is not valid UTF-8 JSON; re-save the model config") from None
    except OSError as error:
        raise ConfigError(f"{name}: config.json cannot be read ({error.strerror}); check its permissions") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{name}: config.json holds a {type(config).__name__}, not an object; re-save the model config")
    return config


# -------------------------------------------------------------------------- context length
def model_context(model: str | Path | Mapping[str, Any] | Any) -> int | None:
    """Positions the model attends over, from `builtin`, a checkpoint folder's config.json, a parsed
    config dict, or a transformers config; None where that is unknown (a hub name, a config without
    a length). Raises ConfigError for a folder whose config.json is unusable."""
    if isinstance(model, (str, Path)):
        if str(model) == BUILTIN:
            return BuiltinRecipe().max_positions  # every built-in size shares it (BUILTIN_SIZES)
        folder = Path(model).expanduser()
        if not folder.is_dir():
            return None  # a hub name (backend verl) or a path checked elsewhere
        model = _read_model_config(folder, f"model.path {str(model)!r}")
    elif not isinstance(model, Mapping) and hasattr(model, "to_dict"):
        model = model.to_dict()
    return _context_of(model) if isinstance(model, Mapping) else None


def _context_of(config: Mapping[str, Any]) -> int | None:
    """The context length a config.json declares, stretched by a RoPE scaling where it has one."""
    positions = next((config[key] for key in CONTEXT_KEYS if isinstance(config.get(key), int)), None)
    if positions is None:
        text_config = config.get("text_config")  # multimodal checkpoints keep the LM's config inside
        return _context_of(text_config) if isinstance(text_config, Mapping) else None
    rope = config.get("rope_scaling")
    if isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type")) in SCALED_ROPE_TYPES:
        factor, original = rope.get("factor"), rope.get("original_max_position_embeddings", positions)
        if isinstance(factor, (int, float)) and factor > 1 and isinstance(original, int):
            return max(positions, int(original * factor))
    return positions


def check_context(model: str | Path | Mapping[str, Any] | Any, max_prompt_len: int, max_response_len: int) -> int | None:
    """Refuse, with ConfigError, a prompt of ``max_prompt_len`` tokens plus a response ceiling of
    ``max_response_len`` beyond the model's positions (`model_context`); returns that context, or
    None when it is unknown (nothing checked). Reads config.json only: no torch, no weights."""
    context = model_context(model)
    if context is None or max_prompt_len + max_response_len <= context:
        return context
    if max_prompt_len >= context:
        raise ConfigError(f"a prompt of {max_prompt_len} tokens already fills the model's context of {context} "
                          f"positions; lower the prompt length (verl.max_prompt_length) below {context}")
    tokens = "token" if max_prompt_len == 1 else "tokens"
    raise ConfigError(f"rollout.max_response_len {max_response_len} plus a prompt of up to {max_prompt_len} {tokens} "
                      f"exceeds the model's context of {context} positions; lower max_response_len to at most "
                      f"{context - max_prompt_len}")


# --------------------------------------------------------------------------------- built-in model
def builtin_tokenizer(extra: tuple[str, ...] = ()):
    """A Hugging Face fast tokenizer: one token per character of the addition task, plus `Answer:`,
    plus `extra` (a task's further characters and whole-word tokens, appended so that the addition
    task's ids never move)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    symbols = list("0123456789+=, \n") + [ANSWER_TOKEN] + list(extra)
    vocab = {tok: i for i, tok in enumerate(specials + symbols)}
    words = sorted((s for s in symbols if len(s) > 1), key=len, reverse=True)  # longest first
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(map(re.escape, words)) + "|[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def builtin_model(recipe: BuiltinRecipe, vocab_size: int, eos_id: int, pad_id: int) -> torch.nn.Module:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=eos_id,
    )
    torch.manual_seed(recipe.seed)
    return Qwen2ForCausalLM(config)


def builtin_lock(recipe: BuiltinRecipe) -> Path:
    """The lock a process holds while it builds `recipe`'s policy into the cache."""
    return cache_root() / f"builtin-{recipe.digest()}.lock"


SHIPPED_ROOT = Path(__file__).with_name("builtin_policies")
"""Where the package keeps the built-in policies it ships, one folder `builtin-<recipe digest>` each."""
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "recipe.json")
SHIPPED_MANIFEST = "SHA256SUMS"
"""In each shipped folder: `sha256  name` lines for `SHIPPED_FILES` (`sha256sum`'s format)."""
SHIPPED_DIGESTS: dict[str, str] = {
    "10b582f365bd2bb8": "f571aa719d34047a7ddc0e1b6f1507f6c5c4c06167125fd9d433b6bf8f611b92",  # small policy, addition task, 600 warm-start steps (the quickstart's)
    "109829aec64d2a9f": "4e082c46939584db4320453ca3d1a9dd58923355d565666d5aee98cff2095dbb",  # small policy, comparison task, 600 warm-start steps (the transfer example's)
}
"""Recipe digest -> the sha256 of its shipped folder's SHA256SUMS: the two default small policies
ship in the package (1.2 MB each), built once by `_build_builtin` on one CPU thread, so that every
machine starts from the same weights (a warm-start is not bitwise reproducible across CPUs) and
none spends minutes building them. Other recipes (the large size, another warm-start length) are
built on first use."""


def shipped_checkpoint(recipe: BuiltinRecipe) -> Path | None:
    """The package's folder of `recipe`'s policy when it ships one whose files match their digests;
    None otherwise (not shipped, or altered: then it is built into the cache like any other)."""
    expected = SHIPPED_DIGESTS.get(recipe.digest())
    folder = SHIPPED_ROOT / f"builtin-{recipe.digest()}"
    if not expected or not (folder / SHIPPED_MANIFEST).is_file():
        return None
    if _shipped_intact(folder, expected):
        return folder
    import warnings

    warnings.warn(f"the shipped built-in policy in {folder} does not match its digests; building it instead", stacklevel=2)
    return None


def _shipped_intact(folder: Path, manifest_sha256: str) -> bool:
    """The manifest is the one the code names and every file listed in it has its digest (2.5 MB read: milliseconds)."""
    manifest = (folder / SHIPPED_MANIFEST).read_bytes()
    if hashlib.sha256(manifest).hexdigest() != manifest_sha256:
        return False
    listed = dict(reversed(line.split(None, 1)) for line in manifest.decode().splitlines() if line.strip())
    if set(listed) != set(SHIPPED_FILES):
        return False
    return all(_sha256(folder / name) == digest for name, digest in listed.items())


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


BUILD_S_PER_STEP = {"small": 0.5, "large": 1.4}
"""Rough seconds per warm-start step of a build, one thread on the project's 2-core machine
(measured: small 0.3-0.75, large 0.9-2.0 between a quiet and a loaded machine)."""


def builtin_ready(recipe: BuiltinRecipe) -> bool:
    """Whether `recipe`'s policy needs no build: shipped in the package, or already in the cache."""
    return shipped_checkpoint(recipe) is not None or (cache_root() / f"builtin-{recipe.digest()}" / "recipe.json").is_file()


@dataclass(frozen=True)
class PolicyBuild:
    """A built-in policy a plan needs that neither ships nor is cached here."""

    model: ModelConfig
    task: str
    threads: int

    @property
    def words(self) -> str:
        return f"{self.model.builtin_size} policy, {self.task} task, {self.model.builtin_warmup_steps} warm-start steps"

    @property
    def rough_s(self) -> float:
        return BUILD_S_PER_STEP[self.model.builtin_size] * self.model.builtin_warmup_steps

    def command(self, python: str) -> list[str]:
        """The process that builds it with its progress on stdout (`core.build_policy`)."""
        return [python, "-m", "dapo_ablate.core.build_policy", self.model.builtin_size, self.task,
                str(self.model.builtin_warmup_steps), str(self.threads)]


def policies_to_build(models: list[tuple[ModelConfig, str]]) -> list[PolicyBuild]:
    """The built-in policies of (model config, built-in task) pairs that neither ship nor are
    cached here, each once."""
    found: dict[str, PolicyBuild] = {}
    for cfg, task in models:
        if cfg.path != BUILTIN:
            continue
        recipe = builtin_recipe(cfg, task)
        if recipe.digest() not in found and not builtin_ready(recipe):
            found[recipe.digest()] = PolicyBuild(cfg, task, cfg.threads)
    return list(found.values())


def builtin_checkpoint(recipe: BuiltinRecipe = BuiltinRecipe(), log=print) -> Path:
    """The built-in policy's checkpoint folder: the package's when it ships it (`shipped_checkpoint`),
    else built under a file lock on first use and cached."""
    shipped = shipped_checkpoint(recipe)
    if shipped is not None:
        return shipped
    root = cache_root()
    final = root / f"builtin-{recipe.digest()}"
    if (final / "recipe.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(builtin_lock(recipe)):
        if (final / "recipe.json").is_file():  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".building-"))
        try:
            _build_builtin(recipe, tmp, log)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def wait_for_builtin(recipe: BuiltinRecipe, on_wait: Callable[[str], None]) -> None:
    """Return once no other process is building `recipe`'s policy: at once when nobody is (or it
    is built), else after calling ``on_wait(holder)`` once (``lock_holder``'s text) and waiting for
    the build to finish. The caller then finds the policy built, or builds it itself."""
    if shipped_checkpoint(recipe) is not None or (cache_root() / f"builtin-{recipe.digest()}" / "recipe.json").is_file():
        return
    cache_root().mkdir(parents=True, exist_ok=True)
    with file_lock(builtin_lock(recipe), on_wait=on_wait):
        pass


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[str], None] | None = None):
    """Hold an exclusive lock on `path` (created if absent) across processes on this machine;
    when another process holds it, ``on_wait(lock_holder(path))`` is called once before waiting.
    The lock file is never opened through a link (`atomic.open_lock`) nor truncated (another
    process may hold it)."""
    with os.fdopen(open_lock(path), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(lock_holder(path))
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_holder(lock: Path) -> str:
    """``process PID (LOCK FILE)`` for the process holding a flock on `lock` (Linux's /proc/locks),
    or the lock file alone where that is not known (another system, another PID namespace)."""
    try:
        stat = os.stat(lock)
        entries = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return str(lock)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for entry in entries:
        fields = entry.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; a waiter's line has "->" after the number
        holder = fields[4] if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device else ""
        if holder.isdigit() and holder != "0":
            return f"process {holder} ({lock})"
    return str(lock)


def _build_builtin(recipe: BuiltinRecipe, out: Path, log) -> None:
    """Supervised warm-start on noisy worked solutions (loss on the response tokens only)."""
    import torch

    tokenizer = builtin_tokenizer(recipe.symbols)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model = builtin_model(recipe, len(tokenizer), eos, pad)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    rng = random.Random(recipe.seed + 1)
    log(f"building the built-in policy ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{recipe.task_name} task, {recipe.warmup_steps} warm-start steps, cached in {out.parent}) ...")
    start = time.time()
    model.train()
    for step in range(recipe.warmup_steps):
        ids, labels, attn = _sft_batch(tokenizer, rng, recipe, eos, pad)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:
            log(f"  warm-start step {step + 1}: loss {loss.item():.3f} ({time.time() - start:.0f} s)")
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    (out / "build.json").write_text(json.dumps({"warmstart_s": round(time.time() - start, 1), "parameters": parameters,
                                                "threads": torch.get_num_threads()}))
    (out / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2))  # written last: marks the folder complete


def _sft_batch(tokenizer, rng: random.Random, recipe: BuiltinRecipe, eos: int, pad: int):
    import torch

    rows = []
    for _ in range(recipe.batch_size):
        prompt, solution = recipe.warmstart_example(rng)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r = tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos]
        rows.append((p, r))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        seq = p + r
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(r)
        attn[i, : len(seq)] = 1
    return ids, labels, attn
