"""What jobs produced: predictions as SQL rows or Parquet files, a job's results wherever stored, training
epochs, and a job's log (what it printed, bounded).

Imports (of mxq): core, db.
"""
