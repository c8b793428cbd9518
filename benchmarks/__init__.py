"""nightshift's throughput benchmark: `make bench` (or `python -m benchmarks.bench`)."""
