"""dapo_ablate.cli."""
