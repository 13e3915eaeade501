"""Placement's edge to the model: the adapter between the durable documents and the pure engine
(`engine_adapter.PlacementService`: requests from workloads, the base snapshot and the
reservation ledger), what-if questions over the current cluster (`whatif`), queueing hints (which
Pending instances a node change could help) and the decisions' trace spans. The placer that
commits decisions is `work.placer`."""
