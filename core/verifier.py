"""Answer verification: DAPO's answer-line exact match, plus math-verify equivalence.

A response is graded in three steps:

1. ``extract_answer``: the content of the last line that starts with ``Answer:`` (the format
   DAPO's prompt asks for), else the last ``\\boxed{...}``.
2. ``normalize_answer``: DAPO's string normalisation (units, ``$``, ``\\text{}``, spacing, ...).
3. Exact string match of the normalised answers; and, when that fails and an answer is not a
   plain number, Hugging Face math-verify's symbolic equivalence (``\\frac{1}{2}`` = ``0.5``).

How this departs from DAPO's reference grader (verl ``reward_score/math_dapo.py``):
- DAPO matches ``(?i)Answer\\s*:`` anywhere in the last 300 characters. Here ``Answer:`` is
  case-sensitive and must start a line (leading whitespace and markdown bold ``**Answer:**``
  allowed), which stops "we rejected the Answer: 3 above" from counting; we look at the last
  4,000 characters so that a long final line still fits.
- A ``\\boxed{}`` fallback, and math-verify as a second chance (``method="auto"``).
- DAPO's substitutions ``"an " -> ""`` and ``"a " -> ""`` are dropped: they corrupt
  expressions such as ``a + b``. Unit words are removed on word boundaries only.

Bounds. Graders see adversarial text (1 MB of garbage, ``\\frac{`` ten thousand times,
``9^{9^{9^9}}`` which sympy tries to evaluate for minutes). The string steps only ever read the
last ``TAIL_CHARS`` characters and run in linear time. math-verify's own timeout uses
``signal.alarm``, which raises outside the main thread (a Ray worker, a thread pool), so it is
called with its timeout disabled, inside child processes that this module kills when a check
passes its deadline: a killed check counts as incorrect, and a fresh child replaces it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

logger = logging.getLogger(__name__)

METHODS = ("auto", "answer_line", "math_verify", "comparison")
"""``answer_line``: DAPO's normalised exact match only. ``math_verify``: math-verify equivalence
only. ``auto``: exact match first, math-verify when that fails and an answer is not a plain number.
``comparison``: the extracted answer must be the gold comparison word (``normalize_comparison``)."""

TAIL_CHARS = 4_000
"""Only the last 4,000 characters of a response are searched: the answer is at the end, and
this keeps every string step O(4,000) on megabyte-long responses (DAPO itself reads 300)."""

MAX_MATH_VERIFY_CHARS = 1_000
"""Answers longer than this are not sent to math-verify (the longest MATH-500 answer has 159)."""

WORKER_STARTUP_TIMEOUT_S = 60.0
"""How long a math-verify child may take to start (import sympy); not counted in ``timeout_s``."""

WORKER_MEMORY_LIMIT_BYTES = 4 << 30
"""Address-space limit of each math-verify child, so a huge power fails fast with MemoryError."""


class VerifierError(RuntimeError):
    """The math-verify worker process could not be started (an environment problem, not an input)."""


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"^[ \t]*(?:\*\*)?Answer(?:\*\*)?:(?:\*\*)?(.*)$", re.MULTILINE)


def _tail(text: str) -> str:
    """The last TAIL_CHARS characters, minus a partial first line (it might fake a line start)."""
    if len(text) <= TAIL_CHARS:
        return text
    tail = text[-TAIL_CHARS:]
    if text[-TAIL_CHARS - 1] != "\n":
        tail = tail.partition("\n")[2]
    return tail


def _boxed_body(text: str, start: int) -> tuple[str, int] | None:
    """For a ``\\boxed{`` at ``start``: its content and the index of its closing brace."""
    depth = 0
    for i in range(start + len("\\boxed{") - 1, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{"):i], i
    return None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None. O(len(text))."""
    start = text.rfind("\\boxed{")
    found = _boxed_body(text, start) if start >= 0 else None
    return found[0].strip() if found else None


def extract_answer(text: str) -> str | None:
    """The model's final answer: the last non-empty ``Answer:`` line, else the last ``\\boxed{}``.

    ``Answer:`` is case-sensitive (DAPO's prompt format) and must start its line; leading
    whitespace and markdown bold (``**Answer:** 42``, ``**Answer: 42**``) are tolerated. Only the
    last ``TAIL_CHARS`` characters are read. Returns the stripped content, or None.
    """
    if not isinstance(text, str):
        return None
    tail = _tail(text)
    for match in reversed(list(_ANSWER_LINE.finditer(tail))):
        content = match.group(1).strip()
        if content.endswith("**"):
            content = content[:-2].strip()
        if content:
            return content
    return _last_boxed(tail)


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------

_UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "points",
    "feet", "minutes", "digits", "cents", "degrees", "degree", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "multiples",
)  # DAPO's REMOVED_EXPRESSIONS word list
_UNITS = re.compile(r"\b(?:%s)\b" % "|".join(_UNIT_WORDS))
_MAX_NESTING = 8  # levels of \boxed{} and \text{} unwrapped; bounds the work on adversarial input
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|mathrm|mbox|overline)\{([^{}]*)\}")
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])")  # \left( but not \rightarrow
_DROPPED = (  # removed verbatim, in this order
    "{,}", "\\!", "\\,", "\\;", "\\:", "\\ ", "^{\\circ}", "^\\circ",
    "\\%", "%", "\\$", "$", "\\ldots", "\\dots", '"',
)
_SHORT_FRAC = re.compile(r"\\frac([^{\\])([^{\\])")  # \frac12 -> \frac{1}{2}
_SHORT_SQRT = re.compile(r"\\sqrt([^{\\])")  # \sqrt2 -> \sqrt{2}
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_INTEGRAL_FLOAT = re.compile(r"(-?\d+)\.0*")
_TRAILING_ZEROS = re.compile(r"(-?\d*\.\d*?[1-9])0+")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def normalize_answer(s: str) -> str:
    """DAPO-style canonical form of an answer string, in this order (linear time):

    1. unwrap whole-answer ``\\boxed{...}`` (up to 8 levels of nesting);
    2. ``\\text{X}``, ``\\textbf{X}``, ``\\mathrm{X}``, ``\\mbox{X}``, ``\\overline{X}`` -> ``X``
       (likewise);
    3. drop ``\\left``/``\\right``, ``{,}`` (a thousands separator), spacing (``\\!``,
       ``\\,``, ``\\;``, ``\\:``, ``\\ ``), degrees (``^\\circ``), percent and dollar signs,
       ``\\ldots``/``\\dots``, quotes;
    4. ``\\dfrac``/``\\tfrac`` -> ``\\frac``;
    5. unit words (``degrees``, ``cm``, ``dollars``, ... DAPO's list) on word boundaries;
    6. all whitespace;
    7. keep the right-hand side of the last ``=`` (``x=3`` -> ``3``), as DAPO does;
    8. trailing ``.`` and leading ``+``;
    9. shorthand ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``;
    10. numbers: ``1,000`` -> ``1000``; ``42.0`` -> ``42``; ``0.50`` -> ``0.5``; ``-0`` -> ``0``.

    Idempotent on everything but adversarial nesting, so already-normalised answers may be
    passed again (``maj_at_k`` does).
    """
    s = str(s).strip()
    for _ in range(_MAX_NESTING):
        found = _boxed_body(s, 0) if s.startswith("\\boxed{") else None
        if not found or found[1] != len(s) - 1:
            break
        s = found[0].strip()
    for _ in range(_MAX_NESTING):  # innermost first: \text{\text{a}} takes two rounds
        s, unwrapped = _TEXT_MACRO.subn(r"\1", s)
        if not unwrapped:
            break
    s = _SIZING.sub("", s)
    for token in _DROPPED:
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _UNITS.sub("", s)
    s = "".join(s.split())
    s = s.rpartition("=")[2]
    s = s.rstrip(".").lstrip("+")
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _SHORT_SQRT.sub(r"\\sqrt{\1}", s)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    integral = _INTEGRAL_FLOAT.fullmatch(s)
    if integral:
        s = integral.group(1)
    decimal = _TRAILING_ZEROS.fullmatch(s)
    if decimal:
        s = decimal.group(1)
    if s == "-0":
        s = "0"
    return s


