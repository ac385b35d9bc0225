"""A verl run's checkpoints: where its job writes them, and what is kept once the run is done.

verl 0.9.1 saves ``<trainer.default_local_dir>/global_step_<n>/`` (the actor's sharded fp32 weights
and AdamW state, the dataloader's state) every ``save_freq`` steps and at the last step, and writes
``latest_checkpointed_iteration.txt`` beside them for ``resume_mode=auto``. While a job trains,
``trainer.max_actor_ckpt_to_keep`` bounds them, but only among the saves of that job's own process:
a resumed attempt does not remove the folders an earlier attempt left. When a run is done the driver
applies ``executor.checkpoints_when_done`` (`prune_checkpoints`): ``final`` keeps the highest step,
``none`` removes them all, ``all`` leaves them.

Only what this product's job wrote for that run is touched: the run folder's ``checkpoints/``
(``backends.verl.cluster_overrides`` points verl there), never a folder a user's override of
``trainer.default_local_dir`` names (`own_checkpoint_dir` is then None), and in it only real
``global_step_<n>`` folders (not symbolic links) and verl's tracker file. What a job may resume from
is sealed by the task that watches the run's jobs (`verl_seal`): anything else in the folder is set
aside before each submission; pruning drops the pruned steps from that seal.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dapo_ablate.ablation.runtime.backends.verl import CHECKPOINT_DIR, CHECKPOINT_DIR_KEY, override_key
from dapo_ablate.ablation.runtime.backends.verl_seal import SEAL_FILE, STEP_FOLDER, TRACKER, forget
from dapo_ablate.core.config import TrainerConfig


def own_checkpoint_dir(config: TrainerConfig, run_dir: str | Path) -> Path | None:
    """The run folder's ``checkpoints/``, where the run's verl job saves; None when the user's
    ``trainer.verl.overrides`` send verl's checkpoints elsewhere (not ours to remove)."""
    if any(override_key(o) == CHECKPOINT_DIR_KEY for o in config.verl.overrides):
        return None
    return Path(run_dir) / CHECKPOINT_DIR


NO_VALIDATION_BEFORE_TRAINING = "trainer.val_before_train=false"


def resumes(config: TrainerConfig, run_dir: str | Path) -> bool:
    """Whether the run's next job resumes from a checkpoint: verl's tracker file is in the folder its
    jobs save to (the run folder's ``checkpoints/``, or the folder a user's override names). In the
    run folder's own, the tracker was checked against the seal before (`verl_seal`): it names a
    sealed save, or it is gone."""
    overridden = [o.split("=", 1)[1] for o in config.verl.overrides if "=" in o and override_key(o) == CHECKPOINT_DIR_KEY]
    folder = Path(overridden[-1]) if overridden else Path(run_dir) / CHECKPOINT_DIR
    return (folder / TRACKER).is_file()


def resumed_entrypoint(entrypoint: str, config: TrainerConfig, run_dir: str | Path) -> str:
    """A job's entrypoint, told to skip verl's validation before training when it resumes from a
    checkpoint (``trainer.val_before_train``, last on the command line: Hydra keeps the last value).
    The step it resumes at was validated by the attempt that saved it when that step was an
    evaluation step, and the run's first evaluation (step 0) by its first attempt: repeating it costs
    a full evaluation (30,720 samples per cell of the paper's experiment with a 960-row AIME file)."""
    return f"{entrypoint} {NO_VALIDATION_BEFORE_TRAINING}" if resumes(config, run_dir) else entrypoint


def step_folders(folder: Path) -> dict[int, Path]:
    """{step: its ``global_step_<step>`` folder} in `folder` (real folders only)."""
    if not folder.is_dir():
        return {}
    found = {}
    for entry in folder.iterdir():
        match = STEP_FOLDER.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found[int(match.group(1))] = entry
    return found


def prune_checkpoints(folder: Path, policy: str) -> list[Path]:
    """Apply `policy` (``all``, ``final``, ``none``) to the checkpoints in `folder`; the folders
    removed, oldest first. Their entries leave the run's seal (`verl_seal.forget`) as they go."""
    if policy == "all":
        return []
    steps = step_folders(folder)
    keep = {max(steps)} if policy == "final" and steps else set()
    removed = [steps[step] for step in sorted(steps) if step not in keep]
    forget(folder.parent / SEAL_FILE, [step for step in steps if step not in keep])  # first: a seal never names a half-removed folder
    for path in removed:
        shutil.rmtree(path)
    if policy == "none":
        (folder / TRACKER).unlink(missing_ok=True)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed
