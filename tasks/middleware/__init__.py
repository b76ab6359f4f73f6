"""What runs around every job's run, outside its body (as dramatiq's middleware does): each
concern a middleware of its own module, and the runner calls them in order (`runner.MIDDLEWARE`).

Imports (of mxq): core, db, workers.
"""
