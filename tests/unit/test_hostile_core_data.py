"""Hostile problem files through core/data.py's loader: each is refused with one
sentence naming the file and the line, record or row, before it costs memory or time; a pipe or a
device is never opened for reading."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_ablate.core import data
from dapo_ablate.core.data import MAX_RECORD_BYTES, DataError, check_data_file, load_problems


JOIN_TIMEOUT_S = 120  # generous: the calls below return in milliseconds; only a blocked call fails


def refusal(path: Path, **kwargs) -> str:
    """The DataError sentence of loading ``path``, which must name the file and fit on one line."""
    with pytest.raises(DataError) as error:
        load_problems(path, **kwargs)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message.removeprefix(f"{path}: ")


def refusal_in_a_thread(path: Path) -> str:
    """refusal(path), failing the test (not hanging it) when the call blocks, as an open of a FIFO would."""
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            load_problems(path)
        except BaseException as error:  # noqa: BLE001 (handed back to the test thread)
            outcome["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(JOIN_TIMEOUT_S)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # a writer end releases the blocked reader
        pytest.fail(f"load_problems({path}) blocked")
    assert isinstance(outcome.get("error"), DataError), outcome
    return str(outcome["error"]).removeprefix(f"{path}: ")


def test_a_jsonl_line_over_the_limit_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "train.jsonl"
    long_line = json.dumps({"prompt": "x" * (20 * MAX_RECORD_BYTES), "answer": "1"})
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + long_line + "\n")
    tracemalloc.start()
    try:
        message = refusal(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith("line 2 is longer than 1 MiB"), message
    assert peak < 4 * MAX_RECORD_BYTES  # the 20 MiB line was never held (old loader: read it whole)


def test_a_json_record_over_the_limit_is_refused_by_its_number(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"prompt": "q", "answer": "1"}, {"prompt": "x" * (MAX_RECORD_BYTES + 1), "answer": "2"}]))
    message = refusal(path)
    assert message.startswith("record 1 holds 1,048,5") and "over the 1 MiB limit of a problem record" in message


def test_a_json_file_over_its_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_JSON_BYTES", 1000)  # the real limit is 64 MiB; the check is the same
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"prompt": f"problem {i}", "answer": str(i)} for i in range(100)]))
    assert "convert it to .jsonl or .parquet" in refusal(path)


def test_a_parquet_row_group_of_oversized_rows_is_refused_from_its_footer(tmp_path, monkeypatch):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["x" * 5000] * 3, "answer": ["1"] * 3}), path)
    monkeypatch.setattr(data, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(data, "_to_problem", lambda *args: pytest.fail("a row was decoded"))
    assert refusal(path).startswith("the rows of row group 0 average")


def test_one_oversized_parquet_row_among_small_ones_is_refused_by_its_row(tmp_path):
    path = tmp_path / "train.parquet"
    prompts = [f"problem {i}" for i in range(200)] + ["x" * (MAX_RECORD_BYTES + 1)]
    pq.write_table(pa.table({"prompt": prompts, "answer": ["1"] * 201}), path)
    assert refusal(path).startswith("row 200 holds")


def test_parquet_batches_shrink_with_wide_rows(tmp_path):
    path = tmp_path / "train.parquet"
    prompts = [f"{i} " + "x" * 500_000 for i in range(3)]
    pq.write_table(pa.table({"prompt": prompts, "answer": ["1"] * 3}), path, use_dictionary=False)
    rows = data._parquet_batch_rows(path, pq.ParquetFile(path).metadata)
    assert rows < data.PARQUET_BATCH_ROWS and rows * 500_000 <= data.PARQUET_BATCH_BYTES  # about 64 MiB a batch
    assert len(load_problems(path)) == 3


def test_non_utf8_jsonl_names_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "q", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    assert refusal(path) == "line 2 is not UTF-8 text (byte 15); save the file as UTF-8."


def test_non_utf8_json_is_one_sentence(tmp_path):
    path = tmp_path / "train.json"
    path.write_bytes(b'[{"prompt": "caf\xe9", "answer": "1"}]')
    assert refusal(path).startswith("the file is not UTF-8 text")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_deeply_nested_json_is_one_sentence_not_a_recursion_error(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(f'{{"prompt": {deep}, "answer": "1"}}\n' if suffix == ".jsonl" else deep)
    assert "nests JSON too deeply to read" in refusal(path)


def test_an_integer_too_long_for_python_is_one_sentence(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "q", "answer": ' + "9" * 5000 + "}\n")
    assert refusal(path).startswith("line 1 holds an integer too long to read")


def test_a_corrupt_parquet_page_behind_a_valid_footer_is_one_sentence(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [f"problem {i} " * 8 for i in range(20_000)], "answer": ["1"] * 20_000}),
                   path, compression="none")
    damaged = bytearray(path.read_bytes())
    for i in range(2000, 200_000, 7):  # inside the first data page, far from the footer
        damaged[i] = 0xFF
    path.write_bytes(bytes(damaged))
    assert "cannot be read" in refusal(path)


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    path = tmp_path / "train.jsonl"
    os.mkfifo(path)
    assert refusal_in_a_thread(path).startswith("is not a regular file (a pipe, socket or device); give the path of a problem file.")


def test_a_fifo_swapped_in_after_the_check_is_refused_on_the_open_descriptor(tmp_path, monkeypatch):
    path = tmp_path / "train.jsonl"
    os.mkfifo(path)
    monkeypatch.setattr(data, "check_data_file", Path)  # as if the path changed between stat and open
    assert refusal_in_a_thread(path).startswith("is not a regular file (a pipe, socket or device); give the path of a problem file.")


def test_a_link_to_dev_zero_is_refused_before_any_byte_is_read(tmp_path):
    path = tmp_path / "train.jsonl"
    path.symlink_to("/dev/zero")
    assert refusal(path).startswith("is not a regular file (a pipe, socket or device); give the path of a problem file.")


def test_a_directory_is_named_as_one(tmp_path):
    path = tmp_path / "train.parquet"
    path.mkdir()
    assert refusal(path) == "is a directory; give the path of a problem file."


def test_check_data_file_reads_nothing_and_passes_a_regular_file(tmp_path):
    good = tmp_path / "train.jsonl"
    good.write_text('{"prompt": "q", "answer": "1"}\n')
    assert check_data_file(str(good)) == good
    fifo = tmp_path / "eval.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        check_data_file(fifo)
    with pytest.raises(DataError, match="no such file"):
        check_data_file(tmp_path / "missing.parquet")
