"""What every error mxq prints must be: one line, no traceback."""

from __future__ import annotations


def one_line(stderr: str) -> str:
    """The one line of an error (it fails the test when there are more, or a traceback)."""
    line = stderr.strip()
    assert line and len(line.splitlines()) == 1 and "Traceback" not in line, stderr
    return line
