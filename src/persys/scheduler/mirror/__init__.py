"""What a replica knows of the cluster. The durable part: the key layout (`keys`), the pure fold
of store events into a `decide.mirror.Mirror` (`fold`, the one place that reads the key layout
into documents; stored workloads the model refuses are quarantined, `quarantine`) and the
follower that loads, watches, reloads and commits (`follower.ClusterState`), with whether it
keeps up (`health`). The live part agents report and nothing stores: per-node facts
(`reports.LiveNode`) and recent utilisation (`load_window`)."""