_COMPARISONS = {
    "less": "less", "<": "less", "\\lt": "less",
    "greater": "greater", ">": "greater", "\\gt": "greater",
    "equal": "equal", "=": "equal",
}


def normalize_comparison(s: str) -> str | None:
    """A comparison answer's word (``less``, ``greater``, ``equal``), or None when it is not one.

    The answer must be the word alone (case-insensitive, inside ``$``, ``\\boxed{}`` or
    ``\\text{}`` allowed) or its symbol (``<``, ``>``, ``=``, ``\\lt``, ``\\gt``): "less than
    7", "<=" or "13" are malformed, hence wrong. Not ``normalize_answer``, which keeps what follows
    the last ``=`` and so would turn ``=`` into an empty answer.
    """
    s = str(s).strip().replace("$", "").strip()
    for _ in range(_MAX_NESTING):
        found = _boxed_body(s, 0) if s.startswith("\\boxed{") else None
        if not found or found[1] != len(s) - 1:
            break
        s = found[0].strip()
    s = _TEXT_MACRO.sub(r"\1", s).strip().rstrip(".").strip().casefold()
    return _COMPARISONS.get(s)


def _plain_number(s: str) -> Fraction | None:
    # Length cap: int() refuses strings over 4,300 digits, and no answer is that long.
    if len(s) > MAX_MATH_VERIFY_CHARS or not _PLAIN_NUMBER.fullmatch(s):
        return None
    return Fraction(s)


