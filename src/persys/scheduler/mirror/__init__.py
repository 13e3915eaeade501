"""The mirror's store side: the pure fold of store events (keys, values, revisions) into a
`decide.mirror.Mirror`, the one place that reads the key layout into documents. The follower
that loads, watches, reloads and commits is `scheduler.state.ClusterState`."""
