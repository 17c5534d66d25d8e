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
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

import httpx

from . import _core, _download, _ops
from ._handles import AgentCore, EnvironmentCore, GroupCore, RunCore
from ._ops import ClientCore
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
    EgressRecord,
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


T = TypeVar("T")


class AsyncClient(ClientCore):
    """A connection to one server with one token, for asyncio; see :class:`nodus.Client`
    for where ``server``, ``token`` and ``project`` come from. Use ``async with``, or await
    :meth:`aclose`, to close its connections."""

    _http: httpx.AsyncClient

    def _open(self, timeout: float) -> None:
        self._http = httpx.AsyncClient(**self._http_options(timeout))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the client's connections."""
        await self._http.aclose()

    async def _run(self, op: _ops.Op[T]) -> T:
        """Carries out the operation ``op`` as :meth:`nodus.Client._run` does, awaiting each
        request and pause."""
        try:
            effect = next(op)
            while True:
                try:
                    if isinstance(effect, _ops.Pause):
                        await asyncio.sleep(effect.seconds)
                        answer = None
                    else:
                        answer = await self.send(effect)
                except Exception as error:
                    effect = op.throw(error)
                else:
                    effect = op.send(answer)
        except StopIteration as stop:
            returned: T = stop.value
            return returned

    async def send(self, request: _core.Request) -> Any:
        """Sends one request; see :meth:`nodus.Client.send`."""
        try:
            response = await self._http.request(**_ops.request_arguments(request))
        except httpx.TransportError as error:
            raise _core.connection_error(self.server, error) from None
        return _core.result(response, request.raw)

    async def download(self, path: str, file: Union[str, "os.PathLike[str]"]) -> int:
        """``GET path`` into ``file``, streamed; see :meth:`nodus.Client.download`."""
        with _download.download(file, self.server) as into:
            async with self._http.stream("GET", path, headers={"Accept": "*/*"}) as response:
                if not response.is_success:
                    await response.aread()
                into.begin(response)
                async for chunk in response.aiter_bytes():
                    into.write(chunk)
        return into.written

    async def post_run_actions(self) -> List[PostRunActionInfo]:
        """The post-run actions this server installs; see
        :meth:`nodus.Client.post_run_actions`."""
        return await self._run(self._post_run_actions())

    async def get(self, plural: str, name: str, *, project: Optional[str] = None) -> Dict[str, Any]:
        """``GET …/{plural}/{name}``: one object."""
        return await self._run(self._get(plural, name, project))

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
        return await self._run(
            self._watch(plural, name, resource_version, timeout_seconds, project)
        )

    async def list(
        self,
        plural: str,
        *,
        field_selector: Optional[str] = None,
        label_selector: Optional[str] = None,
        project: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        """``GET …/{plural}``: the objects, filtered by the selectors."""
        return await self._run(self._list(plural, field_selector, label_selector, project))

    async def create(
        self,
        plural: str,
        document: Mapping[str, Any],
        *,
        project: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Dict[str, Any]:
        """``POST …/{plural}``: creates the object or a batch of runs."""
        return await self._run(self._create(plural, document, project, idempotency_key))

    async def patch(
        self, plural: str, name: str, patch: Mapping[str, Any], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """``PATCH …/{plural}/{name}``: a JSON merge patch."""
        return await self._run(self._patch(plural, name, patch, project))

    async def delete(self, plural: str, name: str, *, project: Optional[str] = None) -> None:
        """``DELETE …/{plural}/{name}``."""
        await self._run(self._delete(plural, name, project))

    async def create_secret(
        self, name: str, values: Mapping[str, str], *, project: Optional[str] = None
    ) -> Dict[str, Any]:
        """Creates a Secret with ``values``; the server seals them and never answers them."""
        return await self._run(self._create_secret(name, values, project))

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
        return await self._run(self._sub(method, plural, name, sub, body, project))


_default: Optional[AsyncClient] = None


def default_client() -> AsyncClient:
    """The async client that handles use when none is given, made on first use."""
    global _default
    if _default is None:
        _default = AsyncClient()
    return _default


class _Async:
    """The handles of this module use the shared asyncio client by default."""

    @classmethod
    def _default_client(cls) -> AsyncClient:
        return default_client()


async def _documents(client: AsyncClient, follow: _ops.Follow) -> AsyncIterator[Dict[str, Any]]:
    """Each version of a followed object, until its deadline."""
    while True:
        document = await client._run(follow.next())
        if document is None:
            return
        yield document


async def _follow_logs(run: "AgentRun", timeout: Optional[float]) -> AsyncIterator[LogLine]:
    """``logs(follow=True)``: two tasks feed one queue — the live output of the run's
    commands and each new version of the run — as the sync ``_follow_logs`` in
    :mod:`nodus.agents` does with threads."""
    client, name, project = run._client, run.name, run.project
    events: "asyncio.Queue[Tuple[str, Any]]" = asyncio.Queue()
    opened = asyncio.Event()
    follow_log = _ops.LogFollow(project, name, timeout)

    async def live() -> None:
        try:
            arguments = _ops.live_logs_arguments(project, name)
            async with client._http.stream(**arguments) as response:
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
            async for document in _documents(client, run._follow(timeout)):
                await events.put(("run", document))
            await events.put(("timeout", None))
        except Exception as error:
            await events.put(("error", error))

    live_task = asyncio.ensure_future(live())
    try:
        await asyncio.wait_for(opened.wait(), _core.LONG_POLL_MARGIN)
    except asyncio.TimeoutError:
        pass
    watch_task = asyncio.ensure_future(watch())
    try:
        while not follow_log.finished:
            kind, value = await events.get()
            for line in await client._run(follow_log.lines(kind, value)):
                yield line
    finally:
        for task in (live_task, watch_task):
            task.cancel()


#: What ``environment=`` takes; see :class:`nodus.AgentRun.create`.
EnvironmentArg = Union[str, "AgentEnvironment", Mapping[str, Any]]


class ClaudeAgent(_Async, AgentCore[AsyncClient]):
    """An Agent on Claude; see :class:`nodus.ClaudeAgent`. Its methods are coroutines."""

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> "ClaudeAgent":
        """The agent ``name`` as it is on the server; nothing is changed on it."""
        return cls._named(name, project, client)

    async def ensure(self) -> Dict[str, Any]:
        """Creates the agent, or updates it to the fields given; returns it as stored."""
        return await self.client._run(self._ensure())

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


class AgentRun(_Async, RunCore[AsyncClient]):
    """A handle on the run ``name``; see :class:`nodus.AgentRun`. ``await run.status``
    reads its status."""

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
        auto_telemetry: bool = True,
        project: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AgentRun":
        """Creates a run and returns its handle; see :meth:`nodus.AgentRun.create`."""
        if isinstance(agent, ClaudeAgent) and not agent._ensured:
            await agent.ensure()
        client = cls._client_for(agent, client)
        return await client._run(
            cls._create(
                agent,
                input,
                client,
                name=name,
                environment=environment,
                context=context,
                post_run_action=post_run_action,
                keep_alive=keep_alive,
                deadline=deadline,
                timeout=timeout,
                image=image,
                project=project,
                auto_telemetry=auto_telemetry,
            )
        )

    async def document(self) -> Dict[str, Any]:
        """The run as the server has it now."""
        return await self._client._run(self._read())

    async def environment(self) -> Optional[EnvironmentSpec]:
        """The environment the run took when it was created; see
        :meth:`nodus.AgentRun.environment`."""
        return await self._client._run(self._environment())

    async def results(self) -> List[RunResult]:
        """The results of the finished run with their sizes; see
        :meth:`nodus.AgentRun.results`."""
        return await self._client._run(self._results())

    async def download_result(self, result: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Saves the result ``result`` to ``path``; see :meth:`nodus.AgentRun.download_result`."""
        return await self._client.download(self._result_path(result), path)

    async def record(self) -> RunRecord:
        """The finished run's record; see :meth:`nodus.AgentRun.record`."""
        return await self._client._run(self._record())

    async def trajectory(self) -> Dict[str, Any]:
        """The finished run's trajectory (ATIF) as a dict; see :meth:`nodus.AgentRun.trajectory`."""
        return await self._client._run(self._trajectory())

    async def egress(self) -> List[EgressRecord]:
        """The finished run's egress records; see :meth:`nodus.AgentRun.egress`."""
        return await self._client._run(self._egress())

    async def error(self) -> Optional[RunError]:
        """Why the finished run did not succeed, or ``None``; see :meth:`nodus.AgentRun.error`."""
        return await self._client._run(self._error())

    async def logs(
        self, follow: bool = False, *, timeout: Optional[float] = None
    ) -> AsyncIterator[LogLine]:
        """The run's log line by line, following it with ``follow=True`` until it ends (a
        running command's output as it comes); see :meth:`nodus.AgentRun.logs`. Use ``async
        for line in run.logs(follow=True)``."""
        if not follow:
            for line in await self._client._run(self._log_now()):
                yield line
            return
        async for line in _follow_logs(self, timeout):
            yield line

    @property
    def status(self) -> Awaitable[RunStatus]:
        """The run's status, read from the server when awaited: ``await run.status``."""
        return self._client._run(self._read_status())

    async def wait(self, timeout: Optional[float] = None) -> RunStatus:
        """Waits as :meth:`nodus.AgentRun.wait` does."""
        return await self._client._run(self._wait(timeout))

    async def answer(self, timeout: Optional[float] = None) -> str:
        """The answer of the last answered turn; see :meth:`nodus.AgentRun.answer`."""
        return await self._client._run(self._answer(timeout))

    async def steps(self) -> List[Step]:
        """What the run did so far, in order."""
        return await self._client._run(self._steps())

    async def send(self, kind: str, payload: str, key: Optional[str] = None) -> Delivery:
        """Sends a message to a keep-alive run; see :meth:`nodus.AgentRun.send`."""
        return await self._client._run(self._send(kind, payload, key))

    async def fork(
        self,
        at_step: Union[int, str],
        count: int = 1,
        *,
        name: Optional[str] = None,
        agent: Optional[str] = None,
        replace: bool = False,
        input: Optional[str] = None,
    ) -> List["AgentRun"]:
        """Forks the run after a command step; see :meth:`nodus.AgentRun.fork`."""
        forks: List[AgentRun] = await self._client._run(
            self._fork(at_step, count, name, agent, replace, input)
        )
        return forks

    async def cancel(self) -> RunStatus:
        """Cancels the run; returns the status the server answered."""
        return await self._client._run(self._post("cancel"))

    async def close(self) -> RunStatus:
        """Ends a keep-alive conversation well; see :meth:`nodus.AgentRun.close`."""
        return await self._client._run(self._post("close"))

    async def delete(self) -> None:
        """Deletes the run."""
        await self._client._run(self._delete())


class AgentGroup(_Async, GroupCore[AsyncClient, AgentRun]):
    """A handle on the group ``name``; see :class:`nodus.AgentGroup`. ``await group.status``
    reads its status."""

    _run_class = AgentRun

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
        client = cls._client_for(agent, client)
        if isinstance(agent, ClaudeAgent):
            await agent.ensure()
        return await client._run(
            cls._create(name, agent, client, max_active, max_cost, evaluation, max_pending, project)
        )

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[AsyncClient] = None
    ) -> "AgentGroup":
        """A handle on the existing group ``name`` (nothing is read yet)."""
        return cls(name, project=project, client=client)

    @property
    def status(self) -> Awaitable[GroupStatus]:
        """The group's status, read from the server when awaited: ``await group.status``."""
        return self._client._run(self._read_status())

    async def submit(
        self, tasks: Iterable[Union[Task, tuple[Any, ...], Mapping[str, Any]]], *, seal: bool = True
    ) -> List[AgentRun]:
        """Creates a run per task in batches of up to 100, then seals; see
        :meth:`nodus.AgentGroup.submit`."""
        return await self._client._run(self._submit(tasks, seal))

    async def seal(self) -> GroupStatus:
        """Seals the group."""
        return await self._client._run(self._seal())

    async def wait(self, timeout: Optional[float] = None) -> GroupStatus:
        """Waits until the group has finished; see :meth:`nodus.AgentGroup.wait`."""
        return await self._client._run(self._wait(timeout))

    async def results(self) -> List[Result]:
        """One result per run, or per case of an evaluation group; see
        :meth:`nodus.AgentGroup.results`."""
        return await self._client._run(self._results())

    async def runs(self) -> List[AgentRun]:
        """A handle on each run of the group."""
        return await self._client._run(self._runs())

    async def cancel(self) -> GroupStatus:
        """Cancels every unfinished run."""
        return await self._client._run(self._cancel())

    async def retry(
        self, reasons: Optional[Iterable[str]] = None, tasks: Optional[Iterable[str]] = None
    ) -> List[Dict[str, Any]]:
        """A new attempt for each unscored case; see :meth:`nodus.AgentGroup.retry`."""
        return await self._client._run(self._retry(reasons, tasks))

    async def rescore(self, environment: str, name: Optional[str] = None) -> "AgentGroup":
        """A rescore of this group; see :meth:`nodus.AgentGroup.rescore`."""
        created = await self._client._run(self._rescore(environment, name))
        return AgentGroup(created, project=self.project, client=self._client)

    async def delete(self) -> None:
        """Deletes the group with all of its runs."""
        await self._client._run(self._delete())


class AgentEnvironment(_Async, EnvironmentCore[AsyncClient]):
    """A handle on the AgentEnvironment ``name``; see :class:`nodus.AgentEnvironment`.
    :meth:`create`, :meth:`get`, :meth:`list`, :meth:`refresh` and :meth:`delete` are
    coroutines; :attr:`spec` is what was last read."""

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
        return await handle._client._run(handle._store(env, secrets, compute))

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
        return await client._run(cls._listed(project, client))

    async def refresh(self) -> Dict[str, Any]:
        """Reads the environment again; returns it as stored."""
        return await self._client._run(self._refresh())

    @property
    def spec(self) -> EnvironmentSpec:
        """Its variables, Secret references and compute, as last read (by :meth:`create`,
        :meth:`get`, :meth:`list` or :meth:`refresh`)."""
        return self._spec_of(self._document)

    def reference(self, project: str) -> str:
        """How a run in ``project`` names it."""
        return self._reference(project)

    async def delete(self) -> None:
        """Deletes it; runs created before keep the snapshot they took."""
        await self._client._run(self._delete())
