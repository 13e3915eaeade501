"""How the scheduler's gRPC services answer: scheduler exceptions as gRPC status codes with a
message for humans (in one place, which the gateway turns into HTTP statuses and persysctl into
one line of text), and the compact JSON documents some answers carry."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from pydantic import ValidationError

from persys.aborting import aborting
from persys.model.manifest import ManifestError, format_validation_error
from persys.scheduler.errors import Frozen, MutationRefused, NotActive, NotFound
from persys.store.base import StoreError, StoreFull, StoreUnavailable, TxnTooLarge

LEADER_METADATA = "persys-leader"
UNAVAILABLE_METADATA = "persys-unavailable"  # names the dependency that is down (not this replica)


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@aborting
@contextlib.asynccontextmanager
async def mapped(  # noqa: C901 - a flat table, one except clause per error kind and its status
    context: grpc.aio.ServicerContext, *invalid: type[Exception]
) -> AsyncIterator[None]:
    """Turn the scheduler's exceptions into gRPC statuses with a message for humans; `invalid`:
    a service's own errors that say the request is wrong (INVALID_ARGUMENT with their message).
    Every servicer maps its errors this way (`async with mapped(context, ...)`)."""
    try:
        yield
    except invalid as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except NotActive as err:
        # Agents read the active replica's address from this trailer and reconnect there.
        context.set_trailing_metadata(((LEADER_METADATA, err.leader),))
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    except NotFound as err:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"{err.args[0]} not found")
    except Frozen as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    except MutationRefused as err:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    except StoreUnavailable as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {err}")
    except TxnTooLarge as err:  # nothing was written
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except StoreFull as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"state store full: {err}")
    except StoreError as err:  # any other store failure: named, never grpc's "Unexpected <class ...>"
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"state store error: {err}")
    except ManifestError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(err.problems))
    except ValidationError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(format_validation_error(err)))
