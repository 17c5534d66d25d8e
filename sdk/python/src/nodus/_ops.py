"""Each call of the API written once, without input or output: an operation is a generator
that yields the effects it needs — a :class:`~nodus._core.Request` to send, a :class:`Pause`
to sleep — and is sent back each request's decoded answer (or thrown its exception).
:class:`nodus.Client` drives operations with blocking I/O, :class:`nodus.aio.AsyncClient`
with asyncio; both derive from :class:`ClientCore`, which holds the connection and the
operations of the REST calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Generator, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _core
from .config import Connection, resolve
from .types import LogLine, PostRunActionInfo, RunStatus

T = TypeVar("T")

#: How many objects a list reads per request; lists follow ``metadata.continue`` until the
#: server has answered every object.
LIST_CHUNK = 500


@dataclass(frozen=True)
class Pause:
    """An effect: sleep ``seconds``."""

    seconds: float


#: What an operation asks its driver to do.
Effect = Union[_core.Request, Pause]
#: An operation answering ``T``: it yields effects and is sent their answers (a request's
#: decoded JSON, ``None`` after a pause).
Op = Generator[Effect, Any, T]


def deadline(timeout: Optional[float]) -> Optional[float]:
    """The ``time.monotonic()`` at which a wait of ``timeout`` seconds ends."""
    return None if timeout is None else time.monotonic() + timeout


def pause(delay: float, until: Optional[float]) -> Op[bool]:
    """Sleeps ``delay`` (at most until the deadline ``until``); ``False`` when the deadline
    has passed."""
    if until is not None:
        left = until - time.monotonic()
        if left <= 0:
            return False
        delay = min(delay, left)
    yield Pause(delay)
    return True


class Follow:
    """One object followed until a deadline: :meth:`next` answers the object now, then each
    newer version as the server's long poll answers it. A long poll that answers the same
    version (it timed out, or the server does not wait) is followed by a growing pause; less
    than a second before the deadline the object is read once more at the deadline, so the
    wait ends on time."""

    def __init__(self, path: str, until: Optional[float]) -> None:
        self._path = path
        self._until = until
        self._document: Optional[Dict[str, Any]] = None
        self._pauses = _core.backoff()

    def next(self) -> Op[Optional[Dict[str, Any]]]:
        """The object's next version; ``None`` once the deadline has passed."""
        if self._document is None:
            return (yield from self._read())
        while True:
            left = None if self._until is None else self._until - time.monotonic()
            if left is not None and left <= 0:
                return None
            seconds = _core.watch_seconds(left)
            version = _core.version_of(self._document)
            if seconds == 0 or version is None:
                # Less than a second left: read once more at the deadline.
                if not (
                    yield from pause(next(self._pauses) if left is None else left, self._until)
                ):
                    return None
                return (yield from self._read())
            answer: Dict[str, Any] = yield _core.watch_request(self._path, version, seconds)
            if _core.version_of(answer) == version:
                yield from pause(next(self._pauses), self._until)
                continue
            self._pauses = _core.backoff()
            self._document = answer
            return answer

    def _read(self) -> Op[Optional[Dict[str, Any]]]:
        document: Dict[str, Any] = yield _core.Request("GET", self._path)
        self._document = document
        return document


class LogFollow:
    """What ``logs(follow=True)`` makes of each event its driver feeds it: ``("run",
    document)`` for each new version of the run, ``("piece", piece)`` for a piece of live
    output, ``("error", exception)`` and ``("timeout", None)`` when following the run
    failed or ran out of time. :meth:`lines` answers the lines to show, reading the run's
    steps as it needs; :attr:`finished` says when the log is whole."""

    def __init__(self, project: str, name: str, timeout: Optional[float]) -> None:
        self.project = project
        self.name = name
        self.timeout = timeout
        self.state = _core.LogState()
        self.finished = False
        self._status: Optional[RunStatus] = None

    def lines(self, kind: str, value: Any) -> Op[List[LogLine]]:
        """The lines event ``(kind, value)`` brings; raises the failure of an error or a
        timeout."""
        if kind == "run":
            self._status = RunStatus.from_json(value)
            lines = yield from self._steps()
            if self._status.finished:
                # Its last steps may be written after the document: read them once more.
                lines += yield from self._steps()
                self.finished = True
            return lines
        if kind == "piece":
            piece_lines = self.state.piece(value)
            return (yield from self._steps()) if piece_lines is None else piece_lines
        if kind == "error":
            raise value
        assert self._status is not None
        raise _core.run_timeout(self.name, self._status, self.timeout)

    def _steps(self) -> Op[List[LogLine]]:
        steps = yield _core.steps_request(self.project, self.name)
        return self.state.lines(steps)


