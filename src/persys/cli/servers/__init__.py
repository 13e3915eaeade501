"""`persys`, the server entry point (`app.main`): `scheduler`, `agent`, `gateway` (`app`),
`automation` (`automation`), `dev` (all in one process on embedded defaults: `dev_cmd`,
`dev_automation`) and `certs` (`certs_cmds`, `vault_cmds`, `vault_issue`); the options they
share and turn into running parts (`common`, `backend_opts`, `identity_options`, `join_setup`,
`signer_options`, `tracing_opts`) and the one error they end with (`errors`).
"""
