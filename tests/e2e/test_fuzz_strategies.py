"""What the fuzz suite (tests/e2e/test_fuzz_specs.py, tests/e2e/test_fuzz_inputs.py) feeds the product, and
the property every entry point keeps: it succeeds, or it exits 2 with ONE sentence naming the field
or the file; never a traceback, never a hang, and nothing written outside its output folder.

Examples per test: DAPO_FUZZ_EXAMPLES (default 200: about 25 s for the whole suite on 2 cores).
The draws are derandomized (`derandomize=True`): every run of the suite tries the same inputs, so it
gives the same answer; raise DAPO_FUZZ_EXAMPLES to search further. Hypothesis keeps no example
database (`database=None`): nothing is written into the checkout.

The tests at the bottom check that the strategies reach each hostile kind they promise.
"""

from __future__ import annotations

import csv
import os
import signal
import string
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st

from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.yamlio import MAX_EXPANDED_NODES


def _examples() -> int:
    raw = os.environ.get("DAPO_FUZZ_EXAMPLES", "200")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"DAPO_FUZZ_EXAMPLES={raw!r} is not a positive whole number of examples per fuzz test")
    return int(raw)


EXAMPLES = _examples()
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a first call imports pandas or statsmodels; hangs are the hang guard's business
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
HANG_S = 120
"""Generous: one entry point answers in well under a second; only a call that blocks reaches this."""


class Hang(Exception):
    """An entry point that did not return within HANG_S."""


@contextmanager
def hang_guard(seconds: int = HANG_S) -> Iterator[None]:
    """Raise `Hang` in the block after `seconds` (SIGALRM: interrupts a blocking open or read too)."""

    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- values: what a YAML file or a CSV cell can hold ------------------------------------------------
HUGE_INTS = st.sampled_from([2**31, 2**32, 2**63, -(2**63), 10**30, 10**400])  # 10^400: past a float
ODD_FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, 5e-324, -0.0, 1e-300])
ODD_TEXTS = st.sampled_from([
    "", " ", ".", "..", "../..", "\x00", "a\nb", "a\rb", "\t", "\u202eevil", "\ufeffbom", "é" * 300, "x" * 5000,
    "=1+1", "+cmd", "-2+3", "@SUM(A1)", "=cmd|' /C calc'!A0", "NaN", ".inf", "-.inf", "null", "~", "2024-13-01",
    "1e-6", "0x1F", "0o17", "1_000", "yes", "off", "memory://", "sqlite://", "sqlite:///:memory:", "%s%n", "{}", "[]",
    "*a", "&a", "!!python/object:os.system", "<script>", "$(touch pwned)", "`id`",
])  # fmt: skip
TEXTS = st.text(max_size=24) | ODD_TEXTS
INTEGERS = st.one_of(st.integers(-3, 40), st.integers(1, 64), st.integers(-(2**64), 2**64), HUGE_INTS)
FLOATS = st.one_of(st.floats(0, 1), st.floats(), ODD_FLOATS)
SCALARS = st.none() | st.booleans() | INTEGERS | FLOATS | TEXTS
KEYS = TEXTS | st.integers(-2, 5) | st.booleans() | st.none()
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12
)
"""Any plain data a YAML file can hold: unicode, huge and odd numbers, NaN, lists and mappings
(keys of any scalar type)."""


def alias_bomb(width: int, depth: int) -> str:
    """A YAML flow list of ``width``^``depth`` leaves once its aliases are expanded, in a few
    hundred bytes (past MAX_EXPANDED_NODES from 9^6 on)."""
    levels = [f"&b0 [{', '.join(['x'] * width)}]"]
    levels += [f"&b{i} [{', '.join([f'*b{i - 1}'] * width)}]" for i in range(1, depth)]
    return "[" + ", ".join(levels) + "]"


RAW_YAML = st.one_of(
    st.builds(alias_bomb, st.integers(2, 9), st.integers(1, 9)),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),  # deep flow nesting
    st.integers(1, 1500).map(lambda n: "{a: " * n + "1" + "}" * n),
    st.integers(4300, 6000).map(lambda n: "9" * n),  # past int()'s digit limit
    st.sampled_from([
        "!!python/object/apply:os.system ['touch pwned']", "!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2024-01-01",
        "!!float nan", "!!int x", "2024-13-01", "2001-12-14t21:59:43.10-05:00", "*undefined", "&a [*a]", "{a: 1, a: 2}",
        "? [1, 2]\n  : x", "[1, 2", "{a: ", "'unterminated", '"\\x', "|\n  block", "- a\n- b", ": :", "\t", "%YAML 1.1",
        "---\n---", "...", "!<tag:yaml.org,2002:str> x", "!!omap [a: 1]", "!!pairs [a: 1]",
    ]),  # fmt: skip
    st.text(alphabet="[]{}:,-&*!|>'\"#\n ab1.?%@`", max_size=40),  # YAML punctuation at random
)
"""YAML text that no dumper writes: alias bombs, deep nesting, digits past int()'s limit, tags,
broken syntax."""


def set_dotted(data: dict, path: str, value: Any) -> None:
    """``data`` with ``value`` at the dotted ``path``, sections created (or replaced) on the way."""
    *sections, leaf = path.split(".")
    node = data
    for name in sections:
        if not isinstance(node.get(name), dict):
            node[name] = {}
        node = node[name]
    node[leaf] = value


