"""Training: the data-parallel job, its loop and child process, multi-node training, and the training
datasets.
"""
