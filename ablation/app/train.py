"""``train``: one configuration, trained into a folder. The config, its data files and its model
folder are checked before anything is written there, and so is the folder itself: a folder that
holds another config's result is refused (`check_out`) unless the caller forces a fresh start.

While it trains, `StepLines` writes verl's console lines (``step:N - name:value - ...``, the names
of `dapo_ablate.ablation.store.metric_names`) and, with a tracking URI, `train_tracking` logs the
run to MLflow under the same names as `run`'s child runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.app.errors import UserError, check_writable, user_errors
from dapo_ablate.ablation.experiment.overrides import OverrideError, dotted_keys, parse_overrides, unknown_key_sentence
from dapo_ablate.ablation.store import metric_names as names
from dapo_ablate.core.atomic import write_text
from dapo_ablate.core.config import BUILTIN, ConfigError, TrainerConfig, build_trainer_config, load_trainer_config
from dapo_ablate.core.data import DataError, check_data_file
from dapo_ablate.core.result import ResultNotSaved
from dapo_ablate.core.policy import builtin_recipe, check_context, check_model_folder, wait_for_builtin

ERRORS = (ConfigError, OverrideError, DataError)
WRITTEN = ("config.json", "result.json", "checkpoint.pt")
"""What `train` writes into its folder (and all that `--force` removes there)."""

TrainerCallback = Callable[[str, int, dict[str, Any]], None]
"""The trainer's callback(kind, step, data): kind "step" (its signals) or "eval" (its metrics)."""


@dataclass(frozen=True)
class TrainOptions:
    """How `train` treats its folder and where it logs."""

    resume: bool = True
    """Continue from a checkpoint of the same config in the folder."""
    force: bool = False
    """Start over in a folder that holds a result (another config's, or this one's)."""
    tracking_uri: str | None = None
    """MLflow tracking URI to log the run to (None: no tracker)."""
    experiment: str = "train"
    """The MLflow experiment the run is logged in."""


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


