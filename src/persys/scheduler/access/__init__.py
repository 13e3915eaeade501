"""Who may do what, apart from gRPC: API tokens and their pepper, node join tokens, the audit
log, issued certificates, node revocations, node admission (what a node may say about
itself), input size limits, secret and workload-policy admission, per-node call budgets.
The gRPC interceptor that applies them is `rpc.authorization`."""
