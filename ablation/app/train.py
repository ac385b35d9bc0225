"""``train``: one configuration, trained into a folder. The config, its data files and its model
folder are checked before anything is written there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.app.errors import check_writable, user_errors
from dapo_ablate.ablation.experiment.overrides import OverrideError, dotted_keys, parse_overrides, unknown_key_sentence
from dapo_ablate.core.atomic import write_text
from dapo_ablate.core.config import BUILTIN, ConfigError, TrainerConfig, load_trainer_config
from dapo_ablate.core.data import DataError, check_data_file
from dapo_ablate.core.policy import check_context, check_model_folder

ERRORS = (ConfigError, OverrideError, DataError)


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainerConfig:
    """The trainer config file with command-line key=value overrides, validated like the file."""
    with user_errors(*ERRORS):
        config = load_trainer_config(path)
        values = parse_overrides(overrides)
        if not values:
            return config
        try:
            return config.with_overrides(values)
        except KeyError as err:
            raise OverrideError(unknown_key_sentence(err.args[0], dotted_keys(config.to_dict()))) from None


def check_inputs(config: TrainerConfig) -> None:
    """The data files and the model folder the config names, checked without loading them (no
    torch): a FIFO, a directory, a missing or garbage model folder, a response ceiling beyond the
    model's positions are one sentence before anything is written."""
    with user_errors(*ERRORS):
        for name in (config.data.train, config.data.eval):
            if name != BUILTIN:
                check_data_file(name)
        if config.model.path != BUILTIN:
            check_model_folder(config.model.path, config.model.trust_remote_code)
        check_context(config.model.path, 1, config.rollout.max_response_len)


def train(config: TrainerConfig, out: Path, *, resume: bool = True,
          callbacks: list[Callable[[str, int, dict[str, Any]], None]] | None = None) -> Any:
    """Train `config` into `out` (its resolved config in out/config.json, then result.json and
    checkpoints); the trainer's `RunResult`."""
    check_inputs(config)
    check_writable(out)
    write_text(out / "config.json", json.dumps(config.to_dict(), indent=1))  # never through a link in --out
    from dapo_ablate.core.trainer import train as run_training  # torch loads only here

    with user_errors(*ERRORS):
        return run_training(config, out, callbacks=callbacks or [], resume=resume)
