"""core/contracts.py: the results contract is defined once, and RunRecord round-trips a run's result.

The scan reads the source (it imports nothing), so it also sees modules that need Ray, MLflow
or torch. A *second definition* is a literal that spells out one of the contract's constants
instead of importing it: a tuple, list or set holding exactly the five techniques, the compute
columns or the result keys (or a dict keyed by exactly the result keys, or mapping the
techniques to their labels), or the string ``avg@32`` itself.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from dapo_ablate.core.contracts import (
    COMPUTE_COLUMNS,
    DEFAULT_METRIC,
    METRIC_PREFIXES,
    RESULT_KEYS,
    SHORT_LABELS,
    TECHNIQUE_LABELS,
    TECHNIQUES,
    FactorInfo,
    MetricName,
    RunRecord,
    metric_name,
    parse_metric,
)

from support import ROOT


SCANNED = ("core", "ablation", "sweeps", "reports", "cli")
CONTRACTS = ROOT / "core" / "contracts.py"

NAME_SETS = {
    "TECHNIQUES": frozenset(TECHNIQUES),
    "COMPUTE_COLUMNS": frozenset(COMPUTE_COLUMNS),
    "RESULT_KEYS": frozenset(RESULT_KEYS),
    "RESULT_KEYS without metrics (result defaults)": frozenset(RESULT_KEYS) - {"metrics"},
    "METRIC_PREFIXES": frozenset(METRIC_PREFIXES),
}
LABEL_DICTS = {"SHORT_LABELS": SHORT_LABELS, "TECHNIQUE_LABELS": TECHNIQUE_LABELS}


def _strings(nodes: list[ast.expr | None]) -> frozenset[str] | None:
    """The strings of a literal's elements, or None unless every element is a string constant."""
    if not nodes or not all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in nodes):
        return None
    return frozenset(n.value for n in nodes)  # type: ignore[union-attr]


def _second_definitions(node: ast.AST) -> list[str]:
    """The contract constants that this one AST node spells out."""
    found = []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elements = _strings(node.elts)
        found += [name for name, names in NAME_SETS.items() if elements == names]
    elif isinstance(node, ast.Dict):
        keys = _strings(node.keys)
        if keys is not None and keys >= {"eval_curve", "signals"}:
            found += [name for name, names in NAME_SETS.items() if name.startswith("RESULT_KEYS") and keys == names]
        if keys == NAME_SETS["TECHNIQUES"]:
            literal = {k.value: getattr(v, "value", None) for k, v in zip(node.keys, node.values)}  # type: ignore[union-attr]
            found += [name for name, labels in LABEL_DICTS.items() if literal == labels]
    elif isinstance(node, ast.Constant) and node.value == DEFAULT_METRIC:
        found.append(f"DEFAULT_METRIC ({DEFAULT_METRIC!r})")
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "(avg|pass|maj)@" in node.value:
        found.append("METRIC_PATTERN")
    return found


