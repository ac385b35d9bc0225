"""dapo_ablate.core."""
