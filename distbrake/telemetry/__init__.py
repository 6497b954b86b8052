"""Observability: metrics (OpenTelemetry, Prometheus), span events, callbacks, health, the fleet view.

Nothing here imports opentelemetry or prometheus_client until a brake is
built that uses them (`build.py`); `import distbrake` never does.
"""
