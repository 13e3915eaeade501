"""High availability: the elected active replica (store lease), fast takeover after a crash,
active-active membership (who serves which node) and the mode guard that freezes the
control plane when the store cannot be trusted."""
