"""How large an id or an offset may be: what PostgreSQL's `integer` holds (jobs.id and the other
ids are INTEGER), so that no number from outside reaches the database as an overflow."""

MAX_ID = 2**31 - 1
