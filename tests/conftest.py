"""Shared fixtures: real etcd/Redis servers and the Docker engine (started on demand)."""

from tests.docker_fixtures import *  # noqa: F403
from tests.fixtures_infra import *  # noqa: F403
