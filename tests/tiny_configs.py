"""Trainer settings shared by the tests (a module, not a fixture, so specs and params can use them)."""

# A real training run on the built-in policy in a few seconds: 8 prompts x 4 samples, 4 steps.
TINY_TRAINER = {
    "model": {"threads": 1},
    "data": {"num_eval_problems": 8},
    "rollout": {"max_response_len": 32, "eval_k": 4},
    "algorithm": {"group_size": 4, "overlong_cache": 8, "gen_prompts_per_round": 8, "max_gen_rounds": 2},
    "optim": {"lr": 5e-4, "warmup_steps": 1},
    "batch": {"prompts_per_step": 8, "mini_batch_size": 16},
    "schedule": {"total_steps": 4, "eval_every": 2},
}

# The quickstart's scale, for specs and plans that are validated but never trained.
QUICKSTART_SHAPE = {
    "batch": {"prompts_per_step": 64, "mini_batch_size": 128},
    "algorithm": {"group_size": 8, "overlong_cache": 8},
    "rollout": {"max_response_len": 32, "eval_k": 8},
    "schedule": {"total_steps": 20},
}

# The trainer config of the CLI round-trip tests, whose stand-in cell functions never train it.
STAND_IN_TRAINER = {
    "rollout": {"eval_k": 4, "max_response_len": 32},
    "algorithm": {"group_size": 4, "overlong_cache": 8},
    "batch": {"prompts_per_step": 8, "mini_batch_size": 16},
    "schedule": {"total_steps": 6, "eval_every": 2},
}
