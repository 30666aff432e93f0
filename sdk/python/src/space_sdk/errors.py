"""Typed exceptions for the API's errors.

Every error the server answers has a stable ``code`` (``crates/space-api/src/error.rs``), an
HTTP status and a message that says what to do. :func:`error_for` turns one into the most
specific exception class below; each carries all three, so ``except NotFoundError`` and
``if e.code == "snapshot_not_found"`` both work.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult

__all__ = [
    "SpaceError",
    "ConfigurationError",
    "APIConnectionError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "SnapshotNotFoundError",
    "CredentialNotFoundError",
    "ProcessNotFoundError",
    "PathNotFoundError",
    "ConflictError",
    "InvalidStateError",
    "SessionSuspendedError",
    "PathExistsError",
    "SnapshotCorruptError",
    "RequestTooLargeError",
    "RateLimitError",
    "QuotaExceededError",
    "DiskQuotaExceededError",
    "StorageFullError",
    "FeatureUnavailableError",
    "PortNotListeningError",
    "SandboxUnavailableError",
    "DatabaseUnavailableError",
    "BlobStoreUnavailableError",
    "KeyUnavailableError",
    "OAuthFailedError",
    "InternalServerError",
    "TimeoutError",
    "CommandExitError",
    "error_for",
    "CODE_CLASSES",
]


class SpaceError(Exception):
    """Base class of every error the SDK raises.

    ``code`` is the API's stable error code (``None`` for errors the client made itself, such
    as a refused connection), ``status`` the HTTP status (``None`` likewise) and ``message``
    the server's explanation, which says what to do.
    """

    code: Optional[str]
    status: Optional[int]
    message: str

    def __init__(self, message: str, *, code: Optional[str] = None, status: Optional[int] = None) -> None:
        Exception.__init__(self, message)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self) -> str:
        if self.code is None and self.status is None:
            return self.message
        return f"{self.message} ({self.code}, HTTP {self.status})" if self.status else f"{self.message} ({self.code})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.message, self.code, self.status))


def _rebuild(cls: Type[SpaceError], message: str, code: Optional[str], status: Optional[int]) -> SpaceError:
    return cls(message, code=code, status=status)


class ConfigurationError(SpaceError):
    """The SDK was not told where the server is or which key to use."""


class APIConnectionError(SpaceError):
    """The server could not be reached, or the connection broke mid-request."""


class BadRequestError(SpaceError):
    """400: the request was malformed or named something that cannot be used."""


class AuthenticationError(SpaceError):
    """401: the API key is missing, wrong, revoked or expired."""


class PermissionDeniedError(SpaceError):
    """403: the key may not do this (admin-only call), or the sandbox refused a path."""


class NotFoundError(SpaceError):
    """404: no such session (or not yours), snapshot, credential, process or path."""


class SnapshotNotFoundError(NotFoundError):
    pass


class CredentialNotFoundError(NotFoundError):
    pass


class ProcessNotFoundError(NotFoundError):
    pass


class PathNotFoundError(NotFoundError):
    """No file or directory at that path inside the sandbox."""


class ConflictError(SpaceError):
    """409: the request conflicts with the current state of something."""


class InvalidStateError(ConflictError):
    """409 ``invalid_state``: the session is not in a state that accepts the call."""


class SessionSuspendedError(InvalidStateError):
    """409 ``session_suspended``: resume the session first (or create it with auto_resume)."""


class PathExistsError(ConflictError):
    pass


class SnapshotCorruptError(ConflictError):
    """409 ``snapshot_corrupt``: the snapshot's copy in the blob store failed its checksum and
    was not restored; the message names an older durable snapshot to use instead."""


class RequestTooLargeError(SpaceError):
    """413, 414 or 431: the body, URL or headers are larger than the server accepts."""


class RateLimitError(SpaceError):
    """429 ``limit_exceeded``: too many of something open at once (the message names it)."""


class QuotaExceededError(SpaceError):
    """A tenant's quota (429) or a session's disk limit (507) would be exceeded."""


class DiskQuotaExceededError(QuotaExceededError):
    pass


class StorageFullError(SpaceError):
    """507: the node's storage pool is full."""


class FeatureUnavailableError(SpaceError):
    """501: the server lacks what the feature needs (e.g. CRIU for full snapshots)."""


class PortNotListeningError(SpaceError):
    """502: nothing listens on that port inside the sandbox."""


class SandboxUnavailableError(SpaceError):
    """503: the session's sandbox could not be reached."""


class DatabaseUnavailableError(SpaceError):
    """503: the server's database could not be reached, or was too busy to answer in time.
    Retry after a few seconds (the response's ``Retry-After``); calls that change something
    are safe to retry with the same ``Idempotency-Key``."""


class BlobStoreUnavailableError(SpaceError):
    """503 ``blob_store_unavailable``: the blob store could not take a snapshot, which stays on
    its node only. Retry, or suspend with ``force=True`` to keep it there."""


class KeyUnavailableError(SpaceError):
    """503 ``key_unavailable``: the tenant's own key (BYOK) cannot be used: its KMS refused
    (the key was disabled, revoked or deleted) or did not answer. The message names the key;
    what was sealed with it opens again once the key is usable."""