def train(config: TrainerConfig, out: Path, options: TrainOptions = TrainOptions(),
          callbacks: list[TrainerCallback] | None = None, say: Callable[[str], None] = print) -> Any:
    """Train `config` into `out` (its resolved config in out/config.json, then result.json and
    checkpoints); the trainer's `RunResult`. `say` prints what the command waits on."""
    check_inputs(config)
    check_out(config, out, force=options.force)
    check_writable(out)
    finished = finished_result(config, out) if options.resume and not options.force else None
    if finished is not None:  # the same config's run is done: its result, not a second training
        say(f"{out / 'result.json'} holds this config's finished run: nothing to train (--force trains it again)")
        return finished
    tracking = open_tracking(config, out, options)  # an unreachable store stops before --force removes anything
    if options.force:
        clear_out(out)
    listeners = list(callbacks or []) + ([tracking.log_event] if tracking else [])
    try:
        wait_for_builtin_policy(config, say)
        write_text(out / "config.json", json.dumps(config.to_dict(), indent=1))  # never through a link in --out
        from dapo_ablate.core.trainer import train as run_training  # torch loads only here

        with user_errors(*ERRORS):
            result = run_training(config, out, callbacks=listeners, resume=options.resume and not options.force)
    except ResultNotSaved as err:  # trained, but result.json could not be written: keep the result
        kept_elsewhere(err, tracking, options, say)
    except BaseException as err:
        if tracking:
            tracking.end("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    if tracking:
        tracking.finish(result)
        say(f"logged to MLflow {options.tracking_uri}: experiment {options.experiment!r}, run {tracking.run_id} "
            f"(`mlflow ui --backend-store-uri {options.tracking_uri}`)")
    return result


def kept_elsewhere(err: ResultNotSaved, tracking: Any, options: TrainOptions, say: Callable[[str], None]) -> None:
    """A finished run whose result.json could not be written: its result goes to MLflow (with
    --tracking) and to the console as JSON, then one sentence (UserError) says where it is."""
    logged = ""
    if tracking:
        try:
            tracking.finish(err.result)
            logged = f" and logged to MLflow {options.tracking_uri} (run {tracking.run_id})"
        except Exception:  # noqa: BLE001 - the store may share the full disk; the console still has it
            tracking.end("FAILED")
    say(json.dumps(err.result.to_dict()))
    raise UserError(
        f"training finished, but {err.filename} could not be written ({err.reason}); its result is printed above as "
        f"JSON{logged}: free space (or pick another --out) and save that line as result.json, or rerun the same "
        "command to train again from the last checkpoint"
    ) from None


def finished_result(config: TrainerConfig, out: Path) -> Any | None:
    """The `RunResult` in ``out/result.json`` when it is this config's whole run (its recorded
    config equal to `config`, every step trained); None otherwise."""
    from dapo_ablate.core.result import RunResult

    path = out / "result.json"
    if not path.is_file() or path.is_symlink():
        return None
    try:
        result = RunResult.load(path)
    except (OSError, ValueError, TypeError):
        return None
    recorded = getattr(result, "config", None)
    if not isinstance(recorded, dict) or config_differences(recorded, config):
        return None
    return result if result.steps >= config.schedule.total_steps else None


def open_tracking(config: TrainerConfig, out: Path, options: TrainOptions) -> Any | None:
    """The run's MLflow run (`train_tracking.TrainRun`) when `options` name a tracking URI: the one
    this folder and config logged before when training resumes from its checkpoint, else a new one."""
    if not options.tracking_uri:
        return None
    from dapo_ablate.ablation.app.train_tracking import open_train_run  # MLflow loads only here

    resumes = options.resume and not options.force and (out / "checkpoint.pt").is_file()
    return open_train_run(options.tracking_uri, options.experiment, config, out, fresh=not resumes)


# ---------------------------------------------------------------------------------- the folder
def recorded_config(out: Path) -> dict[str, Any] | None:
    """The resolved config a previous `train` recorded in `out` (config.json, else the config in
    result.json), or None when it recorded none. UserError for a record that is not JSON."""
    for name, pick in (("config.json", lambda data: data), ("result.json", lambda data: data.get("config"))):
        path = out / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UserError(f"--out {str(out)!r} holds a {name} that is not a trainer's record ({type(err).__name__}); "
                            "pass --force to train there from scratch, or choose another --out") from None
        recorded = pick(data) if isinstance(data, dict) else None
        if isinstance(recorded, dict):
            return recorded
    return None


def config_differences(recorded: dict[str, Any], config: TrainerConfig) -> list[str]:
    """``field old -> new`` for each dotted field where the recorded config differs from `config`
    (the record is resolved like a config file first, so a default it omits is not a difference)."""
    try:
        recorded = build_trainer_config(recorded, source="recorded config").to_dict()
    except ConfigError:
        pass  # a record of another version of the trainer: compared as it stands
    old, new = _leaves(recorded), _leaves(config.to_dict())
    return [f"{key} {json.dumps(old.get(key, '(absent)'))} -> {json.dumps(new.get(key, '(absent)'))}"
            for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def check_out(config: TrainerConfig, out: Path, *, force: bool) -> None:
    """Refuse, before anything is written, an `out` that holds another config's result, naming the
    fields that differ and `--force` (which starts over there)."""
    if force or not out.is_dir():
        return
    recorded = recorded_config(out)
    if recorded is None:
        return
    differences = config_differences(recorded, config)
    if differences:
        shown = ", ".join(differences[:5]) + (f" and {len(differences) - 5} more" if len(differences) > 5 else "")
        raise UserError(f"--out {str(out)!r} holds the result of another config ({shown}); pass --force to train this "
                        "config there from scratch, or choose another --out")


def clear_out(out: Path) -> None:
    """Remove what `train` wrote in `out` (`WRITTEN`; a link is removed, not what it points to);
    anything else there stays."""
    for name in WRITTEN:
        try:
            (out / name).unlink(missing_ok=True)
        except OSError as err:
            raise UserError(f"--force could not remove {str(out / name)!r} ({err.strerror}); remove it "
                            "yourself or choose another --out") from None


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted leaves: {"algorithm.eps_high": 0.28, ...}."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# ----------------------------------------------------------------------------- waiting on a lock
def wait_for_builtin_policy(config: TrainerConfig, say: Callable[[str], None]) -> None:
    """Wait, saying so once, while another process builds the built-in policy this config needs
    (`core.policy.wait_for_builtin`); return at once for a model folder or when nobody builds it."""
    if config.model.path == BUILTIN:
        recipe = builtin_recipe(config.model, config.data.builtin_task)
        wait_for_builtin(recipe, lambda holder: say(f"waiting for the built-in policy build held by {holder} ..."))


# ---------------------------------------------------------------------------------- the console
CONSOLE_STEP_NAMES = (
    names.step_name("reward"), names.step_name("entropy"), names.step_name("response_length"), names.PG_CLIPFRAC,
    names.step_name("clipfrac_high"), names.step_name("clipfrac_low"),
)
"""verl's names of the training signals a console line shows (critic/score/mean, actor/entropy,
response_length/mean, actor/pg_clipfrac and its upper / lower parts), then ``timing_s/step``."""
STEP_TIME_NAME = "timing_s/step"
"""verl's seconds of a whole step: generation, scoring and update (and the evaluation after it)."""
STEP_TIME_PARTS = ("time_rollout_s", "time_reward_s", "time_update_s")


class StepLines:
    """verl's console lines, ``step:N - name:value - ...``, written through `write` for every
    `every`-th step, the last step and each evaluation (step 0's included; its line carries the
    ``val-core/<source>/acc/...`` accuracies, named as verl's console prints them, with ``@``).
    `every` 0 writes none. A step that evaluates is written once, after its evaluation."""

    def __init__(self, config: TrainerConfig, every: int, write: Callable[[str], None]) -> None:
        self.schedule, self.every, self.write = config.schedule, every, write
        self.source = names.eval_source(config.to_dict())
        self.pending: dict[int, dict[str, float]] = {}

    def __call__(self, kind: str, step: int, data: dict[str, Any]) -> None:
        if not self.every:
            return
        if kind == "step":
            values = self.step_values(data)
            if self.schedule.evaluates_after(step):
                self.pending[step] = values  # written with its evaluation
            elif step % self.every == 0 or step == self.schedule.total_steps:
                self.write(console_line(step, values))
        elif kind == "eval":
            values = {**self.pending.pop(step, {}), **self.eval_values(data)}
            if STEP_TIME_NAME in values and isinstance(data.get("time_eval_s"), (int, float)):
                values[STEP_TIME_NAME] += float(data["time_eval_s"])
            self.write(console_line(step, values))

    @staticmethod
    def step_values(signals: dict[str, Any]) -> dict[str, float]:
        renamed = names.step_metrics(signals)
        values = {name: float(renamed[name]) for name in CONSOLE_STEP_NAMES if _numeric(renamed.get(name))}
        parts = [signals.get(key) for key in STEP_TIME_PARTS]
        if all(_numeric(part) for part in parts):
            values[STEP_TIME_NAME] = float(sum(parts))
        return values

    def eval_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        """The evaluation's ``val-core`` accuracies under verl's console names (MLflow's ``_at_``
        is ``@`` on verl's console)."""
        prefix = f"val-core/{self.source}/"
        values = {}
        for name, value in names.eval_metrics(metrics, self.source).items():
            if name.startswith(prefix) and _numeric(value):
                values[prefix + name[len(prefix):].replace("_at_", "@")] = float(value)
        return values


def console_line(step: int, values: dict[str, float]) -> str:
    """``step:N - name:value - ...`` as verl's console logger writes it (values to 4 decimals)."""
    return " - ".join([f"step:{step}", *(f"{name}:{round(value, 4)!r}" for name, value in values.items())])


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@contextlib.contextmanager
def weight_loading_bars_off() -> Iterator[None]:
    """transformers' "Loading weights" bar (and the hub's download bars) off within the block, as
    they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
