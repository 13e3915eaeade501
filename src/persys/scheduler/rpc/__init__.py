"""Every gRPC servicer, by audience (`client/`: persysctl, the gateway, automation; `node/`: nodes
joining and renewing their certificate), the authorization interceptor, the mapping of errors to
status codes, the meter a scheduler process may host (`meter_host`) and the server that serves
them all (`server`). `agent_control` and `secrets` serve both audiences. Only this package (and
a few named edges) imports grpc and persys._pb (an import contract in pyproject.toml)."""
