"""Shared fixtures: real etcd/Redis servers and the Docker engine (started on demand)."""

import pytest

from tests.docker_fixtures import *  # noqa: F403
from tests.fixtures_infra import *  # noqa: F403
from tests.lanes import mark_unit_tests


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_unit_tests(items)  # the fast lane's selection (tests/lanes.py)
