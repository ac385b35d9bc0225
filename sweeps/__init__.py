"""dapo_ablate.sweeps."""
