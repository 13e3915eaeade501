"""Persys automation: policies that scale, remediate and rebalance (docs/automation.md).

Pure decisions (`autoscale`, `remediate`, `rebalance`, `replay`) and, at the edge, the loop that
reads the meter and the store through the client API as its own identity (`loop`)."""
