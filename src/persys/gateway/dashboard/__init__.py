"""The operator's web console, served by the gateway at `/` (docs/dashboard.md): server-rendered
pages, one live connection per tab, forms for every mutation. Its own JavaScript and CSS are in
`static/`; nothing is fetched from anywhere else. `routes.dashboard_router` assembles it."""
