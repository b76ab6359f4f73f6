"""Signed webhooks in SQL: the endpoints (`endpoints.py`: add, list, remove; their secrets never
leave this package but to the sender) and the outbox (`outbox.py`: an event written as delivery
rows in the transaction of the change it reports, claimed, settled, listed and redelivered).

Imports (of mxq): core, db.
"""
