"""`python -m bench` end to end, on the quick sizes."""
