"""Bulk inference: the job, its input readers, batching, the read/compute/write pipeline, and where
predictions go.
"""
