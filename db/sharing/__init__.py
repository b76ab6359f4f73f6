"""What a team sharing a fleet is kept as: its users, their roles and token hashes (`users.py`),
and what admission and preemption read and write (`admission.py`, `preemption.py`), a job's
wait for others included (`dependencies.py`: `--after`).

Imports (of mxq): core, db.
"""
