"""What this host has: its devices (nvidia-smi or CPUs), the GPU code its MXNet build carries, the
GPUs' topology, what pins a worker to its device, a worker's start check bounded in time and its
refusal, and the NVIDIA wheels installed.

Imports (of mxq): core, db, workers.settings, workers.stack_record, workers.paths.
"""
