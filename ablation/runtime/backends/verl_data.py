"""What a verl cell reads from disk, looked at before any GPU is allocated: the model folder, the
parquet files, and the evaluation set's size.

verl 0.9.1 validates every row of ``data.val_files`` ``val_kwargs.n`` times, each row under its own
uid (``ray_trainer._validate``): an evaluation costs rows x n samples, and ``mean@n`` is the mean
over rows. A file that repeats each problem (verl's DAPO recipe validates AIME 2024 as 30 problems
x 32 copies, 960 rows, with n=1) therefore gives the same avg@n with n=32 at 32 times the cost;
`EvalSet` counts the rows and the distinct prompts so that ``validate`` can show both.

These functions run on the driver's machine (``validate``) and on every node (the cluster check:
``verl_cluster``), where the paths must be the same (shared storage).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
"""A Hugging Face hub name (``Qwen/Qwen2.5-32B``): downloaded by each node, not a path to check."""


@dataclass(frozen=True)
class EvalSet:
    """The held-out parquet file as verl validates it."""

    rows: int
    prompts: int | None
    """Distinct prompts (None without a ``prompt`` column)."""

    def samples(self, n: int) -> int:
        """Responses one evaluation generates at ``val_kwargs.n`` = `n`."""
        return self.rows * n

    def describe(self, n: int) -> str:
        text = f"{self.rows:,} rows x val n {n} = {self.samples(n):,} samples per evaluation"
        if self.prompts is not None and self.prompts < self.rows:
            text += (f" ({self.prompts:,} distinct prompts, each about {self.rows / self.prompts:.3g} times: "
                     f"the same avg@{n} from one copy of each costs {self.prompts * n:,})")
        return text


def is_remote(path: str) -> bool:
    """A URI verl fetches itself (``hdfs://``, ``s3://``): not checked on disk."""
    return "://" in path


def eval_set(path: str) -> EvalSet | None:
    """Rows and distinct prompts of parquet file `path`; None where it is not a readable parquet
    file on this machine (the cluster check then reports it)."""
    if is_remote(path) or not path.endswith(".parquet") or not Path(path).expanduser().is_file():
        return None
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(Path(path).expanduser())
        rows = file.metadata.num_rows
        if "prompt" not in file.schema_arrow.names:
            return EvalSet(rows, None)
        prompts = file.read(columns=["prompt"]).column("prompt").to_pylist()
    except Exception:  # noqa: BLE001 - not parquet, truncated, an LFS pointer: `data_file_problem` says which
        return None
    return EvalSet(rows, len({repr(prompt) for prompt in prompts}))


def data_file_problem(field: str, path: str) -> str | None:
    """Why verl could not read data file `path` here (None when it can): missing, or not parquet."""
    if is_remote(path):
        return None
    where = Path(path).expanduser()
    if not where.is_file():
        return f"{field} {path} is not a file here"
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            pq.read_metadata(where)
        except Exception as err:  # noqa: BLE001 - the reason is the finding
            return f"{field} {path} is not a readable parquet file ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    return None


def model_path_problem(path: str) -> str | None:
    """Why verl could not load model `path` here (None when it can, or when it is a hub name that
    exists nowhere on disk): a folder with a ``config.json``."""
    where = Path(path).expanduser()
    if not where.exists() and HUB_NAME.fullmatch(path) and not path.startswith("."):
        return None
    if not (where / "config.json").is_file():
        return f"model.path {path} is not a Hugging Face checkpoint folder here (no config.json)"
    return None
