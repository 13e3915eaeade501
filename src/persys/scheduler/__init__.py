"""The scheduler: durable desired state, placement and convergence. It decides; agents execute."""
