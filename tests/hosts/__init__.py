"""GPU hosts on recorded nvidia-smi output, and the GPU extras installed for real."""
