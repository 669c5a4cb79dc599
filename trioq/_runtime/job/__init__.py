"""A job's life in a worker: the claim loop, the executor and its per-run object, the outcome
and the completer that settles it."""
