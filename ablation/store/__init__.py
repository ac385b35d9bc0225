"""Where runs are kept: the ledger (SQL or in memory), the results tables read back from it, MLflow
tracking and its metric names, and riding out a store's blips."""
