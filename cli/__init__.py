"""The `mxq` command: a thin layer over the functions in `workers/` and `db/`. Never imports MXNet."""
