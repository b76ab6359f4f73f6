"""Reads for people and scripts: job history and its JSON record.

Imports (of mxq): core, db.
"""
