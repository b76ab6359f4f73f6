"""Putting things right after a fault: the reconciler, and the jobs of a worker that died."""
