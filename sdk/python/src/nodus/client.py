"""The synchronous connection to a Nodus server: authenticated JSON requests to the REST API,
with the server's failures raised as :mod:`nodus.errors` exceptions.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _core, _download, _ops
from ._ops import ClientCore
from .types import PostRunActionInfo

T = TypeVar("T")

__all__ = ["Client", "default_client"]


class Client(ClientCore):
    """A connection to one server with one token; ``project`` is the default project of the
    calls that do not name one.

    Each of ``server``, ``token`` and ``project`` comes from the argument when given, else from
    ``NODUS_SERVER`` / ``NODUS_TOKEN`` / ``NODUS_PROJECT``, else from the ``nodus`` CLI's
    current context. ``timeout`` bounds each request in seconds. Use it as a context manager,
    or call :meth:`close`, to close its connections.
    """

    _http: httpx.Client

    def _open(self, timeout: float) -> None:
        self._http = httpx.Client(**self._http_options(timeout))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client's connections."""
        self._http.close()

    def _run(self, op: _ops.Op[T]) -> T:
        """Carries out the operation ``op``: sends each request it yields and sends it back
        the answer (or throws it the exception), sleeps each pause; answers what it returns."""
        try:
            effect = next(op)
            while True:
                try:
                    if isinstance(effect, _ops.Pause):
                        time.sleep(effect.seconds)
                        answer = None
                    else:
                        answer = self.send(effect)
                except Exception as error:
                    effect = op.throw(error)
                else:
                    effect = op.send(answer)
        except StopIteration as stop:
            returned: T = stop.value
            return returned

    def send(self, request: _core.Request) -> Any:
        """Sends one request; returns the answer's JSON (numbers with a fraction as
        Decimal), or raises the exception for the server's reason, or
        :class:`~nodus.ConnectionFailed` when the server cannot be reached."""
        try:
            response = self._http.request(**_ops.request_arguments(request))
        except httpx.TransportError as error:
            raise _core.connection_error(self.server, error) from None
        return _core.result(response, request.raw)

    def download(self, path: str, file: Union[str, "os.PathLike[str]"]) -> int:
        """``GET path`` (relative to the server) into ``file``, streamed: written beside it
        and renamed once whole, so ``file`` is never left half-written. Returns the number of
        bytes; raises the server's failure as :meth:`send` does, leaving ``file`` as it was."""
        with _download.download(file, self.server) as into:
            with self._http.stream("GET", path, headers={"Accept": "*/*"}) as response:
                if not response.is_success:
                    response.read()
                into.begin(response)
                for chunk in response.iter_bytes():
                    into.write(chunk)
        return into.written

    def post_run_actions(self) -> List[PostRunActionInfo]:
        """The post-run actions this server installs (``GET /apis/nodus.dev/v1/postrunactions``,
        as ``nodus get postrunactions``): each one's kind, title, description and the JSON
        Schema of its config."""
        return self._run(self._post_run_actions())

    def get(self, plural: str, name: str, *, project: Optional[str] = None) -> Dict[str, Any]:
        """``GET …/{plural}/{name}``: one object (``plural`` is ``agents``, ``agentruns``,
        ``agentgroups``, ``agentenvironments``, ``secrets``, ``budgets`` or ``filesets``)."""
        return self._run(self._get(plural, name, project))

    def watch(
        self,
        plural: str,
        name: str,
        resource_version: str,
        *,
        timeout_seconds: int = _core.LONG_POLL,
        project: Optional[str] = None,
    ) -> Dict[str, Any]:
        """A long poll of one object: ``GET …/{plural}/{name}?watch=true``. Answers the object
        as soon as its ``metadata.resourceVersion`` differs from ``resource_version`` (at once
        if it already does), or as it is after ``timeout_seconds`` (1 to 300); raises
        :class:`~nodus.NotFound` once it is deleted."""
        return self._run(self._watch(plural, name, resource_version, timeout_seconds, project))

    def list(
        self,
        plural: str,
        *,
        field_selector: Optional[str] = None,
        label_selector: Optional[str] = None,
        project: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        """``GET …/{plural}``: the objects, filtered by ``field_selector``
        (``spec.group=NAME``) and ``label_selector`` (``team=a``)."""
        return self._run(self._list(plural, field_selector, label_selector, project))

    def create(
        self,
        plural: str,
        document: Mapping[str, Any],
        *,
        project: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Dict[str, Any]:
        """``POST …/{plural}``: creates the object (or, for ``agentruns``, a batch given as an
        ``AgentRunList``, with ``idempotency_key``)."""
        return self._run(self._create(plural, document, project, idempotency_key))

    def patch(
        self, plural: str, name: str, patch: Mapping[str, Any], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """``PATCH …/{plural}/{name}``: a JSON merge patch of spec and labels."""
        return self._run(self._patch(plural, name, patch, project))

    def delete(self, plural: str, name: str, *, project: Optional[str] = None) -> None:
        """``DELETE …/{plural}/{name}`` (a group goes with its runs)."""
        self._run(self._delete(plural, name, project))

    def create_secret(
        self, name: str, values: Mapping[str, str], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """Creates a Secret with ``values`` (for BYOK: ``{"ANTHROPIC_API_KEY": "…"}``). The
        server seals them and never answers them."""
        return self._run(self._create_secret(name, values, project))

    def sub(
        self,
        method: str,
        plural: str,
        name: str,
        sub: str,
        body: Any = None,
        *,
        project: Optional[str] = None,
    ) -> Any:
        """A request to a sub-resource (``…/agentruns/NAME/steps``)."""
        return self._run(self._sub(method, plural, name, sub, body, project))


_default_lock = threading.Lock()
_default: Optional[Client] = None


def default_client() -> Client:
    """The client that handles use when none is given: made on first use from the
    environment and the CLI's config, then shared."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default
