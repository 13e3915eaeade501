"""The compute agent: applies desired state to local runtimes, reports actual state."""
