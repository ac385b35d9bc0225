"""dapo_ablate.core: the DAPO trainer (config, tasks and data, verifier, rewards, advantages,
losses, dynamic sampling, rollout engines, train loop, evaluation).

`train`, `TrainerConfig`, `RunResult` and `load_trainer_config` are imported lazily, so that
light users of the package (the CLI's `validate`, the scheduler's driver) do not pay for torch.
"""

__all__ = ["train", "TrainerConfig", "RunResult", "load_trainer_config"]


def __getattr__(name: str):
    if name == "train":
        from .trainer import train

        return train
    if name in ("TrainerConfig", "load_trainer_config"):
        from . import config

        return getattr(config, name)
    if name == "RunResult":
        from .result import RunResult

        return RunResult
    raise AttributeError(name)
