"""Opening a replica's state store and event stream with the credentials they are run with.

Credentials are resolved here, before anything is opened (`secret:` references through the
secret store's resolver), and each backend is asked once whether it accepts who we are: a wrong
password, TLS identity or role stops the replica at start with a message naming the option, while
a backend that is merely down does not (the replica starts frozen, or without events, and waits).
"""

from __future__ import annotations

import contextlib

from persys.backend_access import BackendAccess
from persys.credentials import SecretResolver
from persys.events import EventBus, open_events
from persys.events.redis_stream import RedisEventBus
from persys.store import StateStore, open_store
from persys.store.base import AccessCheck
from persys.tlsfiles import TLSFiles


class BackendRefused(Exception):
    """A backend refused this replica's credentials or TLS identity; the text says which option to check."""


async def open_backends(store_url: str, events_url: str, store_tls: TLSFiles | None,
                        store_access: BackendAccess | None, events_access: BackendAccess | None,
                        secrets: SecretResolver | None) -> tuple[StateStore, EventBus]:
    if store_tls is not None and store_access is not None and store_access.tls is not None:
        raise ValueError("give the store's TLS files once: store_tls or store_access.tls")
    store_login = await store_access.login(secrets) if store_access is not None else None
    events_login = await events_access.login(secrets) if events_access is not None else None
    tls = store_access.tls if store_access is not None and store_access.tls is not None else store_tls
    store = open_store(store_url, tls=tls, login=store_login)
    events = open_events(events_url, tls=events_access.tls if events_access else None, login=events_login)
    try:
        if store_access is not None and isinstance(store, AccessCheck):
            await store.check_access()
        if events_access is not None and isinstance(events, RedisEventBus):
            await events.check_access()
    except Exception as e:
        with contextlib.suppress(Exception):
            await events.close()
        with contextlib.suppress(Exception):
            await store.close()
        raise BackendRefused(str(e)) from None
    return store, events
