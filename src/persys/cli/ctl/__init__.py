"""`persysctl`'s full client: the typer command tree (`app`), the gateway transport, errors and
output formats every command shares (`api`), and one module per command group (`*_cmds`,
`*_cmd`), the live streams (`follow`), interactive terminals (`terminal_client`), printed views
read back as manifests (`views`) and the command's tracing span (`tracing`).

Loaded only when the quick path (`cli.quick`) hands a command line over: typer, rich, httpx and
the pydantic models live here, never in `cli.quick` or `cli.output`.
"""
