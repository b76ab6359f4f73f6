"""Job records in SQL: schema, engine, migrations and history queries. Imports SQLAlchemy only.

Imports (of mxq): core.
"""
