"""Faults on real processes: killed, paused and stalled workers, broker and database outages, load,
secrets kept out of logs."""
