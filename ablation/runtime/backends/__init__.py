"""The trainers a cell can run on (``TrainerConfig.backend``): `registry` holds one `Backend` per
name (the built-in trainer, verl); the verl_* modules are verl's translation, jobs and checks."""
