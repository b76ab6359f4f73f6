"""The benchmark report (`python -m bench` writes it into OUT/): each case's checks, aim against
measured (checks.py), the machine and the Markdown that ties them together (markdown.py), and
the PNG plots (plots.py)."""
