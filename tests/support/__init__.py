"""Helpers that several test modules share, one module per concept (a test module imports them
from here, never from another test module): images, inference jobs, worker processes, schedules,
and the bad-input corpus's harness."""