class OAuthFailedError(SpaceError):
    """502 ``oauth_failed``: an OAuth provider's token endpoint refused or failed (e.g. during
    a sign-in's code exchange); the message says what it answered and what to do."""


class InternalServerError(SpaceError):
    """500: a fault of the server; the message says what failed."""


class TimeoutError(SpaceError, builtins.TimeoutError):  # noqa: A001 - deliberately shadows
    """504/408 from the server, or a client-side timeout. Also a builtin ``TimeoutError``."""

    def __init__(self, message: str, *, code: Optional[str] = None, status: Optional[int] = None) -> None:
        SpaceError.__init__(self, message, code=code, status=status)

    __str__ = SpaceError.__str__


class CommandExitError(SpaceError):
    """A command run with ``check=True`` exited non-zero, was killed, or timed out."""

    def __init__(self, result: "CommandResult") -> None:
        if result.timed_out:
            what = "timed out"
        elif result.exit_code is None:
            what = f"was killed by signal {result.signal}"
        else:
            what = f"exited with code {result.exit_code}"
        tail = result.stderr.strip().splitlines()[-1:] if result.stderr else []
        message = f"command {what}" + (f": {tail[0]}" if tail else "")
        super().__init__(message, code=None, status=None)
        self.result = result

    def __reduce__(self) -> Any:
        return (CommandExitError, (self.result,))


# Every code the server documents (and those of issue 15's additions), to its class and the
# HTTP status the server answers it with (for errors that arrive on a WebSocket, which carry
# only the code). A test checks this covers the ErrorCode enum of docs/openapi.json.
CODE_CLASSES: Dict[str, Tuple[Type[SpaceError], int]] = {
    "bad_request": (BadRequestError, 400),
    "unknown_template": (BadRequestError, 400),
    "runtime_unavailable": (BadRequestError, 400),
    "not_a_directory": (BadRequestError, 400),
    "is_a_directory": (BadRequestError, 400),
    "directory_not_empty": (BadRequestError, 400),
    "port_reserved": (BadRequestError, 400),
    "unauthorized": (AuthenticationError, 401),
    "key_revoked": (AuthenticationError, 401),
    "key_expired": (AuthenticationError, 401),
    "forbidden": (PermissionDeniedError, 403),
    "permission_denied": (PermissionDeniedError, 403),
    "method_not_allowed": (BadRequestError, 405),
    "request_timeout": (TimeoutError, 408),
    "not_found": (NotFoundError, 404),
    "file_not_found": (PathNotFoundError, 404),
    "no_such_process": (ProcessNotFoundError, 404),
    "snapshot_not_found": (SnapshotNotFoundError, 404),
    "credential_not_found": (CredentialNotFoundError, 404),
    "conflict": (ConflictError, 409),
    "invalid_state": (InvalidStateError, 409),
    "session_suspended": (SessionSuspendedError, 409),
    "idempotency_conflict": (ConflictError, 409),
    "file_exists": (PathExistsError, 409),
    "snapshot_corrupt": (SnapshotCorruptError, 409),
    "payload_too_large": (RequestTooLargeError, 413),
    "uri_too_long": (RequestTooLargeError, 414),
    "headers_too_large": (RequestTooLargeError, 431),
    "limit_exceeded": (RateLimitError, 429),
    "quota_exceeded": (QuotaExceededError, 429),
    "build_failed": (BadRequestError, 422),
    "feature_unavailable": (FeatureUnavailableError, 501),
    "port_not_listening": (PortNotListeningError, 502),
    "sandbox_unavailable": (SandboxUnavailableError, 503),
    "database_unavailable": (DatabaseUnavailableError, 503),
    "blob_store_unavailable": (BlobStoreUnavailableError, 503),
    "key_unavailable": (KeyUnavailableError, 503),
    "oauth_failed": (OAuthFailedError, 502),
    "storage_full": (StorageFullError, 507),
    "disk_quota_exceeded": (DiskQuotaExceededError, 507),
    "timeout": (TimeoutError, 504),
    "internal": (InternalServerError, 500),
}

# For codes this SDK does not know yet (a newer server): the class of the status.
_STATUS_CLASSES: Dict[int, Type[SpaceError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: TimeoutError,
    409: ConflictError,
    413: RequestTooLargeError,
    414: RequestTooLargeError,
    429: RateLimitError,
    431: RequestTooLargeError,
    500: InternalServerError,
    501: FeatureUnavailableError,
    502: PortNotListeningError,
    503: SandboxUnavailableError,
    504: TimeoutError,
    507: StorageFullError,
}


def error_for(code: Optional[str], status: Optional[int], message: str) -> SpaceError:
    """The exception for an API error: by its code, else by its HTTP status."""
    known = CODE_CLASSES.get(code or "")
    if known is not None:
        return known[0](message, code=code, status=status if status is not None else known[1])
    cls = _STATUS_CLASSES.get(status, SpaceError) if status is not None else SpaceError
    return cls(message, code=code, status=status)


def error_from_body(status: int, body: bytes, reason: str = "") -> SpaceError:
    """The exception for an HTTP error response with the API's JSON envelope (or without)."""
    import json

    try:
        detail = json.loads(body)["error"]
        return error_for(str(detail["code"]), status, str(detail["message"]))
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:500]
        return error_for(None, status, text or reason or f"HTTP {status}")
