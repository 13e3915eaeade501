"""The scheduler: durable desired state, placement and convergence. It decides; agents execute.

Packages by role, lowest first (each imports only those before it; an import contract checks it):
`placement` (the pure engine), `decide` (the pure step), `config` and `errors`, `mirror` (what a
replica knows), `interpret` (effects into store writes), `rules` (decisions outside the step),
`placing` (placement's edge to the model), `views`, `ha`, `access`, `work` (the loops), `api`
(what each call does), `replica` (one replica's assembly), `rpc` (every gRPC servicer).
docs/architecture.md, "The scheduler's packages", says what each holds."""
