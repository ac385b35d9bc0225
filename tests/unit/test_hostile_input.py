"""Hostile or broken input: each case exits 2 with one sentence naming the field or file, prints no
traceback, and writes nothing (issue: reliability under faults and hostile input)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli.main import app
from dapo_ablate.core.yamlio import MAX_EXPANDED_NODES, expanded_nodes

from tiny_configs import QUICKSTART_SHAPE


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    + ["name: bomb"]
)


def spec_data(tmp_path: Path, **fields) -> dict:
    out = tmp_path / "out"
    data = {
        "name": "hostile", "trainer": QUICKSTART_SHAPE, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
    }  # fmt: skip
    data.update(fields)
    return data


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


CASES = {
    "alias bomb": (lambda tmp: write(tmp, ALIAS_BOMB), "aliases"),
    "non-UTF-8 file": (lambda tmp: write(tmp, b"name: caf\xe9\n"), "not UTF-8"),
    "a directory": (lambda tmp: tmp, "is a folder without spec.yaml"),  # an experiment folder holds one
    "a special file": (lambda tmp: Path("/dev/null"), "not a regular file"),
    "a million seeds": (lambda tmp: write(tmp, yaml.safe_dump(spec_data(tmp, seeds=1_000_000))), "seeds"),
    "name escaping output_dir": (lambda tmp: write(tmp, yaml.safe_dump(spec_data(tmp, name=".."))), "name"),
    "NaN in an executor float": (
        lambda tmp: write(tmp, yaml.safe_dump(spec_data(tmp, executor={"lease_s": float("nan")}))), "lease_s"),
    "inf temperature": (
        lambda tmp: write(tmp, yaml.safe_dump(spec_data(tmp, trainer={"rollout": {"temperature": float("inf")}}))),
        "temperature"),
    "NaN reward": (
        lambda tmp: write(tmp, yaml.safe_dump(spec_data(tmp, trainer={"algorithm": {"reward_correct": float("nan")}}))),
        "reward_correct"),
}  # fmt: skip


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_spec_is_refused_in_one_sentence_and_nothing_is_written(tmp_path, case, command):
    make, needle = CASES[case]
    path = make(tmp_path)
    result = CliRunner().invoke(app, [command, str(path)] + (["--dry-run"] if command == "run" else []))
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    message = result.output.strip()
    assert message.startswith("error:") and message.count("\n") == 0, message
    assert not (tmp_path / "out").exists()


def test_expanded_size_is_counted_without_expanding():
    data = yaml.safe_load(ALIAS_BOMB)  # 9^9 leaves if expanded; loading itself shares the lists
    assert expanded_nodes(data) > MAX_EXPANDED_NODES
    # root, keys a and b, the list and its 1 and 2, the inner mapping, its key c and 3
    assert expanded_nodes({"a": [1, 2], "b": {"c": 3}}) == 9


# -- checks before anything is written: validate, run --dry-run and run itself ----------------
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


STORE_CASES = {
    "output folder where no file can be created": (lambda tmp: {"output_dir": "/proc/dapo-x"}, "output_dir"),
    "MLflow server that does not answer": (
        lambda tmp: {"tracking": {"uri": f"http://127.0.0.1:{_free_port()}"}}, "MLflow tracking server"),
    "ledger server that does not answer": (
        lambda tmp: {"ledger": f"postgresql://postgres@127.0.0.1:{_free_port()}/test"}, "ledger database"),
    "MLflow database server that does not answer": (
        lambda tmp: {"tracking": {"uri": f"postgresql://postgres@127.0.0.1:{_free_port()}/test"}}, "tracking.uri"),
}  # fmt: skip


@pytest.mark.parametrize("args", [["validate"], ["run", "--dry-run"], ["run", "--no-progress"]], ids=" ".join)
@pytest.mark.parametrize("case", list(STORE_CASES))
def test_unusable_stores_are_refused_before_anything_is_written(tmp_path, monkeypatch, case, args):
    monkeypatch.chdir(tmp_path)
    make, needle = STORE_CASES[case]
    path = write(tmp_path, yaml.safe_dump(spec_data(tmp_path, **make(tmp_path))))
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(app, [args[0], str(path), *args[1:]])
    assert result.exit_code == 2, result.output
    assert needle in result.output and result.output.strip().count("\n") == 0, result.output
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, not even a probe file
