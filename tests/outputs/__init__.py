"""Tests of what a model outputs beyond classes: embeddings, regression values, multi-label tags."""
