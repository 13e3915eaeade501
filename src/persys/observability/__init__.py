"""Observability shared by every process: Prometheus metrics and OpenTelemetry tracing.

At the bottom of the layers (beside `model`): the store, the event bus, the scheduler, the agent
and the gateway all instrument themselves through it, and it imports none of them.
"""
