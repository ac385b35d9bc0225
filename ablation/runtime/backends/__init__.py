"""Trainers a cell can run on besides the built-in one (``TrainerConfig.backend``)."""
