"""Users' problem sets: JSONL, JSON and verl-style parquet (DAPO-Math-17k), and held-out eval sets.

Every format becomes a list of ``Problem(prompt, answer, id)``. A prompt is either plain text or
a chat, a list of ``{"role", "content"}`` dicts; the policy applies its chat template later.

Accepted records (keys are matched exactly first, then case-insensitively, so AIME files with
``Problem``/``Answer`` columns load as they are):
- prompt: ``prompt``, ``problem`` or ``question`` (or ``prompt_key``; a dotted key such as
  ``a.b`` reads a nested field);
- answer: ``answer`` or ``ground_truth``, or verl's ``reward_model.ground_truth`` (or
  ``answer_key``); integer answers become strings (``34`` and ``34.0`` -> ``"34"``);
- id: ``id`` or ``index``, or verl's ``extra_info.index``; else ``"<file stem>:<line or row>"``.

DAPO-Math-17k ships each of its ~17k problems about a hundred times (1.79M rows); ``dedupe``
(on by default) keeps the first of each exact (prompt, answer) pair. Parquet is read in record
batches, so with ``dedupe`` only the unique problems are ever held in memory.

Hostile files are refused in one sentence before they cost anything: only regular files are
opened (a FIFO would block, /dev/zero never ends), a JSONL line or a record is at most
MAX_RECORD_BYTES, a .json file (parsed whole) at most MAX_JSON_BYTES, and text that is not UTF-8
or JSON nested past Python's recursion limit is named by its line or record.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from . import comparison
from .config_errors import not_a_file_mode
from .tasks import TaskSpec, generate_problems

if TYPE_CHECKING:
    from .config import DataConfig

logger = logging.getLogger(__name__)

PROMPT_KEYS = ("prompt", "problem", "question")
ANSWER_KEYS = ("answer", "ground_truth", "reward_model.ground_truth")
ID_KEYS = ("id", "index", "extra_info.index")
SUFFIXES = (".jsonl", ".json", ".parquet")

MAX_RECORD_BYTES = 2**20
"""Longest problem record: a JSONL line, or a record's prompt, answer and id together (characters).
A math problem is a few KB; a longer record is a mistake that would otherwise be held and tokenized
whole before any prompt-length check (one 100 MB line took more than 6.6 GB)."""
MAX_JSON_BYTES = 64 * 2**20
""".json files are parsed whole, at several times their size in memory; a larger problem set
belongs in .jsonl or .parquet, which are read one record or one batch at a time."""
PARQUET_BATCH_ROWS = 256
"""Parquet rows decoded at once: small, because a row's size is known only once it is decoded (a
dictionary page can repeat one long value in every row); on DAPO-Math-17k-shaped data 256-row
batches read faster than 4,096-row ones (0.6 s against 1.2 s for 300k rows)."""
PARQUET_BATCH_BYTES = 64 * 2**20
"""Fewer rows a batch where the footer says rows are wide: about this many bytes at once."""

DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_REMINDER = 'Remember to put your answer on its own line after "Answer:".'
"""DAPO-Math-17k's prompt, around each problem: the `answer_line` verifier reads that last line."""

BUILTIN_TRAIN_SEED = 0
BUILTIN_EVAL_SEED = 1_000_003  # another stream; problems it shares with training are removed from training
BUILTIN_EVAL_SIZE = 64
"""The built-in addition task's problem streams (the comparison task has its own seeds,
core/comparison.py) and the default size of a built-in held-out set."""

PROMPT_TEMPLATES = ("dapo", "chat", "none")


class DataError(ValueError):
    """A problem file that cannot be loaded; the message names the file, the record and the fix."""


@dataclass(frozen=True)
class Problem:
    """One verifiable problem."""

    prompt: str | list[dict]
    """Plain text, or a chat: a list of {"role": ..., "content": ...} dicts."""
    answer: str
    """The ground-truth answer, as a string (compared by the verifier)."""
    id: str
    """Stable identifier: the record's own id, else "<file stem>:<line or row>"."""


def load_problems(
    path: str | Path,
    limit: int | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    dedupe: bool = True,
) -> list[Problem]:
    """Load problems from ``.jsonl``, ``.json`` (a list of records) or verl-style ``.parquet``.

    ``limit`` keeps the first ``limit`` problems (after deduplication), in file order.
    ``dedupe`` drops exact duplicate (prompt, answer) pairs, keeping the first; DAPO-Math-17k
    needs it (each problem appears ~100 times). Raises DataError on a missing file, an unknown
    suffix, a record without prompt or answer, or a file without records.
    """
    path = check_data_file(path)
    if limit is not None and limit < 1:
        raise DataError(f"{path}: limit must be a positive number of problems, got {limit}.")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    problems: list[Problem] = []
    seen: set[str] = set()
    duplicates = 0
    with _open_regular(path) as handle:
        for where, record in readers[path.suffix](path, handle):
            problem = _to_problem(record, path, where, prompt_key, answer_key)
            if dedupe:
                key = json.dumps([problem.prompt, problem.answer], sort_keys=True)
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
            problems.append(problem)
            if limit is not None and len(problems) >= limit:
                break
    if not problems:
        raise DataError(f"{path}: the file has no records; add at least one problem.")
    if duplicates:
        logger.info("%s: dropped %d duplicate problems, kept %d", path, duplicates, len(problems))
    return problems


