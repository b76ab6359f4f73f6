"""What jobs produced: predictions as SQL rows or Parquet files, a job's results wherever stored, and training
epochs.

Imports (of mxq): core, db.
"""
