"""What a team sharing a fleet is kept as: its users, their roles and token hashes (`users.py`).

Imports (of mxq): core, db.
"""