def live_logs_arguments(project: str, name: str) -> Dict[str, Any]:
    """The arguments of the HTTP client's ``stream`` for ``GET …/logs?follow=true``, the
    live output of a run's commands (one JSON line per piece after a head line)."""
    return {
        "method": "GET",
        "url": _core.resource_path(project, "agentruns", name, "logs"),
        "params": {"follow": "true"},
        "headers": {"Accept": "application/x-ndjson"},
        "timeout": httpx.Timeout(_core.LONG_POLL_MARGIN, read=None),
    }


class ClientCore:
    """What :class:`nodus.Client` and :class:`nodus.aio.AsyncClient` share: the server, token
    and project they resolve, and each REST call as an operation (the public methods of each
    run them)."""

    def __init__(
        self,
        server: Optional[str] = None,
        token: Optional[str] = None,
        project: Optional[str] = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        self._connection: Connection = resolve(server, token, project)
        self._open(timeout)

    def _open(self, timeout: float) -> None:
        """Opens the HTTP client (each driver its own kind)."""
        raise NotImplementedError

    def _http_options(self, timeout: float) -> Dict[str, Any]:
        return {
            "base_url": self._connection.server,
            "headers": _core.headers(self._connection.token),
            "timeout": timeout,
            "limits": _core.LIMITS,
        }

    @property
    def server(self) -> str:
        """The server's base URL."""
        return self._connection.server

    @property
    def project(self) -> str:
        """The default project."""
        return self._connection.project

    def __repr__(self) -> str:
        return f"{type(self).__name__}(server={self.server!r}, project={self.project!r})"

    def _path(
        self, plural: str, name: Optional[str], sub: Optional[str], project: Optional[str]
    ) -> str:
        return _core.resource_path(project or self.project, plural, name, sub)

    def _post_run_actions(self) -> Op[List[PostRunActionInfo]]:
        body = yield _core.Request("GET", _core.POST_RUN_ACTIONS_PATH)
        return [PostRunActionInfo.from_json(item) for item in body.get("items", [])]

    def _get(self, plural: str, name: str, project: Optional[str]) -> Op[Dict[str, Any]]:
        answer: Dict[str, Any] = yield _core.Request("GET", self._path(plural, name, None, project))
        return answer

    def _watch(
        self,
        plural: str,
        name: str,
        resource_version: str,
        timeout_seconds: int,
        project: Optional[str],
    ) -> Op[Dict[str, Any]]:
        path = self._path(plural, name, None, project)
        answer: Dict[str, Any] = yield _core.watch_request(path, resource_version, timeout_seconds)
        return answer

    def _list(
        self,
        plural: str,
        field_selector: Optional[str],
        label_selector: Optional[str],
        project: Optional[str],
    ) -> Op[List[Dict[str, Any]]]:
        """Every object of ``plural`` that matches, read in chunks of :data:`LIST_CHUNK`."""
        params: Dict[str, str] = {"limit": str(LIST_CHUNK)}
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        path = self._path(plural, None, None, project)
        items: List[Dict[str, Any]] = []
        while True:
            answer = yield _core.Request("GET", path, params=dict(params))
            items.extend(answer.get("items", []))
            # Present only while more remain; a server without chunks answers all at once.
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    def _create(
        self,
        plural: str,
        document: Mapping[str, Any],
        project: Optional[str],
        idempotency_key: Optional[str] = None,
    ) -> Op[Dict[str, Any]]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        path = self._path(plural, None, None, project)
        answer: Dict[str, Any] = yield _core.Request("POST", path, dict(document), headers)
        return answer

    def _patch(
        self, plural: str, name: str, patch: Mapping[str, Any], project: Optional[str]
    ) -> Op[Dict[str, Any]]:
        path = self._path(plural, name, None, project)
        answer: Dict[str, Any] = yield _core.Request("PATCH", path, dict(patch))
        return answer

    def _delete(self, plural: str, name: str, project: Optional[str]) -> Op[None]:
        yield _core.Request("DELETE", self._path(plural, name, None, project))

    def _create_secret(
        self, name: str, values: Mapping[str, str], project: Optional[str]
    ) -> Op[Dict[str, Any]]:
        return (yield from self._create("secrets", _core.secret_document(name, values), project))

    def _sub(
        self, method: str, plural: str, name: str, sub: str, body: Any, project: Optional[str]
    ) -> Op[Any]:
        return (yield _core.Request(method, self._path(plural, name, sub, project), body))


def request_arguments(request: _core.Request) -> Dict[str, Any]:
    """The arguments of the HTTP client's ``request`` for ``request``."""
    return {
        "method": request.method,
        "url": request.path,
        "content": None if request.body is None else _core.encode(request.body),
        "headers": request.headers,
        "params": request.params or None,
        "timeout": httpx.USE_CLIENT_DEFAULT if request.timeout is None else request.timeout,
    }
