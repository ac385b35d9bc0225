"""The error a user fixes about where or how an experiment runs (a folder, a database, a store that
stays down, a Ray address): one sentence, mapped by the CLI to exit 2. It lives with the stores
because riding out a store's blips (`store.transient`) ends in it."""


class ExecutorError(ValueError):
    """A problem with where or how the experiment runs that the user fixes; one sentence."""
