"""Decisions outside the step: pure functions over documents and the mirror for volumes (and the
steps their records go through), buckets, revision history and failure statuses. Some still
answer in store operations (a volume's inline records, a revision's record), for the client and
operator writes that do not go through `decide/` yet (issue #32)."""
