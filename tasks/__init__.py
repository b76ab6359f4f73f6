"""The work: task bodies that run in pinned worker processes. The only package importing MXNet.

Imports (of mxq): core, db, workers.
"""
