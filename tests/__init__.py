"""mxq's tests, one folder per concept; conftest.py starts the stacks (the embedded default, and Redis +
PostgreSQL) they run on, and support/ holds the helpers several folders share."""
