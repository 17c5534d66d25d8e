"""The asyncio client: the same names and methods as the synchronous package, as coroutines.

.. code-block:: python

    import nodus.aio

    agent = nodus.aio.ClaudeAgent("helper", system="You are careful.")
    print(await agent.remote("Use the shell to print the Python version"))
    run = await agent.submit("Summarize the logs", keep_alive=True)
    await run.send("message", "Now the staging logs")
    status = await run.status          # a property that reads the server: await it

Constructors (``ClaudeAgent(...)``, ``ClaudeAgent.from_name``, ``AgentGroup.from_name``) do
no input or output; ``AgentGroup.create`` is a coroutine. The shared default client belongs to
the event loop that first uses it: a program that runs several loops (several
``asyncio.run``) passes each its own ``client=AsyncClient(...)``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import httpx

from . import _core
from .config import Connection, resolve
from .errors import (
    AgentRunFinished,
    AgentStopped,
    AlreadyExists,
    ConfigError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InternalError,
    Invalid,
    NodusError,
    NotFound,
    RunFailed,
    ServerUnavailable,
    Unauthorized,
    WaitTimeout,
    WorkdirNotKept,
)
from .types import (
    Delivery,
    EnvironmentSpec,
    Evaluation,
    GroupStatus,
    LogLine,
    PostRunActionInfo,
    Result,
    RunError,
    RunRecord,
    RunResult,
    RunStatus,
    SecretRef,
    Step,
    Task,
    as_tasks,
    evaluation_results,
    is_evaluation,
)

__all__ = [
    "AsyncClient",
    "ClaudeAgent",
    "AgentRun",
    "AgentGroup",
    "AgentEnvironment",
    "Task",
    "RunStatus",
    "GroupStatus",
    "Evaluation",
    "Result",
    "Step",
    "Delivery",
    "EnvironmentSpec",
    "SecretRef",
    "RunResult",
    "RunRecord",
    "RunError",
    "LogLine",
    "PostRunActionInfo",
    "default_client",
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
]


class AsyncClient:
    """A connection to one server with one token, for asyncio; see :class:`nodus.Client`
    for where ``server``, ``token`` and ``project`` come from. Use ``async with``, or await
    :meth:`aclose`, to close its connections."""

    def __init__(
        self,
        server: Optional[str] = None,
        token: Optional[str] = None,
        project: Optional[str] = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        self._connection: Connection = resolve(server, token, project)
        self._http = httpx.AsyncClient(
            base_url=self._connection.server,
            headers=_core.headers(self._connection.token),
            timeout=timeout,
            limits=_core.LIMITS,
        )

    @property
    def server(self) -> str:
        """The server's base URL."""
        return self._connection.server

    @property
    def project(self) -> str:
        """The default project."""
        return self._connection.project

    def __repr__(self) -> str:
        return f"AsyncClient(server={self.server!r}, project={self.project!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the client's connections."""
        await self._http.aclose()

    async def send(self, request: _core.Request) -> Any:
        """Sends one request; see :meth:`nodus.Client.send`."""
        try:
            response = await self._http.request(
                request.method,
                request.path,
                content=None if request.body is None else _core.encode(request.body),
                headers=request.headers,
                params=request.params or None,
                timeout=httpx.USE_CLIENT_DEFAULT if request.timeout is None else request.timeout,
            )
        except httpx.TransportError as error:
            raise _core.connection_error(self.server, error) from None
        return _core.result(response, request.raw)

    async def download(self, path: str, file: Union[str, "os.PathLike[str]"]) -> int:
        """``GET path`` into ``file``, streamed; see :meth:`nodus.Client.download`."""
        target = Path(file)
        partial = _core.partial_path(target)
        written = 0
        try:
            async with self._http.stream("GET", path, headers={"Accept": "*/*"}) as response:
                if not response.is_success:
                    await response.aread()
                    _core.result(response)
                with partial.open("wb") as out:
                    async for chunk in response.aiter_bytes():
                        out.write(chunk)
                        written += len(chunk)
        except httpx.TransportError as error:
            partial.unlink(missing_ok=True)
            raise _core.connection_error(self.server, error) from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, target)
        return written

    async def post_run_actions(self) -> List[PostRunActionInfo]:
        """The post-run actions this server installs; see
        :meth:`nodus.Client.post_run_actions`."""
        body = await self.send(_core.Request("GET", _core.POST_RUN_ACTIONS_PATH))
        return [PostRunActionInfo.from_json(item) for item in body.get("items", [])]

    def _path(
        self, plural: str, name: Optional[str], sub: Optional[str], project: Optional[str]
    ) -> str:
        return _core.resource_path(project or self.project, plural, name, sub)

    async def get(self, plural: str, name: str, *, project: Optional[str] = None) -> Dict[str, Any]:
        """``GET …/{plural}/{name}``: one object."""
        answer: Dict[str, Any] = await self.send(
            _core.Request("GET", self._path(plural, name, None, project))
        )
        return answer

    async def watch(
        self,
        plural: str,
        name: str,
        resource_version: str,
        *,
        timeout_seconds: int = _core.LONG_POLL,
        project: Optional[str] = None,
    ) -> Dict[str, Any]:
        """A long poll of one object; see :meth:`nodus.Client.watch`."""
        answer: Dict[str, Any] = await self.send(
            _core.watch_request(
                self._path(plural, name, None, project), resource_version, timeout_seconds
            )
        )
        return answer

    async def list(
        self,
        plural: str,
        *,
        field_selector: Optional[str] = None,
        label_selector: Optional[str] = None,
        project: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        """``GET …/{plural}``: the objects, filtered by the selectors."""
        params: Dict[str, str] = {}
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        answer = await self.send(
            _core.Request("GET", self._path(plural, None, None, project), params=params)
        )
        items: List[Dict[str, Any]] = answer.get("items", [])
        return items

    async def create(
        self,
        plural: str,
        document: Mapping[str, Any],
        *,
        project: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Dict[str, Any]:
        """``POST …/{plural}``: creates the object or a batch of runs."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        answer: Dict[str, Any] = await self.send(
            _core.Request("POST", self._path(plural, None, None, project), dict(document), headers)
        )
        return answer

    async def patch(
        self, plural: str, name: str, patch: Mapping[str, Any], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """``PATCH …/{plural}/{name}``: a JSON merge patch."""
        answer: Dict[str, Any] = await self.send(
            _core.Request("PATCH", self._path(plural, name, None, project), dict(patch))
        )
        return answer

    async def delete(self, plural: str, name: str, *, project: Optional[str] = None) -> None:
        """``DELETE …/{plural}/{name}``."""
        await self.send(_core.Request("DELETE", self._path(plural, name, None, project)))

    async def create_secret(
        self, name: str, values: Mapping[str, str], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """Creates a Secret with ``values``; the server seals them and never answers them."""
        return await self.create("secrets", _core.secret_document(name, values), project=project)

    async def sub(
        self,
        method: str,
        plural: str,
        name: str,
        sub: str,
        body: Any = None,
        *,
        project: Optional[str] = None,
    ) -> Any:
        """A request to a sub-resource."""
        return await self.send(_core.Request(method, self._path(plural, name, sub, project), body))


_default: Optional[AsyncClient] = None


def default_client() -> AsyncClient:
    """The async client that handles use when none is given, made on first use."""
    global _default
    if _default is None:
        _default = AsyncClient()
    return _default


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


async def _pause(delay: float, deadline: Optional[float]) -> bool:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        delay = min(delay, left)
    await asyncio.sleep(delay)
    return True


async def _follow(
    client: AsyncClient, plural: str, name: str, project: str, deadline: Optional[float]
) -> AsyncIterator[Dict[str, Any]]:
    """The object now, then each newer version as the server's long poll answers it, until
    ``deadline``; see the sync ``_follow`` in :mod:`nodus.agents`."""
    document = await client.get(plural, name, project=project)
    yield document
    pauses = _core.backoff()
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        seconds = _core.watch_seconds(left)
        version = _core.version_of(document)
        if seconds == 0 or version is None:
            # Less than a second left: read once more at the deadline.
            if not await _pause(next(pauses) if left is None else left, deadline):
                return
            document = await client.get(plural, name, project=project)
            yield document
            continue
        answer = await client.watch(plural, name, version, timeout_seconds=seconds, project=project)
        if _core.version_of(answer) == version:
            await _pause(next(pauses), deadline)
            continue
        pauses = _core.backoff()
        document = answer
        yield document


async def _follow_logs(
    client: AsyncClient,
    name: str,
    project: str,
    state: _core.LogState,
    timeout: Optional[float],
) -> AsyncIterator[LogLine]:
    """``logs(follow=True)``: two tasks feed one queue — the live output of the run's
    commands and each new version of the run — as the sync ``_follow_logs`` in
    :mod:`nodus.agents` does with threads."""
    events: "asyncio.Queue[Tuple[str, Any]]" = asyncio.Queue()
    opened = asyncio.Event()

    async def live() -> None:
        path = _core.resource_path(project, "agentruns", name, "logs")
        try:
            async with client._http.stream(
                "GET",
                path,
                params={"follow": "true"},
                headers={"Accept": "application/x-ndjson"},
                timeout=httpx.Timeout(_core.LONG_POLL_MARGIN, read=None),
            ) as response:
                if not response.is_success:
                    return
                first = True
                async for line in response.aiter_lines():
                    if first:
                        # The head line: the server follows the run from here on.
                        first = False
                        opened.set()
                        continue
                    piece = _core.live_piece(line)
                    if piece is not None:
                        await events.put(("piece", piece))
        except (httpx.HTTPError, OSError, ValueError):
            # No live output: the finished steps hold all of it.
            pass
        finally:
            opened.set()

    async def watch() -> None:
        try:
            async for document in _follow(client, "agentruns", name, project, _deadline(timeout)):
                await events.put(("run", document))
            await events.put(("timeout", None))
        except Exception as error:
            await events.put(("error", error))

    async def steps() -> Any:
        return await client.send(_core.steps_request(project, name))

    live_task = asyncio.ensure_future(live())
    try:
        await asyncio.wait_for(opened.wait(), _core.LONG_POLL_MARGIN)
    except asyncio.TimeoutError:
        pass
    watch_task = asyncio.ensure_future(watch())
    status: Optional[RunStatus] = None
    try:
        while True:
            kind, value = await events.get()
            if kind == "run":
                status = RunStatus.from_json(value)
                for line in state.lines(await steps()):
                    yield line
                if status.finished:
                    # Its last steps may be written after the document: read them once more.
                    for line in state.lines(await steps()):
                        yield line
                    return
            elif kind == "piece":
                lines = state.piece(value)
                for line in state.lines(await steps()) if lines is None else lines:
                    yield line
            elif kind == "error":
                raise value
            elif kind == "timeout":
                assert status is not None
                raise _core.run_timeout(name, status, timeout)
    finally:
        for task in (live_task, watch_task):
            task.cancel()


#: What ``environment=`` takes; see :class:`nodus.AgentRun.create`.
EnvironmentArg = Union[str, "AgentEnvironment", Mapping[str, Any]]


def _environment_value(
    environment: Optional[EnvironmentArg], project: str
) -> Union[None, str, Mapping[str, Any]]:
    if isinstance(environment, AgentEnvironment):
        return environment.reference(project)
    return environment


class ClaudeAgent:
    """An Agent on Claude; see :class:`nodus.ClaudeAgent`. Its methods are coroutines."""

    def __init__(
        self,
        name: str,
        system: Optional[str] = None,
        families: Optional[Sequence[str]] = None,
        api_key_secret: Optional[str] = None,
        *,
        model: Optional[str] = None,
        max_tokens: Optional[int] = None,
        per_run_max_cost: Any = None,
        environment: Optional[EnvironmentArg] = None,
        context_schema: Optional[Mapping[str, Any]] = None,
        post_run_actions: Optional[Sequence[str]] = None,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> None:
        self.name: str = name
        self._spec: Optional[Dict[str, Any]] = _core.agent_spec(
            system, families, api_key_secret, model, max_tokens, per_run_max_cost
        )
        if environment is not None:
            if isinstance(environment, AgentEnvironment):
                environment = environment.reference(project or environment.project)
            self._spec["environment"] = (
                environment if isinstance(environment, str) else dict(environment)
            )
        if context_schema is not None:
            self._spec["contextSchema"] = dict(context_schema)
        if post_run_actions is not None:
            self._spec["postRunActions"] = list(post_run_actions)
        self._project = project
        self._client = client
        self._ensured = False

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> "ClaudeAgent":
        """The agent ``name`` as it is on the server; nothing is changed on it."""
        agent = cls(name, project=project, client=client)
        agent._spec = None
        return agent

    def __repr__(self) -> str:
        return f"ClaudeAgent({self.name!r}, project={self.project!r})"

    @property
    def client(self) -> AsyncClient:
        """The client this agent uses."""
        if self._client is None:
            self._client = default_client()
        return self._client

    @property
    def project(self) -> str:
        """The agent's project."""
        return self._project or self.client.project

    async def ensure(self) -> Dict[str, Any]:
        """Creates the agent, or updates it to the fields given; returns it as stored."""
        client, project = self.client, self.project
        if self._spec is None:
            agent = await client.get("agents", self.name, project=project)
        else:
            try:
                agent = await client.create(
                    "agents", _core.agent_document(self.name, self._spec), project=project
                )
            except AlreadyExists:
                agent = await client.get("agents", self.name, project=project)
                patch = _core.agent_patch(agent, self._spec)
                if patch is not None:
                    agent = await client.patch("agents", self.name, patch, project=project)
        self._ensured = True
        return agent

    async def submit(
        self,
        prompt: str,
        keep_alive: bool = False,
        *,
        name: Optional[str] = None,
        deadline: Optional[str] = None,
        context: Optional[Mapping[str, Any]] = None,
        environment: Optional[EnvironmentArg] = None,
        post_run_action: Optional[Mapping[str, Any]] = None,
    ) -> "AgentRun":
        """Starts a run with ``prompt``; see :meth:`nodus.ClaudeAgent.submit`."""
        return await AgentRun.create(
            self,
            prompt,
            name=name,
            keep_alive=keep_alive,
            deadline=deadline,
            context=context,
            environment=environment,
            post_run_action=post_run_action,
        )

    async def remote(self, prompt: str, *, timeout: Optional[float] = None) -> str:
        """Runs ``prompt`` to the end and returns the answer; see
        :meth:`nodus.ClaudeAgent.remote`."""
        run = await self.submit(prompt)
        return await run.answer(timeout=timeout)


class AgentRun:
    """A handle on the run ``name``; see :class:`nodus.AgentRun`. ``await run.status``
    reads its status."""

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        self._answers_expected = 1 if _document is not None else 0

    def __repr__(self) -> str:
        return f"AgentRun({self.name!r}, project={self.project!r})"

    @classmethod
    async def create(
        cls,
        agent: Union[str, ClaudeAgent, Mapping[str, Any]],
        input: Optional[str] = None,
        *,
        name: Optional[str] = None,
        environment: Optional[EnvironmentArg] = None,
        context: Optional[Mapping[str, Any]] = None,
        post_run_action: Optional[Mapping[str, Any]] = None,
        keep_alive: bool = False,
        deadline: Optional[str] = None,
        timeout: Optional[str] = None,
        image: Optional[str] = None,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AgentRun":
        """Creates a run and returns its handle; see :meth:`nodus.AgentRun.create`."""
        if isinstance(agent, ClaudeAgent):
            if not agent._ensured:
                await agent.ensure()
            client = client or agent.client
            target, reference = _core.run_target(agent.project, client.project, agent.name)
            project = project or target
            stem = agent.name
            spec_agent: Union[str, Mapping[str, Any]] = reference
        else:
            stem = agent.rsplit("/", 1)[-1] if isinstance(agent, str) else "run"
            spec_agent = agent
        client = client or default_client()
        project = project or client.project
        run_name = name or _core.new_run_name(stem)
        document = _core.run_document(
            run_name,
            spec_agent,
            input,
            keep_alive,
            deadline,
            context,
            environment=_environment_value(environment, project),
            post_run_action=post_run_action,
            timeout=timeout,
            image=image,
        )
        created = await client.create("agentruns", document, project=project)
        return cls(run_name, project=project, client=client, _document=created)

    async def _sub(self, method: str, sub: str, body: Any = None) -> Any:
        return await self._client.sub(
            method, "agentruns", self.name, sub, body, project=self.project
        )

    async def document(self) -> Dict[str, Any]:
        """The run as the server has it now."""
        return await self._client.get("agentruns", self.name, project=self.project)

    async def environment(self) -> Optional[EnvironmentSpec]:
        """The environment the run took when it was created; see
        :meth:`nodus.AgentRun.environment`."""
        return EnvironmentSpec.from_run(await self.document())

    async def results(self) -> List[RunResult]:
        """The results of the finished run with their sizes; see
        :meth:`nodus.AgentRun.results`."""
        body = await self._client.send(
            _core.Request("GET", _core.result_path(self.project, self.name))
        )
        return [RunResult.from_json(item) for item in body.get("items", [])]

    async def download_result(self, result: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Saves the result ``result`` to ``path``; see :meth:`nodus.AgentRun.download_result`."""
        return await self._client.download(_core.result_path(self.project, self.name, result), path)

    async def _result_json(self, result: str) -> Any:
        raw = await self._client.send(
            _core.Request("GET", _core.result_path(self.project, self.name, result), raw=True)
        )
        return _core.decode_bytes(raw)

    async def record(self) -> RunRecord:
        """The finished run's record; see :meth:`nodus.AgentRun.record`."""
        return RunRecord.from_json(await self._result_json("runRecord"))

    async def error(self) -> Optional[RunError]:
        """Why the finished run did not succeed, or ``None``; see :meth:`nodus.AgentRun.error`."""
        if not any(r.name == "error" for r in await self.results()):
            return None
        return RunError.from_json(await self._result_json("error"))

    async def logs(
        self, follow: bool = False, *, timeout: Optional[float] = None
    ) -> AsyncIterator[LogLine]:
        """The run's log line by line, following it with ``follow=True`` until it ends (a
        running command's output as it comes); see :meth:`nodus.AgentRun.logs`. Use ``async
        for line in run.logs(follow=True)``."""
        state = _core.LogState()
        if not follow:
            for line in state.lines(
                await self._client.send(_core.steps_request(self.project, self.name))
            ):
                yield line
            return
        async for line in _follow_logs(self._client, self.name, self.project, state, timeout):
            yield line

    async def _status(self) -> RunStatus:
        return RunStatus.from_json(
            await self._client.get("agentruns", self.name, project=self.project)
        )

    @property
    def status(self) -> Awaitable[RunStatus]:
        """The run's status, read from the server when awaited: ``await run.status``."""
        return self._status()

    async def _settled(self, status: RunStatus) -> bool:
        settled = _core.run_settled(status)
        if settled is None:
            return _core.count_answers(await self._sub("GET", "steps")) >= self._answers_expected
        return settled

    async def wait(self, timeout: Optional[float] = None) -> RunStatus:
        """Waits as :meth:`nodus.AgentRun.wait` does."""
        status: Optional[RunStatus] = None
        follow = _follow(self._client, "agentruns", self.name, self.project, _deadline(timeout))
        async for document in follow:
            status = RunStatus.from_json(document)
            if await self._settled(status):
                return status
        assert status is not None
        raise _core.run_timeout(self.name, status, timeout)

    async def answer(self, timeout: Optional[float] = None) -> str:
        """The answer of the last answered turn; see :meth:`nodus.AgentRun.answer`."""
        status = await self.wait(timeout)
        _core.check_answerable(self.name, status)
        body = await self._sub("GET", "answer")
        return str(body.get("answer") or "")

    async def steps(self) -> List[Step]:
        """What the run did so far, in order."""
        body = await self._sub("GET", "steps")
        return [Step.from_json(item) for item in body.get("items", [])]

    async def send(self, kind: str, payload: str, key: Optional[str] = None) -> Delivery:
        """Sends a message to a keep-alive run; see :meth:`nodus.AgentRun.send`."""
        delivery = Delivery.from_json(
            await self._sub("POST", "messages", _core.message_body(kind, payload, key))
        )
        self._answers_expected = max(self._answers_expected, delivery.seq + 1)
        return delivery

    async def cancel(self) -> RunStatus:
        """Cancels the run; returns the status the server answered."""
        return RunStatus.from_json(await self._sub("POST", "cancel"))

    async def close(self) -> RunStatus:
        """Ends a keep-alive conversation well; see :meth:`nodus.AgentRun.close`."""
        return RunStatus.from_json(await self._sub("POST", "close"))

    async def delete(self) -> None:
        """Deletes the run."""
        await self._client.delete("agentruns", self.name, project=self.project)


class AgentGroup:
    """A handle on the group ``name``; see :class:`nodus.AgentGroup`. ``await group.status``
    reads its status."""

    def __init__(
        self, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        self._document: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        return f"AgentGroup({self.name!r}, project={self.project!r})"

    @classmethod
    async def create(
        cls,
        name: str,
        agent: Union[str, ClaudeAgent],
        max_active: Optional[int] = None,
        max_cost: Any = None,
        evaluation: Optional[Mapping[str, Any]] = None,
        *,
        max_pending: Optional[int] = None,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AgentGroup":
        """Creates the group; see :meth:`nodus.AgentGroup.create`."""
        if isinstance(agent, ClaudeAgent):
            client = client or agent.client
            await agent.ensure()
            # A template's group lives in the client's project, as its runs do.
            target, reference = _core.run_target(agent.project, agent.client.project, agent.name)
            project = project or target
            agent = reference
        group = cls(name, project=project, client=client)
        document = _core.group_document(name, agent, max_active, max_cost, evaluation, max_pending)
        group._document = await group._client.create("agentgroups", document, project=group.project)
        return group

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> "AgentGroup":
        """A handle on the existing group ``name`` (nothing is read yet)."""
        return cls(name, project=project, client=client)

    async def _read(self) -> Dict[str, Any]:
        self._document = await self._client.get("agentgroups", self.name, project=self.project)
        return self._document

    async def _status(self) -> GroupStatus:
        return GroupStatus.from_json(await self._read())

    @property
    def status(self) -> Awaitable[GroupStatus]:
        """The group's status, read from the server when awaited: ``await group.status``."""
        return self._status()

    async def submit(
        self, tasks: Iterable[Union[Task, tuple[Any, ...], Mapping[str, Any]]], *, seal: bool = True
    ) -> List[AgentRun]:
        """Creates a run per task in batches of up to 100, then seals; see
        :meth:`nodus.AgentGroup.submit`."""
        items = as_tasks(tasks)
        document = self._document or await self._read()
        uid = str(document.get("metadata", {}).get("uid", ""))
        agent = str(document.get("spec", {}).get("agent", ""))
        runs: List[AgentRun] = []
        for key, body in _core.batches(self.name, uid, agent, items):
            created = await self._create_batch(key, body)
            runs.extend(
                AgentRun(
                    str(run["metadata"]["name"]),
                    project=self.project,
                    client=self._client,
                    _document=run,
                )
                for run in created.get("items", [])
            )
        if seal:
            await self.seal()
        return runs

    async def _create_batch(self, key: str, body: Dict[str, Any]) -> Dict[str, Any]:
        for attempt in range(3):
            try:
                return await self._client.create(
                    "agentruns", body, project=self.project, idempotency_key=key
                )
            except ServerUnavailable:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def seal(self) -> GroupStatus:
        """Seals the group."""
        self._document = await self._client.patch(
            "agentgroups", self.name, {"spec": {"sealed": True}}, project=self.project
        )
        return GroupStatus.from_json(self._document)

    async def wait(self, timeout: Optional[float] = None) -> GroupStatus:
        """Waits until the group has finished; see :meth:`nodus.AgentGroup.wait`."""
        status: Optional[GroupStatus] = None
        follow = _follow(self._client, "agentgroups", self.name, self.project, _deadline(timeout))
        async for document in follow:
            self._document = document
            status = GroupStatus.from_json(document)
            if status.finished:
                return status
        assert status is not None
        raise _core.group_timeout(self.name, status, timeout)

    async def results(self) -> List[Result]:
        """One result per run, or per case of an evaluation group; see
        :meth:`nodus.AgentGroup.results`."""
        document = self._document or await self._read()
        runs = await self._client.list(
            "agentruns", field_selector=f"spec.group={self.name}", project=self.project
        )
        if is_evaluation(document):
            cases = await self._client.sub(
                "GET", "agentgroups", self.name, "results", project=self.project
            )
            return evaluation_results(cases, runs)
        return [Result.from_json(run) for run in runs]

    async def runs(self) -> List[AgentRun]:
        """A handle on each run of the group."""
        runs = await self._client.list(
            "agentruns", field_selector=f"spec.group={self.name}", project=self.project
        )
        return [
            AgentRun(str(run["metadata"]["name"]), project=self.project, client=self._client)
            for run in runs
        ]

    async def cancel(self) -> GroupStatus:
        """Cancels every unfinished run."""
        return GroupStatus.from_json(
            await self._client.sub("POST", "agentgroups", self.name, "cancel", project=self.project)
        )

    async def delete(self) -> None:
        """Deletes the group with all of its runs."""
        await self._client.delete("agentgroups", self.name, project=self.project)


class AgentEnvironment:
    """A handle on the AgentEnvironment ``name``; see :class:`nodus.AgentEnvironment`.
    :meth:`create`, :meth:`get`, :meth:`list`, :meth:`refresh` and :meth:`delete` are
    coroutines; :attr:`spec` is what was last read."""

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        self._document: Dict[str, Any] = dict(_document or {})

    def __repr__(self) -> str:
        return f"AgentEnvironment({self.name!r}, project={self.project!r})"

    @staticmethod
    def inline(
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, Union[SecretRef, Tuple[str, str]]]] = None,
        compute: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """An environment's spec to write inline into a run; see
        :meth:`nodus.AgentEnvironment.inline`."""
        return _core.environment_spec(env, secrets, compute)

    @classmethod
    async def create(
        cls,
        name: str,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, Union[SecretRef, Tuple[str, str]]]] = None,
        compute: Optional[Mapping[str, Any]] = None,
        *,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AgentEnvironment":
        """Creates the AgentEnvironment ``name``; see :meth:`nodus.AgentEnvironment.create`."""
        handle = cls(name, project=project, client=client)
        document = _core.environment_document(name, cls.inline(env, secrets, compute))
        handle._document = await handle._client.create(
            "agentenvironments", document, project=handle.project
        )
        return handle

    @classmethod
    async def get(
        cls, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> "AgentEnvironment":
        """The AgentEnvironment ``name`` as stored."""
        handle = cls(name, project=project, client=client)
        await handle.refresh()
        return handle

    @classmethod
    async def list(
        cls, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> List["AgentEnvironment"]:
        """Every AgentEnvironment of the project."""
        client = client or default_client()
        items = await client.list("agentenvironments", project=project)
        return [
            cls(
                str(item["metadata"]["name"]),
                project=project or client.project,
                client=client,
                _document=item,
            )
            for item in items
        ]

    async def refresh(self) -> Dict[str, Any]:
        """Reads the environment again; returns it as stored."""
        self._document = await self._client.get(
            "agentenvironments", self.name, project=self.project
        )
        return self._document

    @property
    def spec(self) -> EnvironmentSpec:
        """Its variables, Secret references and compute, as last read (by :meth:`create`,
        :meth:`get`, :meth:`list` or :meth:`refresh`)."""
        return EnvironmentSpec.from_json(self._document.get("spec"))

    def reference(self, project: str) -> str:
        """How a run in ``project`` names it."""
        return self.name if project == self.project else f"{self.project}/{self.name}"

    async def delete(self) -> None:
        """Deletes it; runs created before keep the snapshot they took."""
        await self._client.delete("agentenvironments", self.name, project=self.project)
