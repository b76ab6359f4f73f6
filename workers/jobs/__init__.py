"""A job's way in: the parameters each kind accepts, submit, and cancel."""
