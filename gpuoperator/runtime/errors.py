"""Typed API errors: callers branch on the kind of failure, never on status-code numbers."""

from __future__ import annotations


class ApiError(Exception):
    """The API server refused a request (``code`` is the HTTP status, ``reason`` the
    Status reason such as ``Conflict``)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class NotFoundError(ApiError):
    """404: the object does not exist."""


class ConflictError(ApiError):
    """409 Conflict: a resourceVersion precondition failed (someone wrote first)."""


class AlreadyExistsError(ApiError):
    """409 AlreadyExists: create of a name that is taken."""


class GoneError(ApiError):
    """410: the resourceVersion (or continue token) is too old; relist."""


class InvalidError(ApiError):
    """422: the object failed validation; the message names the fields."""


class ForbiddenError(ApiError):
    """403: RBAC (or an admission webhook) refused."""


class NamespaceTerminatingError(ForbiddenError):
    """403 from the NamespaceLifecycle admission plugin: nothing new may be created in a
    namespace being deleted (everything in it is about to go; not an RBAC problem)."""


class UnauthorizedError(ApiError):
    """401: the credentials were not accepted (an expired token, for instance)."""


class TooManyRequestsError(ApiError):
    """429: the server asks to slow down (retried by the client)."""


class NotLeaderError(Exception):
    """A controller tried to write after this replica stopped leading; the runtime refuses
    it so two replicas never act at once (fencing). ``sent``: an earlier attempt of the
    same write reached the server (it was being retried), so it may have landed."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


_BY_CODE: dict[int, type[ApiError]] = {
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
}


def from_status(code: int, status: dict[str, object] | None) -> ApiError:
    """Build the typed error for an HTTP status code and the server's Status body."""
    status = status or {}
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or "")
    if code == 409:
        cls: type[ApiError] = AlreadyExistsError if reason == "AlreadyExists" else ConflictError
    elif code == 403 and _namespace_terminating(status, message):
        cls = NamespaceTerminatingError
    else:
        cls = _BY_CODE.get(code, ApiError)
    return cls(code, reason or cls.__name__.removesuffix("Error"), message)


#: The cause type and the words of the API server's NamespaceLifecycle refusal.
_TERMINATING_CAUSE = "NamespaceTerminating"
_TERMINATING_WORDS = "because it is being terminated"


def _namespace_terminating(status: dict[str, object], message: str) -> bool:
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("type") == _TERMINATING_CAUSE for c in causes
    ):
        return True
    return _TERMINATING_WORDS in message
