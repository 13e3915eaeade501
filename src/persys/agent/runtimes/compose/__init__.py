"""Compose runtime: `type: compose` workloads as Docker Compose v2 projects on the local engine."""