def load_eval_set(
    path: str | Path,
    exclude: Iterable[Problem] = (),
    limit: int | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> list[Problem]:
    """Load a held-out evaluation set (e.g. AIME 2024 JSONL), deduplicated.

    Problems whose prompt text also appears in ``exclude`` (the training problems) are dropped
    with a warning that counts them, so that a contaminated eval set cannot inflate avg@k.
    Prompts are compared by their text with whitespace collapsed (a chat by its contents).
    """
    problems = load_problems(path, limit=limit, prompt_key=prompt_key, answer_key=answer_key)
    train_texts = {_prompt_text(p.prompt) for p in exclude}
    if not train_texts:
        return problems
    held_out = [p for p in problems if _prompt_text(p.prompt) not in train_texts]
    if len(held_out) < len(problems):
        logger.warning("%s: dropped %d of %d eval problems that also appear in the training set",
                       path, len(problems) - len(held_out), len(problems))
    if not held_out:
        raise DataError(f"{path}: every eval problem also appears in the training set; use a held-out file.")
    return held_out


# --- the built-in tasks -------------------------------------------------------------------------


def builtin_problems(data: "DataConfig", split: str) -> list[Problem]:
    """The built-in task's (`data.builtin_task`) training or held-out problems, from the task's own
    seed for that split: `data.builtin_train_size` training problems, or `data.num_eval_problems`
    (default 64) held-out ones. Both splits of one task draw from the same distribution (for
    addition, the difficulty mix builtin_min/max_terms); the trainer then removes from training
    any problem whose text is a held-out one (`decontaminate`)."""
    n = data.builtin_train_size if split == "train" else data.num_eval_problems or BUILTIN_EVAL_SIZE
    if data.builtin_task == "comparison":
        seed = comparison.COMPARISON_TRAIN_SEED if split == "train" else comparison.COMPARISON_EVAL_SEED
        problems, prefix = comparison.generate_problems(n, seed), "comparison"
    else:
        mix = TaskSpec(min_terms=data.builtin_min_terms, max_terms=data.builtin_max_terms)
        problems = generate_problems(n, BUILTIN_TRAIN_SEED if split == "train" else BUILTIN_EVAL_SEED, mix)
        prefix = "builtin"
    where = prefix if split == "train" else f"{prefix}-eval"
    return [Problem(p.prompt, p.answer, f"{where}:{i}") for i, p in enumerate(problems)]


# --- prompts: templates and decontamination keys ---------------------------------------------


def problem_text(prompt: str | list[dict]) -> str:
    """The text of a prompt: itself, or a chat's message contents joined by blank lines."""
    return prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)


def apply_prompt_template(prompt: str | list[dict], template: str) -> str | list[dict]:
    """A problem's prompt as the policy will see it (`data.prompt_template`):

    - `dapo`: DAPO's instruction before the problem and its reminder after (not added twice: the
      DAPO-Math-17k prompts already carry them), as a chat user turn (the tokenizer's chat template
      applies where it has one, as in verl);
    - `chat`: the problem as a chat user turn, no instruction;
    - `none`: the problem text as given (a chat's contents joined), no chat template.
    A chat prompt with several turns (a system message, ...) is kept as it is under `dapo`/`chat`.
    """
    if template == "none":
        return problem_text(prompt)
    if not isinstance(prompt, str):
        if template == "dapo" and len(prompt) == 1 and DAPO_INSTRUCTION not in prompt[0]["content"]:
            return [{"role": prompt[0]["role"], "content": _dapo_wrap(prompt[0]["content"])}]
        return prompt
    return [{"role": "user", "content": _dapo_wrap(prompt) if template == "dapo" else prompt}]


def _dapo_wrap(text: str) -> str:
    return text if DAPO_INSTRUCTION in text else f"{DAPO_INSTRUCTION}\n\n{text}\n\n{DAPO_REMINDER}"


