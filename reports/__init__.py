"""dapo_ablate.reports."""
