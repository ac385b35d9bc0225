"""The Ray executor's mechanics with cheap cell functions, and one end-to-end run of the real
trainer through Ray, the ledger and MLflow. One local Ray serves the whole module.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_executor_e2e.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.preflight import check_ray_address, check_writable_folder
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV, describe_error, resolve_cell_fn
from dapo_ablate.ablation.store.errors import ExecutorError


# -- checks that need no Ray --------------------------------------------------------------------
def test_describe_error_names_type_message_and_place():
    assert describe_error(KeyError("x")) == "KeyError: 'x'"
    assert describe_error(RuntimeError()) == "RuntimeError"


def test_folder_checks_create_nothing(tmp_path: Path):
    check_writable_folder(tmp_path / "a" / "b", "output_dir")
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ExecutorError, match="output_dir.*is a file"):
        check_writable_folder(tmp_path / "file" / "runs", "output_dir")


def test_unreachable_or_malformed_ray_address():
    with pytest.raises(ExecutorError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        check_ray_address("127.0.0.1:1")
    with pytest.raises(ExecutorError, match="not host:port"):
        check_ray_address("nowhere")


def test_cell_function_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CELL_FN_ENV, "os.path:join")
    assert resolve_cell_fn(None) is os.path.join
    monkeypatch.setenv(CELL_FN_ENV, "no_such_module_x:f")
    with pytest.raises(ExecutorError, match=CELL_FN_ENV):
        resolve_cell_fn(None)
