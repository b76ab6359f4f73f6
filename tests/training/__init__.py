"""Training: data-parallel, datasets, multi-node on one machine and across network namespaces."""
