"""Scheduled retraining: cron times, the schedule process's fires and control tasks, and where a
schedule's dataset comes from.
"""