def problem_key(prompt: str | list[dict]) -> str:
    """The normalised problem text used for decontamination: DAPO's instruction and reminder
    removed, whitespace collapsed, case folded (so a DAPO-Math-17k prompt matches the bare problem
    of an AIME file)."""
    text = problem_text(prompt).replace(DAPO_INSTRUCTION, " ").replace(DAPO_REMINDER, " ")
    return " ".join(text.split()).casefold()


def decontaminate(train: list[Problem], held_out: list[Problem]) -> tuple[list[Problem], int]:
    """Training problems whose normalised text is not a held-out problem's, and how many were
    removed. The held-out set stays whole (AIME keeps its 30 problems, comparable with the paper)."""
    held = {problem_key(p.prompt) for p in held_out}
    kept = [p for p in train if problem_key(p.prompt) not in held]
    if not kept:
        raise DataError("every training problem is also in the held-out set; use a disjoint eval file.")
    return kept, len(train) - len(kept)


# --- the file itself: checked before a byte is read ---------------------------------------------


def check_data_file(path: str | Path) -> Path:
    """``path`` if it can be a problem file, else DataError; one stat, nothing read. Refuses an
    unknown suffix, a missing file, a directory, a FIFO or a device, and a .json file over
    MAX_JSON_BYTES. `validate` and the CLI can call it before they write anything."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}.")
    try:
        info = path.stat()  # follows symlinks: what a link points to is what would be read
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; check the data path in your config.") from None
    except OSError as error:
        raise DataError(f"{path}: cannot be opened ({error.strerror}); check the data path in your config.") from None
    _refuse_unless_regular(path, info)
    return path


def _refuse_unless_regular(path: Path, info: os.stat_result) -> None:
    """DataError unless ``info`` is a regular file (a .json one at most MAX_JSON_BYTES)."""
    why = not_a_file_mode(info.st_mode)
    if why:
        raise DataError(f"{path}: {why}; give the path of a problem file.")
    if path.suffix == ".json" and info.st_size > MAX_JSON_BYTES:
        raise _json_too_large(path)


def _json_too_large(path: Path) -> DataError:
    return DataError(f"{path}: a .json file is read whole and this one is over {MAX_JSON_BYTES // 2**20} MiB; "
                     "convert it to .jsonl or .parquet, which are read a record at a time.")


def _open_regular(path: Path) -> BinaryIO:
    """The file opened for reading, checked again on the open descriptor: O_NONBLOCK keeps a FIFO
    swapped in after check_data_file from blocking the open (it has no effect on a regular file)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise DataError(f"{path}: cannot be opened ({error.strerror}); check its permissions.") from None
    try:
        _refuse_unless_regular(path, os.fstat(descriptor))
    except DataError:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "rb")


# --- readers: yield (where, record) with where = "line N", "record N" or "row N" ---------------


