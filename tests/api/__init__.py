"""The HTTP API, its contract, the Python client, the dashboard, Flower, Prometheus and the SQL views."""
