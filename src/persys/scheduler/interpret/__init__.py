"""The one interpreter of the pure step's `Effects` (decide/): intents become store operations
under the key layout (`ops`), a `Planner` lands them (the store through the fenced, grouped
commits; a test's planner may refuse or land part of a plan without a store), and the
`Interpreter` follows each write's outcome, publishes events and wakes delivery."""