def scan(paths: list[Path]) -> list[str]:
    """'file:line: NAME' for every second definition in ``paths``, in source order."""
    hits = []
    for path in paths:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = sorted(ast.walk(tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        hits += [f"{shown}:{node.lineno}: {name}" for node in nodes for name in _second_definitions(node)]
    return hits


def _modules() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if p != CONTRACTS)


def test_the_scan_finds_each_kind_of_second_definition(tmp_path):
    source = tmp_path / "restated.py"
    source.write_text(
        'A = ("overlong_filter", "clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling")\n'
        'B = ["wall_s", "tokens_generated", "tokens_discarded"]\n'
        'C = ("metrics", "eval_curve", "signals", "tokens_generated", "tokens_discarded", "wall_s")\n'
        'D = {"overlong_filter": "OF", "clip_higher": "CH", "soft_overlong": "SP", "token_level_loss": "TL",'
        ' "dynamic_sampling": "DS"}\n'
        'E = {"eval_curve": [], "signals": [], "tokens_generated": 0, "tokens_discarded": 0, "wall_s": 0.0}\n'
        'def f(metric="avg@32"):\n    return metric or "avg@32"\n'
        'P = ("avg@", "pass@", "maj@")\nR = re.compile(r"(avg|pass|maj)@(\\d+)")\n'
        'OK = ("tokens_generated", "wall_s")\nDOC = "the paper\'s avg@32"\n'
    )
    hits = [hit.split(": ", 1)[1] for hit in scan([source])]
    assert hits == [
        "TECHNIQUES", "COMPUTE_COLUMNS", "RESULT_KEYS", "SHORT_LABELS",
        "RESULT_KEYS without metrics (result defaults)", "DEFAULT_METRIC ('avg@32')", "DEFAULT_METRIC ('avg@32')",
        "METRIC_PREFIXES", "METRIC_PATTERN",
    ]  # fmt: skip


def test_contracts_module_defines_every_constant_itself():
    names = {hit.split(": ", 1)[1] for hit in scan([CONTRACTS])}
    assert {"TECHNIQUES", "SHORT_LABELS", "TECHNIQUE_LABELS", "DEFAULT_METRIC ('avg@32')", "METRIC_PATTERN"} <= names


def test_no_contract_constant_is_defined_twice():
    hits = scan(_modules())
    assert not hits, "import these from dapo_ablate.core.contracts instead:\n" + "\n".join(hits)


def test_core_and_reports_define_no_contract_constant():
    """The part of the scan that holds now: core and reports import the contract."""
    hits = scan([p for p in _modules() if p.relative_to(ROOT).parts[0] in ("core", "reports")])
    assert not hits, "import these from dapo_ablate.core.contracts instead:\n" + "\n".join(hits)


def test_contracts_import_nothing_but_the_standard_library():
    tree = ast.parse(CONTRACTS.read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"__future__", "re", "collections", "dataclasses", "typing"}


# --- metric names ---------------------------------------------------------------------------------
def test_parse_metric():
    assert parse_metric("avg@32") == MetricName("avg", 32)
    assert parse_metric("maj@4") == MetricName("maj", 4)
    assert str(MetricName("pass", 16)) == "pass@16" == metric_name("pass", 16)
    for name in ("avg@", "best@32", "avg@32/mean", "val-core/aime/acc/mean@32", "avg_at_32", "", None):
        assert parse_metric(name) is None
    with pytest.raises(ValueError, match="unknown metric kind 'mean'"):
        metric_name("mean", 32)


# --- RunRecord ------------------------------------------------------------------------------------
RESULT = {
    "metrics": {"avg@32": 0.375, "pass@32": 0.9, "maj@32": 0.5, "steps": 2, "peak_rss_mb": 812.5, "lost": None},
    "eval_curve": [{"step": 0, "avg@32": 0.25, "pass@32": 0.8}, {"step": 2, "avg@32": 0.375, "pass@32": 0.9}],
    "signals": [{"step": 1, "reward": -0.25, "tokens_generated": 1200.0}, {"step": 2, "reward": 0.5}],
    "tokens_generated": 2400,
    "tokens_discarded": 300,
    "wall_s": 12.5,
}


def test_run_record_round_trips_a_result_dict_exactly():
    record = RunRecord.from_dict(RESULT)
    assert record.to_dict() == RESULT
    assert record.result_dict() == RESULT
    assert list(record.to_dict()) == list(RESULT_KEYS)
    assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(RESULT, sort_keys=True)
    assert RunRecord.from_dict(record.to_dict()) == record


def test_run_record_round_trips_with_identity():
    stored = {**RESULT, "run_id": "3f2a", "factors": {"clip_higher": True, "eps_high": 0.28}, "seed": 1,
              "setting": "tight"}  # fmt: skip
    record = RunRecord.from_dict(stored)
    assert (record.run_id, record.seed, record.setting) == ("3f2a", 1, "tight")
    assert record.factors == {"clip_higher": True, "eps_high": 0.28}
    assert record.to_dict() == stored
    assert record.result_dict() == RESULT  # the identity is not part of the result


def test_run_record_defaults_what_a_cell_function_leaves_out():
    record = RunRecord.from_dict({"metrics": {"avg@32": 0.5}})
    assert record.to_dict() == {"metrics": {"avg@32": 0.5}, "eval_curve": [], "signals": [],
                                "tokens_generated": 0, "tokens_discarded": 0, "wall_s": 0.0}  # fmt: skip
    assert isinstance(record.wall_s, float) and isinstance(record.tokens_generated, int)


def test_run_record_shares_no_container_with_its_caller():
    given = json.loads(json.dumps(RESULT))
    record = RunRecord.from_dict(given)
    given["metrics"]["avg@32"] = 0.0
    given["eval_curve"][0]["avg@32"] = 0.0
    out = record.to_dict()
    out["signals"].append({"step": 3})
    out["metrics"]["pass@32"] = 0.0
    assert record.to_dict() == RESULT
    with pytest.raises(AttributeError):
        record.wall_s = 0.0  # type: ignore[misc]


def test_run_record_refuses_unknown_keys_and_missing_metrics():
    with pytest.raises(ValueError, match=r"unknown result keys \['wall_time'\]"):
        RunRecord.from_dict({**RESULT, "wall_time": 1.0})
    with pytest.raises(ValueError, match="needs `metrics`"):
        RunRecord.from_dict({"eval_curve": []})


def test_run_record_keeps_non_finite_values_as_given():
    record = RunRecord.from_dict({**RESULT, "metrics": {"avg@32": float("nan")}})
    assert math.isnan(record.to_dict()["metrics"]["avg@32"])


# --- FactorInfo -----------------------------------------------------------------------------------
def test_factor_info_levels():
    clip = FactorInfo.technique("clip_higher")
    assert (clip.low, clip.high, clip.is_technique, clip.label) == (False, True, True, "CH")
    assert clip.describe() == "CH off / on"
    eps = FactorInfo("eps_high", 0.2, 0.28)
    assert (eps.level(0), eps.level(1), eps.is_technique, eps.label) == (0.2, 0.28, False, "eps_high")
    assert eps.describe() == "eps_high 0.2 / 0.28"
    with pytest.raises(ValueError, match="coded levels 0 and 1"):
        eps.level(2)
    with pytest.raises(ValueError, match="not a DAPO technique"):
        FactorInfo.technique("eps_high")
