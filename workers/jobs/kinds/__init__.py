"""Each job kind's parameters and its submit-time checks, one module per kind (probe, infer,
train, register, arch); what they share in params.py.

Imports (of mxq): core, db, workers.broker, workers.storage, workers.settings, workers.paths.
"""
