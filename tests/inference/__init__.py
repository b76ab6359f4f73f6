"""Bulk inference through real workers: inputs, engines, batching, outputs, models and their proof."""
