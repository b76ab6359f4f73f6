"""The schema's history for Alembic: env.py connects, versions/ holds one revision per change
(db/migrate.py runs them).

Imports (of mxq): db.
"""
