"""The benchmark report (`python -m bench` writes it into OUT/): the machine, each case's checks
(aim against measured) and the Markdown that ties them together (markdown.py), and the PNG plots
(plots.py)."""
