"""persysctl's quick paths, the `persysctl` console entry point (`entry.main`): `--version`,
`get workloads|nodes` lists (`entry`), `describe workload|node` and `delete workload` (`verbs`)
and `apply -f FILE` of plain workload manifests (`apply`), over one standard-library mutual-TLS
connection (`gateway`). Every other command line goes unchanged to the full client (`cli.ctl`).

The standard library only (and `cli.output`, `cli.config`, `cli.version`): no typer, rich,
httpx or pydantic is loaded (tests/cli/test_quick_path.py checks it).
"""
