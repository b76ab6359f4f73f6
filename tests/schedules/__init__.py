"""Scheduled retraining: cron times, the tick, a schedule end to end."""
