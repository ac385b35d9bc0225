"""What a setting is: its model's family, size and type, its task and its response-length ceiling.

A transfer study's settings (and an experiment without settings, as one setting) are described by
these attributes so that reports can group and compare by them, predictions can say which setting
they came from and which they are for, and published effects can be matched to a setting. Each
attribute is, in order of precedence: the setting's own ``attributes:``, the spec's top-level
``attributes:``, or a default read from the setting's trainer config where it says it:

- ``max_response_len``: ``rollout.max_response_len``;
- ``task``: the built-in task's name (``data.builtin_task``) for built-in data, else the training
  file's name without its suffix (``dapo-math-17k`` for ``/data/dapo-math-17k.parquet``);
- ``model_family`` / ``model_size`` / ``model_type``: the built-in policy is family ``builtin`` of
  size ``small`` or ``large``; a checkpoint's folder name is read the way Hugging Face names
  them (``Qwen2.5-7B-Instruct``: family ``qwen2.5``, size ``7B``, type ``instruct``;
  ``DeepSeek-R1-Distill-Qwen-1.5B``: type ``distilled``). A name that does not say leaves the
  attribute unknown (None) rather than guessed; give it in ``attributes:``.

The attributes describe; they are not part of the design: changing them never re-runs a cell or
rebinds an experiment's name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dapo_ablate.core.config import BUILTIN, TrainerConfig
from dapo_ablate.core.contracts import SETTING_ATTRIBUTES, SettingInfo

SIZE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?[BbMm])(?![A-Za-z0-9])")
"""A parameter count in a checkpoint name: ``7B``, ``1.5B``, ``360M``."""
TYPE_MARKERS = (("distilled", re.compile(r"distill", re.I)),
                ("instruct", re.compile(r"instruct|(?<![a-z])(it|chat)(?![a-z])", re.I)))  # fmt: skip


class SettingAttributes(BaseModel):
    """A setting's attributes as a spec states them; a field left out is read from the trainer."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model_family: str | None = Field(None, min_length=1, max_length=64)
    """The model's family, e.g. ``qwen2.5``, ``llama3``, ``qwen3`` (compared case-insensitively)."""
    model_size: str | None = Field(None, min_length=1, max_length=16)
    """Its parameter count as published, e.g. ``32B``, ``1.5B``."""
    model_type: Literal["base", "instruct", "distilled"] | None = None
    """base (pretrained only), instruct (aligned) or distilled (from a reasoning model)."""
    task: str | None = Field(None, min_length=1, max_length=64)
    """The training task or data set, e.g. ``dapo-math-17k``, ``addition``."""
    max_response_len: int | None = Field(None, ge=1)
    """The response-length ceiling in tokens."""

    @field_validator("model_size", mode="before")
    @classmethod
    def _size_text(cls, value: object) -> object:
        return value if value is None or isinstance(value, str) else str(value)


def model_attributes(trainer: TrainerConfig) -> dict[str, str | None]:
    """Family, size and type of the trainer's model, as far as its path names them."""
    if trainer.model.path == BUILTIN:
        return {"model_family": BUILTIN, "model_size": trainer.model.builtin_size, "model_type": None}
    name = Path(trainer.model.path.rstrip("/")).name
    size = SIZE.search(name)
    kind = next((kind for kind, marker in TYPE_MARKERS if marker.search(name)), None)
    family = name[: size.start()].rstrip("-_ ") if size else None
    return {"model_family": family.lower() if family else None, "model_size": size.group(1).upper() if size else None,
            "model_type": kind}  # fmt: skip


def trainer_attributes(trainer: TrainerConfig) -> dict[str, object]:
    """The attributes a trainer config says (module docstring)."""
    task = trainer.data.builtin_task if trainer.data.train == BUILTIN else Path(trainer.data.train).stem.lower()
    return {**model_attributes(trainer), "task": task, "max_response_len": trainer.rollout.max_response_len}


def setting_info(name: str, trainer: TrainerConfig, *stated: SettingAttributes | None) -> SettingInfo:
    """The setting ``name`` described: the trainer's defaults, overridden by each of ``stated`` in
    turn (the spec's top-level attributes, then the setting's own)."""
    values = trainer_attributes(trainer)
    for attributes in stated:
        if attributes is not None:
            values |= attributes.model_dump(exclude_none=True)
    return SettingInfo(name, **{key: values.get(key) for key in SETTING_ATTRIBUTES})
