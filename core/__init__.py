"""mxq: a batch system for deep-learning work on GPUs.

This folder is the package `mxq` itself: value types, errors and pure rules that every layer
uses and that do no I/O. The layers are its subpackages, each in a top-level folder of the
repository (pyproject.toml's package-dir): `mxq.db` (db/), `mxq.workers` (workers/),
`mxq.tasks` (tasks/), `mxq.api` (api/) and `mxq.cli` (cli/). ARCHITECTURE.md has the map.

Imports (of mxq): none of mxq's layers (they import it).
"""
