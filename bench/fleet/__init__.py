"""The fleet case: a thousand simulated device workers against one real stack
(`python -m bench --only fleet`): the case (case.py), its simulated devices and roles, the history
it prepares, and its report."""
