"""The components' own credential on the internal services (ResourceManagerInternal, HostManagerInternal).

Those services are never served on the public API port: in one process the components call each other in process,
and split over processes they are served on a separate listener (`--internal-listen`) that answers only callers
presenting the shared secret of `--internal-secret-file` (metadata `x-peloton-component`). Without it a client
could hold every host, kill other users' tasks or take their placements (docs/security.md)."""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Counter

from peloton.api.edge import refusing
from peloton.errors import FailedPrecondition

METADATA_KEY = "x-peloton-component"


def load_secret(path: Path, create: bool) -> str:
    """The secret in `path`; with `create`, a new one is written there (owner-only) when the file does not exist.
    FailedPrecondition naming --internal-secret-file when it is missing, empty or readable by others."""
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        except OSError as e:
            raise FailedPrecondition(f"--internal-secret-file: cannot create {path}: {e.strerror}",
                                     field="--internal-secret-file") from None
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    try:
        st = path.stat()
        value = path.read_text().strip()
    except FileNotFoundError:
        raise FailedPrecondition(
            f"--internal-secret-file: {path} does not exist; give every process of the deployment the same file "
            "(the process that serves the internal services creates it when it is missing)",
            field="--internal-secret-file") from None
    except OSError as e:
        raise FailedPrecondition(f"--internal-secret-file: cannot read {path}: {e.strerror}",
                                 field="--internal-secret-file") from None
    if st.st_mode & 0o077:
        raise FailedPrecondition(f"--internal-secret-file: {path} is readable by others (mode "
                                 f"{st.st_mode & 0o777:o}); chmod 600 it", field="--internal-secret-file")
    if len(value) < 16:
        raise FailedPrecondition(f"--internal-secret-file: {path} holds no secret (at least 16 characters)",
                                 field="--internal-secret-file")
    return value


INTERNAL_CALLS = Counter("peloton_internal_calls_total", "Calls of the internal services answered for the other "
                         "components of a split deployment, by method", ["method"])


class RequireSecret(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call without the shared secret."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        # answered without reading the request (edge.py): a caller without the secret makes nothing be buffered
        self._deny = refusing(grpc.StatusCode.UNAUTHENTICATED, lambda: (
            "the internal services answer only the daemon's own components (their shared secret, "
            "--internal-secret-file)", []))

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        for key, value in details.invocation_metadata or ():
            if key == METADATA_KEY:
                raw = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(raw, self._secret):
                    INTERNAL_CALLS.labels(details.method.rpartition("/")[2]).inc()
                    return continuation(details)
                break
        return self._deny
