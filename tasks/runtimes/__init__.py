"""What runs a model on a device: MXNet and ONNX Runtime, the engine a job gets, the device's context,
CUDA libraries, out-of-memory, the probe.

Imports (of mxq): core, workers, tasks.runner, tasks.job_context.
"""
