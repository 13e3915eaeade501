"""The one interpreter of the pure step's `Effects` (decide/): intents become store operations
under the key layout (`ops`), a `Planner` lands them (the store through the fenced, grouped
commits; a test's planner may refuse or land part of a plan without a store), and the
`Interpreter` follows each write's outcome, publishes events and wakes delivery. The grouped
commit (`group_commit`: many small compare-and-swap writes as few transactions, with room for
the fence's compares) also carries the client and operator writes that are not intents yet."""
