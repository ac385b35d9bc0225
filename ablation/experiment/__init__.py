"""What an experiment is: its spec, its design (cells, seeds, orderings), its fractions, the plan
`validate` prints, and each run's identity. Plain data and arithmetic: no Ray, SQL or MLflow."""
