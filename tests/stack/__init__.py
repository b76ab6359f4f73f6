"""The stack as a user runs it: up and down, workers and their supervision, the CLI as a process, Compose."""
