"""Reads for people and scripts: job history and its JSON record."""
