"""Agents, runs and groups as Python objects (synchronous): :class:`ClaudeAgent` creates or
updates its agent on first use and starts runs, :class:`AgentRun` is a handle on one run,
:class:`AgentGroup` a handle on a group of runs, :class:`AgentEnvironment` a handle on the
variables, Secrets and compute a run's commands get.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import _core
from .client import Client, default_client
from .errors import AlreadyExists, ServerUnavailable
from .types import (
    Delivery,
    EnvironmentSpec,
    GroupStatus,
    LogLine,
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

__all__ = ["ClaudeAgent", "AgentRun", "AgentGroup", "AgentEnvironment"]

#: What ``environment=`` takes: an AgentEnvironment's name (or ``project/name``), a handle,
#: or a spec written inline (``AgentEnvironment.inline(...)``).
EnvironmentArg = Union[str, "AgentEnvironment", Mapping[str, Any]]


def _environment_value(
    environment: Optional[EnvironmentArg], project: str
) -> Union[None, str, Mapping[str, Any]]:
    if isinstance(environment, AgentEnvironment):
        return environment.reference(project)
    return environment


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def _pause(delay: float, deadline: Optional[float]) -> bool:
    """Sleeps ``delay`` (at most until ``deadline``); ``False`` when the deadline has passed."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        delay = min(delay, left)
    time.sleep(delay)
    return True


def _follow(
    client: Client, plural: str, name: str, project: str, deadline: Optional[float]
) -> Iterator[Dict[str, Any]]:
    """The object now, then each newer version as the server's long poll answers it, until
    ``deadline``. A long poll that answers the same version (it timed out, or the server
    does not wait) is followed by a growing pause; less than a second before the deadline
    the object is read once more at the deadline, so the wait ends on time."""
    document = client.get(plural, name, project=project)
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
            if not _pause(next(pauses) if left is None else left, deadline):
                return
            document = client.get(plural, name, project=project)
            yield document
            continue
        answer = client.watch(plural, name, version, timeout_seconds=seconds, project=project)
        if _core.version_of(answer) == version:
            _pause(next(pauses), deadline)
            continue
        pauses = _core.backoff()
        document = answer
        yield document


def _follow_logs(
    client: Client, name: str, project: str, state: _core.LogState, timeout: Optional[float]
) -> Iterator[LogLine]:
    """``logs(follow=True)``: two threads feed one queue — the live output of the run's
    commands (``GET …/logs?follow=true``, opened before the first read so that a command
    that starts after it shows live) and each new version of the run (its long poll) — and
    each is turned into lines here. A server without live output, or a stream that ends,
    leaves the finished steps to show all of it."""
    events: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
    stop = threading.Event()
    opened = threading.Event()
    streams: List[httpx.Response] = []

    def live() -> None:
        path = _core.resource_path(project, "agentruns", name, "logs")
        try:
            with client._http.stream(
                "GET",
                path,
                params={"follow": "true"},
                headers={"Accept": "application/x-ndjson"},
                timeout=httpx.Timeout(_core.LONG_POLL_MARGIN, read=None),
            ) as response:
                if not response.is_success:
                    return
                streams.append(response)
                lines = response.iter_lines()
                # The head line: the server follows the run from here on.
                next(lines, None)
                opened.set()
                for line in lines:
                    if stop.is_set():
                        return
                    piece = _core.live_piece(line)
                    if piece is not None:
                        events.put(("piece", piece))
        except (httpx.HTTPError, OSError, ValueError):
            # No live output: the finished steps hold all of it.
            pass
        finally:
            opened.set()

    def watch() -> None:
        try:
            for document in _follow(client, "agentruns", name, project, _deadline(timeout)):
                if stop.is_set():
                    return
                events.put(("run", document))
            events.put(("timeout", None))
        except BaseException as error:  # noqa: B036 - handed to the reader, raised there
            events.put(("error", error))

    def steps() -> Any:
        return client.send(_core.steps_request(project, name))

    threading.Thread(target=live, daemon=True).start()
    opened.wait(_core.LONG_POLL_MARGIN)
    threading.Thread(target=watch, daemon=True).start()
    status: Optional[RunStatus] = None
    try:
        while True:
            kind, value = events.get()
            if kind == "run":
                status = RunStatus.from_json(value)
                yield from state.lines(steps())
                if status.finished:
                    # Its last steps may be written after the document: read them once more.
                    yield from state.lines(steps())
                    return
            elif kind == "piece":
                lines = state.piece(value)
                yield from state.lines(steps()) if lines is None else lines
            elif kind == "error":
                raise value
            elif kind == "timeout":
                assert status is not None
                raise _core.run_timeout(name, status, timeout)
    finally:
        stop.set()
        for response in streams:
            response.close()


