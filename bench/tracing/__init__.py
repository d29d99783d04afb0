"""``python -m bench.tracing``: what OpenTelemetry tracing adds to a step (issue 38)."""
