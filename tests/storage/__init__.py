"""Object storage: inputs read from an S3-compatible server (moto's, on loopback) by ranges."""
