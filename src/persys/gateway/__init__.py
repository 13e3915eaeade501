"""The REST gateway over the scheduler's gRPC API."""