def _parse_json(path: Path, where: str, raw: bytes, shape: str) -> Any:
    """The JSON value of ``raw`` (the text at ``where``), or DataError; ``shape`` is the fix for
    malformed JSON ("write one JSON object per line")."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: {where} is not UTF-8 text (byte {error.start}); save the file as UTF-8.") from None
    except json.JSONDecodeError as error:
        at = "" if where.startswith("line ") else f" at line {error.lineno}"  # a JSONL line is line 1 of itself
        raise DataError(f"{path}: {where} is not valid JSON ({error.msg}{at}); {shape}.") from None
    except ValueError:  # json's int() refuses more than sys.get_int_max_str_digits() digits
        raise DataError(f"{path}: {where} holds an integer too long to read (over 4,300 digits); "
                        "write it as a string in quotes.") from None
    except RecursionError:
        raise DataError(f"{path}: {where} nests JSON too deeply to read; a problem is an object of strings.") from None


def _read_jsonl(path: Path, handle: BinaryIO) -> Iterator[tuple[str, dict]]:
    number = 0
    while line := handle.readline(MAX_RECORD_BYTES + 1):  # never more than one record in memory
        number += 1
        if len(line) > MAX_RECORD_BYTES:
            raise DataError(f"{path}: line {number} is longer than {MAX_RECORD_BYTES // 2**20} MiB; a problem is a "
                            "few KB, so check that the file holds one JSON object per line.")
        if line.strip():
            yield f"line {number}", _parse_json(path, f"line {number}", line, "write one JSON object per line")


def _read_json(path: Path, handle: BinaryIO) -> Iterator[tuple[str, dict]]:
    raw = handle.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:  # it grew after the size check
        raise _json_too_large(path)
    records = _parse_json(path, "the file", raw, "write a list of problem objects")
    if not isinstance(records, list):
        raise DataError(f"{path}: expected a JSON list of problem objects, got {type(records).__name__}; "
                        "wrap the records in [...] or use .jsonl.")
    for number, record in enumerate(records):
        yield f"record {number}", record


def _read_parquet(path: Path, handle: BinaryIO) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(handle)
    except Exception as error:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable parquet file ({_one_line(error)}); re-export it.") from None
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=_parquet_batch_rows(path, parquet.metadata)):
            for record in batch.to_pylist():  # nested columns come back as dicts and lists
                yield f"row {row}", record
                row += 1
    except (pa.ArrowException, OSError) as error:  # a corrupt page behind a valid footer
        raise DataError(f"{path}: row {row} onwards cannot be read ({_one_line(error)}); re-export the file.") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]  # pyarrow's messages can span lines


def _parquet_batch_rows(path: Path, metadata: Any) -> int:
    """Rows per decoded batch: PARQUET_BATCH_ROWS, fewer where the footer's average row is wide. A
    row group whose rows average over MAX_RECORD_BYTES (uncompressed) holds at least one record
    over the limit: refused from the footer, before it is decompressed."""
    widest = 1.0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        average = group.total_byte_size / max(group.num_rows, 1)
        if average > MAX_RECORD_BYTES:
            raise DataError(f"{path}: the rows of row group {index} average {average / 2**20:.1f} MiB, over the "
                            f"{MAX_RECORD_BYTES // 2**20} MiB limit of a problem record; check the file's columns.")
        widest = max(widest, average)
    return max(1, min(PARQUET_BATCH_ROWS, int(PARQUET_BATCH_BYTES / widest)))


# --- records -----------------------------------------------------------------------------------


def _lookup(record: dict, keys: Iterable[str]) -> tuple[str | None, Any]:
    """The first of ``keys`` present with a value (exact match, then case-insensitive).

    A dotted key (``reward_model.ground_truth``) looks inside nested objects.
    """
    lowered = {str(k).lower(): k for k in record}
    for key in keys:
        for actual in (key, lowered.get(key.lower())):
            if actual in record and not _is_missing(record[actual]):
                return actual, record[actual]
        head, dot, rest = key.partition(".")
        if dot:
            _, inner = _lookup(record, (head,))
            if isinstance(inner, dict):
                _, value = _lookup(inner, (rest,))
                if value is not None:
                    return key, value
    return None, None


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _to_problem(
    record: Any, path: Path, where: str, prompt_key: str | None, answer_key: str | None
) -> Problem:
    if not isinstance(record, dict):
        raise DataError(f"{path}: {where} is a {type(record).__name__}, not an object; "
                        "write each problem as an object with a prompt and an answer.")
    prompt_keys = (prompt_key,) if prompt_key else PROMPT_KEYS
    _, prompt = _lookup(record, prompt_keys)
    if prompt is None:
        raise DataError(f"{path}: {where} has no prompt (looked for {', '.join(map(repr, prompt_keys))}); "
                        "add one or pass prompt_key.")
    answer_keys = (answer_key,) if answer_key else ANSWER_KEYS
    _, answer = _lookup(record, answer_keys)
    problem = Problem(
        prompt=_to_prompt(prompt, path, where),
        answer=_to_answer(answer, path, where, answer_keys),
        id=_find_id(record, path, where),
    )
    size = len(problem_text(problem.prompt)) + len(problem.answer) + len(problem.id)
    if size > MAX_RECORD_BYTES:
        raise DataError(f"{path}: {where} holds {size:,} characters of prompt, answer and id, over the "
                        f"{MAX_RECORD_BYTES // 2**20} MiB limit of a problem record; a problem is a few KB, check its fields.")
    return problem


def _to_answer(answer: Any, path: Path, where: str, answer_keys: tuple[str, ...]) -> str:
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)  # 34.0 from a numeric column with gaps
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool) and str(answer).strip():
        return str(answer).strip()
    raise DataError(f"{path}: {where} has no answer (looked for {', '.join(map(repr, answer_keys))}); "
                    "add one or pass answer_key.")


def _to_prompt(prompt: Any, path: Path, where: str) -> str | list[dict]:
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if hasattr(prompt, "tolist"):  # a numpy array of messages, as pandas reads verl parquet
        prompt = prompt.tolist()
    if isinstance(prompt, list) and prompt and all(_is_message(m) for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(f"{path}: {where} has an empty or malformed prompt; use text or a list of "
                    '{"role": ..., "content": ...} messages.')


def _is_message(message: Any) -> bool:
    return (isinstance(message, dict) and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str))


def _find_id(record: dict, path: Path, where: str) -> str:
    _, value = _lookup(record, ID_KEYS)
    if value is None or isinstance(value, (dict, list)):
        return f"{path.stem}:{where.split()[-1]}"
    return str(value)


def _prompt_text(prompt: str | list[dict]) -> str:
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return " ".join(text.split())