class ClaudeAgent:
    """An Agent on Claude. On first use (:meth:`remote`, :meth:`submit`, :meth:`ensure`) it
    creates the agent ``name`` with the fields given, or updates the stored agent to them;
    fields not given are left as the server has them.

    ``system`` is the system prompt; ``families`` limits Nodus's routing (``["haiku",
    "sonnet"]``); ``api_key_secret`` names a Secret holding ``ANTHROPIC_API_KEY`` to run on
    your own key (BYOK, with ``model``, default ``claude-sonnet-4-5``); ``per_run_max_cost`` is
    a Decimal or decimal string of dollars. ``environment`` is the default AgentEnvironment of
    its runs, ``context_schema`` the JSON Schema its runs' ``context`` must match, and
    ``post_run_actions`` the post-run action kinds its runs may choose. ``project`` and
    ``client`` choose where it lives (default: the shared
    :func:`~nodus.client.default_client`).
    """

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
        client: Optional[Client] = None,
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
        cls, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> "ClaudeAgent":
        """The agent ``name`` as it is on the server (such as the ready-made
        ``claude-assistant`` template in project ``nodus``, whose runs go in the client's
        project); nothing is changed on it."""
        agent = cls(name, project=project, client=client)
        agent._spec = None
        return agent

    def __repr__(self) -> str:
        return f"ClaudeAgent({self.name!r}, project={self.project!r})"

    @property
    def client(self) -> Client:
        """The client this agent uses."""
        if self._client is None:
            self._client = default_client()
        return self._client

    @property
    def project(self) -> str:
        """The agent's project."""
        return self._project or self.client.project

    def ensure(self) -> Dict[str, Any]:
        """Creates the agent, or updates it to the fields given, and returns it as stored.
        For :meth:`from_name` it only reads it (:class:`~nodus.NotFound` if it is not there)."""
        client, project = self.client, self.project
        if self._spec is None:
            agent = client.get("agents", self.name, project=project)
        else:
            try:
                agent = client.create(
                    "agents", _core.agent_document(self.name, self._spec), project=project
                )
            except AlreadyExists:
                agent = client.get("agents", self.name, project=project)
                patch = _core.agent_patch(agent, self._spec)
                if patch is not None:
                    agent = client.patch("agents", self.name, patch, project=project)
        self._ensured = True
        return agent

    def submit(
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
        """Starts a run with ``prompt`` and returns its handle at once. With
        ``keep_alive=True`` the run waits for messages after each turn (see
        :meth:`AgentRun.send`) until it is cancelled or its ``deadline`` (RFC 3339) passes.
        ``name`` defaults to ``<agent>-<random>``; ``context``, ``environment`` and
        ``post_run_action`` are as for :meth:`AgentRun.create`."""
        return AgentRun.create(
            self,
            prompt,
            name=name,
            keep_alive=keep_alive,
            deadline=deadline,
            context=context,
            environment=environment,
            post_run_action=post_run_action,
        )

    def remote(self, prompt: str, *, timeout: Optional[float] = None) -> str:
        """Runs ``prompt`` to the end and returns the answer. Raises
        :class:`~nodus.RunFailed` when the run fails or is cancelled, and
        :class:`~nodus.WaitTimeout` after ``timeout`` seconds (the run goes on)."""
        return self.submit(prompt).answer(timeout=timeout)


class AgentRun:
    """A handle on the run ``name``: read its :attr:`status`, :meth:`wait` for it, read its
    :meth:`answer` and :meth:`steps`, :meth:`send` it messages, :meth:`cancel` it."""

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[Client] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        # The answered turns a wait for a keep-alive run waits for: the input's, then one
        # per message delivered through this handle.
        self._answers_expected = 1 if _document is not None else 0

    def __repr__(self) -> str:
        return f"AgentRun({self.name!r}, project={self.project!r})"

    @classmethod
    def create(
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
        client: Optional[Client] = None,
    ) -> "AgentRun":
        """Creates a run and returns its handle at once. ``agent`` is an agent's name, a
        :class:`ClaudeAgent` (created or updated first), or a whole agent spec written inline
        (``{"system": …, "model": {"access": "Nodus"}}``: checked and kept with the run, never
        stored as an Agent). ``input`` is the first prompt (the agent's ``defaultInput`` when
        ``None``). ``environment`` is an :class:`AgentEnvironment`, its name, or a spec written
        inline (:meth:`AgentEnvironment.inline`); ``context`` the run's parameters, checked
        against the agent's ``contextSchema`` (a context that fails it raises
        :class:`~nodus.Invalid` naming the path); ``post_run_action`` is ``{"kind":
        "agents.webhook", "config": {…}}``; ``timeout`` bounds the run (``"10m"``); ``image``
        is the container image of a Docker sandbox. ``name`` defaults to
        ``<agent>-<random>``."""
        if isinstance(agent, ClaudeAgent):
            if not agent._ensured:
                agent.ensure()
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
        created = client.create("agentruns", document, project=project)
        return cls(run_name, project=project, client=client, _document=created)

    def _sub(self, method: str, sub: str, body: Any = None) -> Any:
        return self._client.sub(method, "agentruns", self.name, sub, body, project=self.project)

    def document(self) -> Dict[str, Any]:
        """The run as the server has it now (``spec``, ``status`` with its snapshot)."""
        return self._client.get("agentruns", self.name, project=self.project)

    def environment(self) -> Optional[EnvironmentSpec]:
        """The environment the run took when it was created (its snapshot: Secrets by name,
        key and version, never a value), or ``None`` when it has none."""
        return EnvironmentSpec.from_run(self.document())

    def results(self) -> List[RunResult]:
        """The results of the finished run, with their sizes (none before it finishes):
        ``inputWorkdir``, ``outputWorkdir``, ``artifacts`` (gzipped tarballs), ``runRecord``,
        ``error`` when it did not succeed, and what its post-run action saved."""
        body = self._client.send(_core.Request("GET", _core.result_path(self.project, self.name)))
        return [RunResult.from_json(item) for item in body.get("items", [])]

    def download_result(self, result: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Saves the result ``result`` (such as ``outputWorkdir``) to ``path``, streamed and
        renamed into place once whole; returns its size in bytes. Raises
        :class:`~nodus.NotFound` naming it when the run has no such result."""
        return self._client.download(_core.result_path(self.project, self.name, result), path)

    def _result_json(self, result: str) -> Any:
        raw = self._client.send(
            _core.Request("GET", _core.result_path(self.project, self.name, result), raw=True)
        )
        return _core.decode_bytes(raw)

    def record(self) -> RunRecord:
        """The finished run's record (its ``runRecord`` result): phase, reason, the whole
        answer, turns, cost and times."""
        return RunRecord.from_json(self._result_json("runRecord"))

    def error(self) -> Optional[RunError]:
        """Why the finished run did not succeed (its ``error`` result), or ``None`` when it
        succeeded."""
        if not any(r.name == "error" for r in self.results()):
            return None
        return RunError.from_json(self._result_json("error"))

    def logs(self, follow: bool = False, *, timeout: Optional[float] = None) -> Iterator[LogLine]:
        """The run's log as ``nodus agentrun logs`` prints it, line by line: each step, each
        command, and each line of a command's output. Without ``follow``, what there is now
        (a command's output once it has finished). With ``follow=True`` it goes on as the run
        does and ends when the run has ended and everything is shown: a running command's
        output line by line as the server runs it (``GET …/logs?follow=true``), the steps as
        the server's long poll answers each change of the run (never polling), and what the
        live stream missed from the finished step, nothing twice. Raises
        :class:`~nodus.WaitTimeout` after ``timeout`` seconds."""
        state = _core.LogState()
        if not follow:
            yield from state.lines(self._client.send(_core.steps_request(self.project, self.name)))
            return
        yield from _follow_logs(self._client, self.name, self.project, state, timeout)

    @property
    def status(self) -> RunStatus:
        """The run's status, read from the server now."""
        return RunStatus.from_json(self._client.get("agentruns", self.name, project=self.project))

    def _settled(self, status: RunStatus) -> bool:
        settled = _core.run_settled(status)
        if settled is None:
            return _core.count_answers(self._sub("GET", "steps")) >= self._answers_expected
        return settled

    def wait(self, timeout: Optional[float] = None) -> RunStatus:
        """Waits until the run has finished (Succeeded, Failed, Cancelled), needs a
        resolution, or — for a keep-alive run — has answered its input and every message sent
        through this handle and awaits the next one. Waits on the server's long poll, which
        answers each change of the run as it happens; raises :class:`~nodus.WaitTimeout`
        after ``timeout`` seconds."""
        status: Optional[RunStatus] = None
        for document in _follow(
            self._client, "agentruns", self.name, self.project, _deadline(timeout)
        ):
            status = RunStatus.from_json(document)
            if self._settled(status):
                return status
        assert status is not None
        raise _core.run_timeout(self.name, status, timeout)

    def answer(self, timeout: Optional[float] = None) -> str:
        """The whole answer of the run's last answered turn, once it is there: waits as
        :meth:`wait` does. Raises :class:`~nodus.RunFailed` (with the run's reason) when the
        run failed, was cancelled or needs a resolution."""
        status = self.wait(timeout)
        _core.check_answerable(self.name, status)
        body = self._sub("GET", "answer")
        return str(body.get("answer") or "")

    def steps(self) -> List[Step]:
        """What the run did so far, in order: sandbox, routing, model calls, commands,
        answers."""
        body = self._sub("GET", "steps")
        return [Step.from_json(item) for item in body.get("items", [])]

    def send(self, kind: str, payload: str, key: Optional[str] = None) -> Delivery:
        """Sends a message to a keep-alive run: ``run.send("message", "…", key="k1")``.
        Sending the same ``key`` again delivers it once (the answer says ``duplicate``). A
        working run reads it after its current turn; a finished run refuses it with
        :class:`~nodus.AgentRunFinished`."""
        delivery = Delivery.from_json(
            self._sub("POST", "messages", _core.message_body(kind, payload, key))
        )
        self._answers_expected = max(self._answers_expected, delivery.seq + 1)
        return delivery

    def cancel(self) -> RunStatus:
        """Cancels the run (its sandbox is deleted); returns the status the server answered.
        The run ends shortly after: :meth:`wait` for ``Cancelled``."""
        return RunStatus.from_json(self._sub("POST", "cancel"))

    def close(self) -> RunStatus:
        """Ends a keep-alive conversation well: the run answers its current turn and the
        messages sent before, then succeeds with its answer and its sandbox is deleted
        (:meth:`wait` for ``Succeeded``). A finished run refuses with
        :class:`~nodus.AgentRunFinished`."""
        return RunStatus.from_json(self._sub("POST", "close"))

    def delete(self) -> None:
        """Deletes the run (a started run is cancelled first)."""
        self._client.delete("agentruns", self.name, project=self.project)


class AgentGroup:
    """A handle on the group ``name``: :meth:`submit` tasks to it, :meth:`seal` it,
    :meth:`wait` for it, read its :attr:`status` and :meth:`results`, :meth:`cancel` or
    :meth:`delete` it. Make one with :meth:`create` or :meth:`from_name`."""

    def __init__(
        self, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        self._document: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        return f"AgentGroup({self.name!r}, project={self.project!r})"

    @classmethod
    def create(
        cls,
        name: str,
        agent: Union[str, ClaudeAgent],
        max_active: Optional[int] = None,
        max_cost: Any = None,
        evaluation: Optional[Mapping[str, Any]] = None,
        *,
        max_pending: Optional[int] = None,
        project: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "AgentGroup":
        """Creates the group ``name`` of ``agent`` (a name, or a :class:`ClaudeAgent`, which
        is created or updated first): at most ``max_active`` runs at once, ``max_cost``
        dollars (Decimal or decimal string) for all of them. ``evaluation`` is sent as
        ``spec.evaluation``."""
        if isinstance(agent, ClaudeAgent):
            client = client or agent.client
            agent.ensure()
            # A template's group lives in the client's project, as its runs do.
            target, reference = _core.run_target(agent.project, agent.client.project, agent.name)
            project = project or target
            agent = reference
        group = cls(name, project=project, client=client)
        document = _core.group_document(name, agent, max_active, max_cost, evaluation, max_pending)
        group._document = group._client.create("agentgroups", document, project=group.project)
        return group

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> "AgentGroup":
        """A handle on the existing group ``name`` (nothing is read yet)."""
        return cls(name, project=project, client=client)

    def _read(self) -> Dict[str, Any]:
        self._document = self._client.get("agentgroups", self.name, project=self.project)
        return self._document

    @property
    def status(self) -> GroupStatus:
        """The group's status, read from the server now."""
        return GroupStatus.from_json(self._read())

    def submit(
        self, tasks: Iterable[Union[Task, tuple[Any, ...], Mapping[str, Any]]], *, seal: bool = True
    ) -> List[AgentRun]:
        """Creates a run for each task, in order, in batches of up to 100 (each with an
        Idempotency-Key, so a batch retried after a lost answer is created once), then seals
        the group unless ``seal=False``. A task is a :class:`~nodus.Task`, a ``(key, input)``
        or ``(key, input, depends_on)`` tuple, or a mapping; list a task after the tasks it
        depends on. Returns the runs' handles."""
        items = as_tasks(tasks)
        document = self._document or self._read()
        uid = str(document.get("metadata", {}).get("uid", ""))
        agent = str(document.get("spec", {}).get("agent", ""))
        runs: List[AgentRun] = []
        for key, body in _core.batches(self.name, uid, agent, items):
            created = self._create_batch(key, body)
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
            self.seal()
        return runs

    def _create_batch(self, key: str, body: Dict[str, Any]) -> Dict[str, Any]:
        for attempt in range(3):
            try:
                return self._client.create(
                    "agentruns", body, project=self.project, idempotency_key=key
                )
            except ServerUnavailable:
                if attempt == 2:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    def seal(self) -> GroupStatus:
        """Seals the group: it takes no more runs, and finishes once they have."""
        self._document = self._client.patch(
            "agentgroups", self.name, {"spec": {"sealed": True}}, project=self.project
        )
        return GroupStatus.from_json(self._document)

    def wait(self, timeout: Optional[float] = None) -> GroupStatus:
        """Waits until the group has finished (Succeeded, Failed, Cancelled) and returns its
        status, waiting on the server's long poll for each change of it. A group finishes
        only once it is sealed. Raises :class:`~nodus.WaitTimeout` after ``timeout``
        seconds."""
        status: Optional[GroupStatus] = None
        for document in _follow(
            self._client, "agentgroups", self.name, self.project, _deadline(timeout)
        ):
            self._document = document
            status = GroupStatus.from_json(document)
            if status.finished:
                return status
        assert status is not None
        raise _core.group_timeout(self.name, status, timeout)

    def results(self) -> List[Result]:
        """One result per run of the group, in the order the server lists them; for an
        evaluation group one per case, in batch order, with its state (``Pending``,
        ``Scored``, ``Unscored``), verdict, reward and evidence, beside its run's cost."""
        document = self._document or self._read()
        runs = self._client.list(
            "agentruns", field_selector=f"spec.group={self.name}", project=self.project
        )
        if is_evaluation(document):
            cases = self._client.sub(
                "GET", "agentgroups", self.name, "results", project=self.project
            )
            return evaluation_results(cases, runs)
        return [Result.from_json(run) for run in runs]

    def runs(self) -> List[AgentRun]:
        """A handle on each run of the group."""
        runs = self._client.list(
            "agentruns", field_selector=f"spec.group={self.name}", project=self.project
        )
        return [
            AgentRun(str(run["metadata"]["name"]), project=self.project, client=self._client)
            for run in runs
        ]

    def cancel(self) -> GroupStatus:
        """Cancels every unfinished run; finished runs keep their answers."""
        return GroupStatus.from_json(
            self._client.sub("POST", "agentgroups", self.name, "cancel", project=self.project)
        )

    def delete(self) -> None:
        """Deletes the group with all of its runs."""
        self._client.delete("agentgroups", self.name, project=self.project)


class AgentEnvironment:
    """A handle on the AgentEnvironment ``name``: what a run's commands get besides their
    working directory — plain variables, variables from Secrets (the values reach the
    sandbox's environment and nothing else) and compute. :meth:`create`, :meth:`get`,
    :meth:`list` and :meth:`delete` it; name it with ``environment=`` when creating a run, or
    pass :meth:`inline` to write one into the run."""

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[Client] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.name: str = name
        self._client = client or default_client()
        self.project: str = project or self._client.project
        self._document: Optional[Dict[str, Any]] = dict(_document) if _document else None

    def __repr__(self) -> str:
        return f"AgentEnvironment({self.name!r}, project={self.project!r})"

    @staticmethod
    def inline(
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, Union[SecretRef, Tuple[str, str]]]] = None,
        compute: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """An environment's spec to write inline into a run (``environment=``): ``env`` maps
        a variable to its plain value, ``secrets`` a variable to a :class:`~nodus.SecretRef`
        or ``(secret, key)``, ``compute`` takes ``cpu`` (``"2"``, ``"500m"``), ``memory``
        (``"2Gi"``) and ``nvidia.com/gpu``."""
        return _core.environment_spec(env, secrets, compute)

    @classmethod
    def create(
        cls,
        name: str,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, Union[SecretRef, Tuple[str, str]]]] = None,
        compute: Optional[Mapping[str, Any]] = None,
        *,
        project: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "AgentEnvironment":
        """Creates the AgentEnvironment ``name`` (see :meth:`inline` for the arguments). A
        reserved variable name (``PATH``, ``NODUS_…``) or an unknown compute key is refused
        with :class:`~nodus.Invalid` naming the field."""
        handle = cls(name, project=project, client=client)
        document = _core.environment_document(name, cls.inline(env, secrets, compute))
        handle._document = handle._client.create(
            "agentenvironments", document, project=handle.project
        )
        return handle

    @classmethod
    def get(
        cls, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> "AgentEnvironment":
        """The AgentEnvironment ``name`` as stored (:class:`~nodus.NotFound` if there is none)."""
        handle = cls(name, project=project, client=client)
        handle.refresh()
        return handle

    @classmethod
    def list(
        cls, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> List["AgentEnvironment"]:
        """Every AgentEnvironment of the project."""
        client = client or default_client()
        items = client.list("agentenvironments", project=project)
        return [
            cls(
                str(item["metadata"]["name"]),
                project=project or client.project,
                client=client,
                _document=item,
            )
            for item in items
        ]

    def refresh(self) -> Dict[str, Any]:
        """Reads the environment again; returns it as stored."""
        self._document = self._client.get("agentenvironments", self.name, project=self.project)
        return self._document

    @property
    def spec(self) -> EnvironmentSpec:
        """Its variables, Secret references and compute, as last read."""
        document = self._document if self._document is not None else self.refresh()
        return EnvironmentSpec.from_json(document.get("spec"))

    def reference(self, project: str) -> str:
        """How a run in ``project`` names it: its name, or ``project/name`` from another
        project."""
        return self.name if project == self.project else f"{self.project}/{self.name}"

    def delete(self) -> None:
        """Deletes it; runs created before keep the snapshot they took."""
        self._client.delete("agentenvironments", self.name, project=self.project)
