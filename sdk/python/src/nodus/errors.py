"""The exceptions of the Nodus client: one class per reason the server gives, so a program
catches the kind it can handle (``except nodus.AgentRunFinished``) and lets the rest go.

Every exception carries the server's ``reason`` (``NotFound``, ``Conflict``, …), its
``message`` and, for ``Invalid``, the field, the rule and the value. Tokens never appear in
them.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "NodusError",
    "ConfigError",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "WorkdirNotKept",
    "Invalid",
    "Conflict",
    "AlreadyExists",
    "AgentRunFinished",
    "AgentStopped",
    "ServerUnavailable",
    "ConnectionFailed",
    "InternalError",
    "WaitTimeout",
    "RunFailed",
    "error_from_response",
]


class NodusError(Exception):
    """The base of every error this package raises.

    ``reason`` is the server's stable machine-readable reason (or the client's own, such as
    ``ConnectionFailed``), ``message`` the sentence that explains it, ``status_code`` the HTTP
    status when the server answered.
    """

    #: The reason this class stands for (a subclass sets it).
    default_reason: str = "Error"

    def __init__(
        self,
        message: str,
        *,
        reason: Optional[str] = None,
        status_code: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.reason: str = reason or self.default_reason
        self.message: str = message
        self.status_code: Optional[int] = status_code
        self.details: Dict[str, Any] = dict(details or {})
        super().__init__(f"{self.reason}: {message}")


class ConfigError(NodusError):
    """No server or token could be found, or the CLI's config file cannot be read."""

    default_reason = "ConfigError"


class Unauthorized(NodusError):
    """The token is missing, wrong or revoked (HTTP 401)."""

    default_reason = "Unauthorized"


class Forbidden(NodusError):
    """The token may not do this in this project (HTTP 403)."""

    default_reason = "Forbidden"


class NotFound(NodusError):
    """No such object (HTTP 404)."""

    default_reason = "NotFound"


class WorkdirNotKept(NotFound):
    """The run's final working directory was not kept (HTTP 404, reason ``WorkdirNotKept``)."""

    default_reason = "WorkdirNotKept"


class Invalid(NodusError):
    """The request was refused as invalid (HTTP 400 or 422).

    ``field``, ``rule`` and ``value`` name what was wrong when the server said so.
    """

    default_reason = "Invalid"

    @property
    def field(self) -> Optional[str]:
        """The field that is wrong, as the server names it (``spec.evaluation``)."""
        value = self.details.get("field")
        return value if isinstance(value, str) else None

    @property
    def rule(self) -> Optional[str]:
        """The rule the field breaks."""
        value = self.details.get("rule")
        return value if isinstance(value, str) else None

    @property
    def value(self) -> Optional[str]:
        """The value that breaks it."""
        value = self.details.get("value")
        return value if isinstance(value, str) else None


class Conflict(NodusError):
    """The request conflicts with the object's state (HTTP 409): a sealed group, a run another
    replica holds, an object changed by someone else."""

    default_reason = "Conflict"


class AlreadyExists(Conflict):
    """An object of that kind and name exists already (HTTP 409, reason ``AlreadyExists``)."""

    default_reason = "AlreadyExists"


class AgentRunFinished(Conflict):
    """The run has finished and takes no more messages (HTTP 409, ``AgentRunFinished``)."""

    default_reason = "AgentRunFinished"


class AgentStopped(Conflict):
    """The agent is stopped (``spec.state: Stopped``) and takes no new runs
    (HTTP 409, ``AgentStopped``)."""

    default_reason = "AgentStopped"


class ServerUnavailable(NodusError):
    """The server cannot serve the request now (HTTP 503, or 429); trying later may help."""

    default_reason = "Unavailable"


class ConnectionFailed(ServerUnavailable):
    """The server could not be reached at all: refused, unresolvable, timed out."""

    default_reason = "ConnectionFailed"


class InternalError(NodusError):
    """The server failed (HTTP 500)."""

    default_reason = "InternalError"


class WaitTimeout(NodusError, TimeoutError):
    """A wait ran out of time before its condition was met. ``status`` is the last status
    read."""

    default_reason = "Timeout"

    def __init__(self, message: str, *, status: Any = None) -> None:
        super().__init__(message)
        self.status: Any = status


class RunFailed(NodusError):
    """A run ended without an answer to return: Failed or Cancelled (``reason`` is the run's,
    such as ``ModelCallFailed`` or ``CancelRequested``), or it needs a resolution. ``status``
    is the run's status."""

    default_reason = "Failed"

    def __init__(self, message: str, *, reason: Optional[str], status: Any) -> None:
        super().__init__(message, reason=reason or "Failed")
        self.status: Any = status


_BY_REASON: Dict[str, Type[NodusError]] = {
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "WorkdirNotKept": WorkdirNotKept,
    "Invalid": Invalid,
    "Conflict": Conflict,
    "AlreadyExists": AlreadyExists,
    "AgentRunFinished": AgentRunFinished,
    "AgentStopped": AgentStopped,
    "Unavailable": ServerUnavailable,
    "TooManyRequests": ServerUnavailable,
    "InternalError": InternalError,
}

_BY_STATUS: Dict[int, Type[NodusError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: ServerUnavailable,
    500: InternalError,
    502: ServerUnavailable,
    503: ServerUnavailable,
    504: ServerUnavailable,
}


def error_from_response(status_code: int, body: Any, fallback_text: str) -> NodusError:
    """The exception for an error answer: by the server's ``reason`` when it gave one, else
    by the HTTP status."""
    reason: Optional[str] = None
    message = fallback_text.strip() or f"HTTP {status_code}"
    details: Optional[Mapping[str, Any]] = None
    if isinstance(body, dict):
        if isinstance(body.get("reason"), str):
            reason = body["reason"]
        if isinstance(body.get("message"), str):
            message = body["message"]
        if isinstance(body.get("details"), dict):
            details = body["details"]
    cls = _BY_REASON.get(reason or "") or _BY_STATUS.get(status_code, NodusError)
    if reason is None:
        reason = cls.default_reason if cls is not NodusError else f"HTTP{status_code}"
    return cls(message, reason=reason, status_code=status_code, details=details)
