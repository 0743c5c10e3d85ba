"""Floor 1, the loop core: loop specs and options, ``apply_loop``, the unrolled reference, cost, checkpoints, the cache check."""
