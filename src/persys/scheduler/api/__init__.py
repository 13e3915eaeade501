"""What each call does behind the servicers: clients' and operators' changes and reads
(workloads, nodes, volumes, buckets, automation policies and the automation lease, backup,
replay) and agents' calls (registration, heartbeats, reports, their volumes' attachments and
steps). The bucket watch, a loop over the bucket API, sits beside it. Only `node_volumes`
touches protobuf: it builds the agents' VolumeTask messages."""
