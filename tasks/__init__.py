"""The work: task bodies that run in pinned worker processes. The only package importing MXNet."""
