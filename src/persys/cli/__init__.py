"""Command-line entry points: `persys` (servers) and `persysctl` (client)."""
