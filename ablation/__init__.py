"""dapo_ablate.ablation."""