# ---------------------------------------------------------------------------------------------
# math-verify in child processes
# ---------------------------------------------------------------------------------------------

# The child runs this file as a script without importing the dapo_ablate package (whose
# __init__ may import torch): startup stays at about half a second (sympy's import).
_BOOTSTRAP = (
    "import runpy, sys; sys.path = [p for p in sys.path if p]; "
    "runpy.run_path(sys.argv[1], run_name='__math_verify_worker__')"
)


class _Worker:
    """One child process: reads JSON lines ``[gold, pred]``, answers b"1\\n" or b"0\\n".

    Used by one thread at a time (the pool guarantees it).
    """

    def __init__(self) -> None:
        # The child sees the parent's sys.path, so it finds math-verify wherever we did.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if isinstance(p, str) and p))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env,
            start_new_session=True,  # Ctrl-C in the parent's terminal must not hit a check
        )
        self._buffer = b""
        self._ready = False
        # poll, not select: select fails on descriptors above 1024, common in Ray processes.
        self._poller = select.poll()
        self._poller.register(self._proc.stdout.fileno(), select.POLLIN)

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line without its newline; b"" when the child died; None past the deadline."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0 or not self._poller.poll(max(1, int(remaining_ms))):
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def wait_ready(self) -> None:
        if self._ready:
            return
        line = self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT_S)
        if line != b"ready":
            self.kill()
            raise VerifierError(
                f"the math-verify worker did not start (got {line!r}, exit code "
                f"{self._proc.returncode}); check that `python -c 'import math_verify'` works."
            )
        self._ready = True

    def check(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        """math-verify's verdict, or None when the child passed the deadline or died."""
        try:
            self._proc.stdin.write(json.dumps([gold, pred]).encode() + b"\n")
        except (BrokenPipeError, OSError):
            return None
        line = self._read_line(time.monotonic() + timeout_s)
        if line in (b"1", b"0"):
            return line == b"1"
        return None

    def alive(self) -> bool:
        return self._proc.poll() is None

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            pipe.close()


class _WorkerPool:
    """Up to ``max_workers`` math-verify children shared by all threads of this process."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0  # idle + busy + being started

    def _acquire(self) -> _Worker:
        with self._cond:
            while not self._idle and self._live >= self.max_workers:
                self._cond.wait()
            if self._idle:
                worker = self._idle.pop()
            else:
                self._live += 1
                worker = None
        try:
            if worker is not None and not worker.alive():  # died while idle (e.g. OOM killer)
                worker.kill()
                worker = None
            worker = worker or _Worker()
            worker.wait_ready()
        except BaseException:
            self._release(None)
            raise
        return worker

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._live -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def check(self, gold: str, pred: str, timeout_s: float) -> bool:
        worker = self._acquire()
        try:
            verdict = worker.check(gold, pred, timeout_s)
        except BaseException:
            worker.kill()
            self._release(None)
            raise
        if verdict is not None:
            self._release(worker)
            return verdict
        worker.kill()
        logger.debug("math-verify check (%d + %d chars) timed out or crashed; counted as "
                     "incorrect", len(gold), len(pred))
        self._release(None)
        return False

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for worker in idle:
            worker.kill()


_pool: _WorkerPool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _WorkerPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _WorkerPool(max_workers=max(1, min(4, os.cpu_count() or 1)))
        return _pool


def _forget_pool_after_fork() -> None:
    # A forked child must not share the parent's pipes (or a lock held by another thread).
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


def _close_pool() -> None:
    if _pool is not None:
        _pool.close()


os.register_at_fork(after_in_child=_forget_pool_after_fork)
atexit.register(_close_pool)


def _math_verify(gold: str, pred: str, timeout_s: float) -> bool:
    if not gold or not pred or len(gold) > MAX_MATH_VERIFY_CHARS or len(pred) > TAIL_CHARS + 2:
        return False
    return _get_pool().check(gold, pred, timeout_s)


def _as_latex(answer: str) -> str:
    """Wrap an extracted answer in ``$...$`` so math-verify's LaTeX extractor sees it."""
    return "$" + answer.replace("$", "") + "$"


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _decide(response: str, ground_truth: str, method: str) -> bool | tuple[str, str]:
    """The verdict of the string steps, or the (gold, pred) pair that math-verify must judge."""
    if not isinstance(response, str):
        return False
    ground_truth = str(ground_truth)
    answer = extract_answer(response)
    if method == "comparison":  # a word, never sent to math-verify
        pred = normalize_comparison(answer) if answer is not None else None
        return pred is not None and pred == normalize_comparison(ground_truth)
    gold_latex = _as_latex(ground_truth.strip())
    if method == "math_verify":
        return gold_latex, (_as_latex(answer) if answer is not None else _tail(response))
    if answer is None:
        return False
    pred, gold = normalize_answer(answer), normalize_answer(ground_truth)
    if not pred:
        return False
    if pred == gold:
        return True
    if method == "answer_line":
        return False
    pred_number, gold_number = _plain_number(pred), _plain_number(gold)
    if pred_number is not None and gold_number is not None:
        return pred_number == gold_number
    return gold_latex, _as_latex(answer)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown verifier method {method!r}; use one of {', '.join(METHODS)}.")


def verify(response: str, ground_truth: str, method: str = "auto", timeout_s: float = 2.0) -> bool:
    """True when ``response``'s final answer equals ``ground_truth``.

    ``method``: ``"answer_line"`` (extract, normalise, exact match), ``"math_verify"``
    (math-verify equivalence of the extracted answer, or of the response's tail when nothing was
    extracted), ``"auto"`` (exact match; then, for unequal answers: plain numbers compare as
    exact fractions, ``0.50`` = ``.5``, anything else goes to math-verify), or ``"comparison"``
    (the extracted answer is the gold comparison word, see ``normalize_comparison``). Never raises on bad
    input and returns within ``timeout_s`` of math-verify time (False on timeout), from any
    thread. Raises ValueError on an unknown method, and VerifierError if no math-verify worker
    process can be started at all (a broken environment).
    """
    _check_method(method)
    decision = _decide(response, ground_truth, method)
    if isinstance(decision, bool):
        return decision
    return _math_verify(*decision, timeout_s)


@dataclass(frozen=True)
class Verifier:
    """Batch grader: ``Verifier(method, timeout_s)(responses, answers) -> list[bool]``.

    Picklable (it holds only its two settings; worker processes belong to each process and start
    on first need). Exact matches cost microseconds and never touch a worker; the math-verify
    checks of one batch run concurrently on the worker pool.
    """

    method: str = "auto"
    """One of METHODS."""
    timeout_s: float = 2.0
    """Seconds one math-verify check may take before it counts as incorrect."""

    def __post_init__(self) -> None:
        _check_method(self.method)
        if not self.timeout_s > 0:
            raise ValueError(f"Verifier.timeout_s must be > 0 seconds, got {self.timeout_s}.")

    def __call__(self, responses: list[str], answers: list[str]) -> list[bool]:
        if len(responses) != len(answers):
            raise ValueError(
                f"got {len(responses)} responses but {len(answers)} answers; pass one answer per response."
            )
        decisions = [_decide(r, a, self.method) for r, a in zip(responses, answers)]
        pending = [i for i, d in enumerate(decisions) if not isinstance(d, bool)]
        if len(pending) > 1:
            with ThreadPoolExecutor(_get_pool().max_workers) as threads:
                verdicts = list(threads.map(lambda i: _math_verify(*decisions[i], self.timeout_s), pending))
        else:
            verdicts = [_math_verify(*decisions[i], self.timeout_s) for i in pending]
        for i, verdict in zip(pending, verdicts):
            decisions[i] = verdict
        return decisions


# ---------------------------------------------------------------------------------------------
# Child process
# ---------------------------------------------------------------------------------------------


def _exit_when_orphaned() -> None:
    """Watchdog thread: a child whose parent died exits instead of finishing a stuck check."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _worker_main() -> None:
    import resource
    import warnings

    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = WORKER_MEMORY_LIMIT_BYTES
        if hard != resource.RLIM_INFINITY:
            limit = min(hard, limit)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass  # best effort: the parent's deadline still bounds the check
    logging.disable(logging.CRITICAL)  # math-verify logs every unparsable string
    warnings.simplefilter("ignore")
    from math_verify import parse
    from math_verify import verify as math_verify

    # Warm up the lazy imports and parser caches, so that the first deadline times a check only.
    math_verify(parse("$1/2$", parsing_timeout=None), parse("$\\frac{1}{2}$", parsing_timeout=None),
                timeout_seconds=None)
    os.write(1, b"ready\n")
    for line in sys.stdin.buffer:
        try:
            gold, pred = json.loads(line)
            # Timeouts disabled (signals): the parent kills this process at its deadline.
            ok = bool(math_verify(parse(gold, parsing_timeout=None), parse(pred, parsing_timeout=None),
                                  timeout_seconds=None))
        except Exception:  # unparsable input (RecursionError, MemoryError too) is a wrong answer
            ok = False
        os.write(1, b"1\n" if ok else b"0\n")


if __name__ == "__math_verify_worker__":
    _worker_main()
