"""Storage fixtures: loop-device pools for `local`, the nfs-ganesha server for `nfs`."""

from tests.nfs_server import *  # noqa: F403
from tests.storage.loop_pool import *  # noqa: F403