def model_paths(model: type, prefix: str = "") -> list[str]:
    """Every field's dotted path in a pydantic model, its sections' fields included."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append(prefix + name)
        inner = field.annotation
        if isinstance(inner, type) and hasattr(inner, "model_fields"):
            paths += model_paths(inner, f"{prefix}{name}.")
    return paths


TRAINER_PATHS = model_paths(TrainerConfig)
PATH_FIELDS = {"output_dir", "ledger", "tracking.uri", "tracking.artifact_location", "executor.auth_token_file"}
"""Fields naming a place: fuzzed with relative names only, so that nothing could land outside the
test's folder even if the product wrote where it must not (the test checks that it does not)."""
RELATIVE = st.text(alphabet=string.ascii_letters + string.digits + "._- é\n:=", min_size=1, max_size=20).filter(
    lambda text: ".." not in text
)


def typed_values(model: type, prefix: str = "") -> dict[str, st.SearchStrategy[Any]]:
    """Dotted path -> values of the field's own type at their edges (a count field gets 0, -1 and
    10^400; a float field NaN and 1e308; a choice field its choices): what reaches the checks
    behind the type check, where a value of the wrong type stops at the first."""
    found: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        inner = field.annotation
        if isinstance(inner, type) and hasattr(inner, "model_fields"):
            found.update(typed_values(inner, f"{prefix}{name}."))
            continue
        kinds = typing.get_args(inner) or (inner,)
        options = [st.sampled_from(typing.get_args(inner))] if typing.get_origin(inner) is typing.Literal else []
        options += [st.sampled_from(typing.get_args(kind)) for kind in kinds if typing.get_origin(kind) is typing.Literal]
        options += [{int: INTEGERS, float: FLOATS | INTEGERS, bool: st.booleans(), str: TEXTS}[kind]
                    for kind in kinds if kind in (int, float, bool, str)]  # fmt: skip
        if options:
            found[prefix + name] = st.one_of(options)
    return found


def mutations(paths: list[str], typed: dict[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[list[tuple[str, Any]]]:
    """One to three (dotted path, value) changes: a known field (or a made-up key) set to a value of
    its own type at an edge (`typed`, by path), or to any value at all."""
    known = st.sampled_from(paths)
    path = st.one_of(known, known, known, st.builds(lambda p, k: f"{p}.{k}", known, TEXTS))  # 1 in 4 made up

    def value_for(chosen: str) -> st.SearchStrategy[Any]:
        if chosen in PATH_FIELDS:
            return RELATIVE | st.sampled_from(["sqlite:///rel/x.db", "memory://", "sqlite:///", "file:rel"])
        own = (typed or {}).get(chosen)
        return st.one_of(own, own, own, VALUES) if own is not None else VALUES

    return st.lists(path.flatmap(lambda p: value_for(p).map(lambda v: (p, v))), min_size=1, max_size=3)


# -- the property -----------------------------------------------------------------------------------
def files_under(root: Path, skip: Path | None = None) -> dict[str, int]:
    """Every file and folder below ``root`` (not below ``skip``), with its size: what a check
    compares before and after a call."""
    found = {}
    for path in root.rglob("*"):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        found[str(path.relative_to(root))] = path.lstat().st_size if not path.is_dir() else -1
    return found


def one_sentence_or_success(result: Any, names: tuple[str, ...]) -> None:
    """A CliRunner result: exit 0, or exit 2 with one line `error: ...` naming one of ``names``
    (a file) or a field (in backticks); no traceback, no other exception."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # with its traceback: hypothesis shows it with the input that caused it
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "`" in lines[0] or any(name in lines[0] for name in names), lines[0]


def inert_csv_cells(folder: Path) -> list[str]:
    """The cells of the CSV files in ``folder`` that a spreadsheet would run as a formula (should be none)."""
    found = []
    for path in folder.glob("*.csv"):
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.reader(handle):
                found += [cell for cell in row if cell.startswith(("=", "+", "-", "@", "\t", "\r")) and not _number(cell)]
    return found


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- the strategies reach what they promise ---------------------------------------------------------
def _has(value: Any, test: Any) -> bool:
    if test(value):
        return True
    if isinstance(value, dict):
        return any(_has(k, test) or _has(v, test) for k, v in value.items())
    return isinstance(value, list) and any(_has(v, test) for v in value)


REACH = settings(database=None, derandomize=True, max_examples=2000, suppress_health_check=list(HealthCheck))


def test_values_reach_nan_huge_numbers_control_characters_and_nested_mappings():
    find(VALUES, lambda v: _has(v, lambda x: isinstance(x, float) and x != x), settings=REACH)
    find(VALUES, lambda v: _has(v, lambda x: isinstance(x, int) and x > 10**300), settings=REACH)
    find(VALUES, lambda v: _has(v, lambda x: isinstance(x, str) and any(not c.isprintable() for c in x)), settings=REACH)
    find(VALUES, lambda v: isinstance(v, dict) and any(isinstance(x, (dict, list)) for x in v.values()), settings=REACH)
    find(VALUES, lambda v: isinstance(v, dict) and any(not isinstance(k, str) for k in v), settings=REACH)


def test_raw_yaml_reaches_an_alias_bomb_and_nesting_past_the_parser():
    import yaml

    bomb = find(RAW_YAML, lambda text: text.startswith("[&b0") and text.count("*b") >= 40, settings=REACH)
    from dapo_ablate.core.yamlio import expanded_nodes

    assert expanded_nodes(yaml.safe_load(bomb)) > MAX_EXPANDED_NODES
    find(RAW_YAML, lambda text: text.startswith("[" * 1001), settings=REACH)
    find(RAW_YAML, lambda text: len(text) > 4300 and text.isdigit(), settings=REACH)


def test_mutations_reach_every_trainer_section_and_made_up_keys():
    sections = {path.split(".")[0] for path in TRAINER_PATHS}
    assert {"algorithm", "rollout", "schedule", "techniques", "data", "model"} <= sections
    find(mutations(TRAINER_PATHS), lambda changes: any(path not in TRAINER_PATHS for path, _ in changes), settings=REACH)
