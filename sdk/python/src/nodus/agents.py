"""Agents, runs and groups as Python objects (synchronous): :class:`ClaudeAgent` creates or
updates its agent on first use and starts runs, :class:`AgentRun` is a handle on one run,
:class:`AgentGroup` a handle on a group of runs, :class:`AgentEnvironment` a handle on the
variables, Secrets and compute a run's commands get. Each call's logic is written once in
:mod:`nodus._handles`; the methods here run it on a :class:`~nodus.Client`.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import httpx

from . import _core, _ops
from ._handles import AgentCore, EnvironmentCore, GroupCore, RunCore
from .client import Client, default_client
from .types import (
    Delivery,
    EgressRecord,
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
)

__all__ = ["ClaudeAgent", "AgentRun", "AgentGroup", "AgentEnvironment"]

#: What ``environment=`` takes: an AgentEnvironment's name (or ``project/name``), a handle,
#: or a spec written inline (``AgentEnvironment.inline(...)``).
EnvironmentArg = Union[str, "AgentEnvironment", Mapping[str, Any]]


class _Sync:
    """The handles of this module use the shared synchronous client by default."""

    @classmethod
    def _default_client(cls) -> Client:
        return default_client()


def _documents(client: Client, follow: _ops.Follow) -> Iterator[Dict[str, Any]]:
    """Each version of a followed object, until its deadline."""
    while True:
        document = client._run(follow.next())
        if document is None:
            return
        yield document


def _follow_logs(run: "AgentRun", timeout: Optional[float]) -> Iterator[LogLine]:
    """``logs(follow=True)``: two threads feed one queue — the live output of the run's
    commands (``GET …/logs?follow=true``, opened before the first read so that a command
    that starts after it shows live) and each new version of the run (its long poll) — and
    each is turned into lines here. A server without live output, or a stream that ends,
    leaves the finished steps to show all of it."""
    client, name, project = run._client, run.name, run.project
    events: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
    stop = threading.Event()
    opened = threading.Event()
    streams: List[httpx.Response] = []
    follow_log = _ops.LogFollow(project, name, timeout)

    def live() -> None:
        try:
            arguments = _ops.live_logs_arguments(project, name)
            with client._http.stream(**arguments) as response:
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
            for document in _documents(client, run._follow(timeout)):
                if stop.is_set():
                    return
                events.put(("run", document))
            events.put(("timeout", None))
        except BaseException as error:  # noqa: B036 - handed to the reader, raised there
            events.put(("error", error))

    threading.Thread(target=live, daemon=True).start()
    opened.wait(_core.LONG_POLL_MARGIN)
    threading.Thread(target=watch, daemon=True).start()
    try:
        while not follow_log.finished:
            kind, value = events.get()
            yield from client._run(follow_log.lines(kind, value))
    finally:
        stop.set()
        for response in streams:
            response.close()


class ClaudeAgent(_Sync, AgentCore[Client]):
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

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> "ClaudeAgent":
        """The agent ``name`` as it is on the server (such as the ready-made
        ``claude-assistant`` template in project ``nodus``, whose runs go in the client's
        project); nothing is changed on it."""
        return cls._named(name, project, client)

    def ensure(self) -> Dict[str, Any]:
        """Creates the agent, or updates it to the fields given, and returns it as stored.
        For :meth:`from_name` it only reads it (:class:`~nodus.NotFound` if it is not there)."""
        return self.client._run(self._ensure())

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


class AgentRun(_Sync, RunCore[Client]):
    """A handle on the run ``name``: read its :attr:`status`, :meth:`wait` for it, read its
    :meth:`answer` and :meth:`steps`, :meth:`send` it messages, :meth:`cancel` it."""

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
        auto_telemetry: bool = True,
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
        is the container image of a Docker sandbox; ``auto_telemetry=False`` keeps no
        ``trajectory`` result. ``name`` defaults to ``<agent>-<random>``."""
        if isinstance(agent, ClaudeAgent) and not agent._ensured:
            agent.ensure()
        client = cls._client_for(agent, client)
        return client._run(
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

    def document(self) -> Dict[str, Any]:
        """The run as the server has it now (``spec``, ``status`` with its snapshot)."""
        return self._client._run(self._read())

    def environment(self) -> Optional[EnvironmentSpec]:
        """The environment the run took when it was created (its snapshot: Secrets by name,
        key and version, never a value), or ``None`` when it has none."""
        return self._client._run(self._environment())

    def results(self) -> List[RunResult]:
        """The results of the finished run, with their sizes (none before it finishes):
        ``inputWorkdir``, ``outputWorkdir``, ``artifacts`` (gzipped tarballs), ``runRecord``,
        ``error`` when it did not succeed, ``trajectory`` unless it was created with
        ``auto_telemetry=False``, and what its post-run action saved."""
        return self._client._run(self._results())

    def download_result(self, result: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Saves the result ``result`` (such as ``outputWorkdir``) to ``path``, streamed and
        renamed into place once whole; returns its size in bytes. Raises
        :class:`~nodus.NotFound` naming it when the run has no such result."""
        return self._client.download(self._result_path(result), path)

    def record(self) -> RunRecord:
        """The finished run's record (its ``runRecord`` result): phase, reason, the whole
        answer, turns, cost and times."""
        return self._client._run(self._record())

    def trajectory(self) -> Dict[str, Any]:
        """The finished run's trajectory (its ``trajectory`` result) as a dict: an ATIF-v1.8
        document built from its journal (the system prompt, each prompt, each model call with
        its tool calls and their results, per-step and final tokens and cost; ``session_id``
        is the run's uid). Costs are JSON numbers there; the exact amounts are the strings in
        ``extra.cost_usd_exact``. Raises :class:`~nodus.NotFound` saying why when the run has
        none (it has not finished, or it was created with ``auto_telemetry=False``)."""
        return self._client._run(self._trajectory())

    def egress(self) -> List[EgressRecord]:
        """The connections the finished run's sandbox asked the egress proxy for (its
        ``egress`` result), oldest first: host, port, address, verdict, rule, bytes and
        duration of each. Raises :class:`~nodus.NotFound` saying why when the run has none
        (it has not finished, or its environment gave it no allowlist)."""
        return self._client._run(self._egress())

    def error(self) -> Optional[RunError]:
        """Why the finished run did not succeed (its ``error`` result), or ``None`` when it
        succeeded."""
        return self._client._run(self._error())

    def logs(self, follow: bool = False, *, timeout: Optional[float] = None) -> Iterator[LogLine]:
        """The run's log as ``nodus agentrun logs`` prints it, line by line: each step, each
        command, and each line of a command's output. Without ``follow``, what there is now
        (a command's output once it has finished). With ``follow=True`` it goes on as the run
        does and ends when the run has ended and everything is shown: a running command's
        output line by line as the server runs it (``GET …/logs?follow=true``), the steps as
        the server's long poll answers each change of the run (never polling), and what the
        live stream missed from the finished step, nothing twice. Raises
        :class:`~nodus.WaitTimeout` after ``timeout`` seconds."""
        if not follow:
            yield from self._client._run(self._log_now())
            return
        yield from _follow_logs(self, timeout)

    @property
    def status(self) -> RunStatus:
        """The run's status, read from the server now."""
        return self._client._run(self._read_status())

    def wait(self, timeout: Optional[float] = None) -> RunStatus:
        """Waits until the run has finished (Succeeded, Failed, Cancelled), needs a
        resolution, or — for a keep-alive run — has answered its input and every message sent
        through this handle and awaits the next one. Waits on the server's long poll, which
        answers each change of the run as it happens; raises :class:`~nodus.WaitTimeout`
        after ``timeout`` seconds."""
        return self._client._run(self._wait(timeout))

    def answer(self, timeout: Optional[float] = None) -> str:
        """The whole answer of the run's last answered turn, once it is there: waits as
        :meth:`wait` does. Raises :class:`~nodus.RunFailed` (with the run's reason) when the
        run failed, was cancelled or needs a resolution."""
        return self._client._run(self._answer(timeout))

    def steps(self) -> List[Step]:
        """What the run did so far, in order: sandbox, routing, model calls, commands,
        answers."""
        return self._client._run(self._steps())

    def send(self, kind: str, payload: str, key: Optional[str] = None) -> Delivery:
        """Sends a message to a keep-alive run: ``run.send("message", "…", key="k1")``.
        Sending the same ``key`` again delivers it once (the answer says ``duplicate``). A
        working run reads it after its current turn; a finished run refuses it with
        :class:`~nodus.AgentRunFinished`."""
        return self._client._run(self._send(kind, payload, key))

    def fork(
        self,
        at_step: Union[int, str],
        count: int = 1,
        *,
        name: Optional[str] = None,
        agent: Optional[str] = None,
        replace: bool = False,
        input: Optional[str] = None,
    ) -> List["AgentRun"]:
        """Forks the run after its command step ``at_step`` (a step's ``seq``, or
        ``"last-good"``): ``count`` new runs (all or nothing) whose journals begin with this
        run's steps up to it (inherited, not carried out or charged again) and whose working
        directories start from its snapshot after it. ``agent`` continues with another
        agent; ``input`` is a new user message the forks' next model call sees after the
        conversation as it stood; ``replace`` cancels this run once the forks exist. A step
        that cannot be forked from raises :class:`~nodus.Invalid` naming why."""
        forks: List[AgentRun] = self._client._run(
            self._fork(at_step, count, name, agent, replace, input)
        )
        return forks

    def cancel(self) -> RunStatus:
        """Cancels the run (its sandbox is deleted); returns the status the server answered.
        The run ends shortly after: :meth:`wait` for ``Cancelled``."""
        return self._client._run(self._post("cancel"))

    def close(self) -> RunStatus:
        """Ends a keep-alive conversation well: the run answers its current turn and the
        messages sent before, then succeeds with its answer and its sandbox is deleted
        (:meth:`wait` for ``Succeeded``). A finished run refuses with
        :class:`~nodus.AgentRunFinished`."""
        return self._client._run(self._post("close"))

    def delete(self) -> None:
        """Deletes the run (a started run is cancelled first)."""
        self._client._run(self._delete())


class AgentGroup(_Sync, GroupCore[Client, AgentRun]):
    """A handle on the group ``name``: :meth:`submit` tasks to it, :meth:`seal` it,
    :meth:`wait` for it, read its :attr:`status` and :meth:`results`, :meth:`cancel` or
    :meth:`delete` it. Make one with :meth:`create` or :meth:`from_name`."""

    _run_class = AgentRun

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
        client = cls._client_for(agent, client)
        if isinstance(agent, ClaudeAgent):
            agent.ensure()
        return client._run(
            cls._create(name, agent, client, max_active, max_cost, evaluation, max_pending, project)
        )

    @classmethod
    def from_name(
        cls, name: str, *, project: Optional[str] = None, client: Optional[Client] = None
    ) -> "AgentGroup":
        """A handle on the existing group ``name`` (nothing is read yet)."""
        return cls(name, project=project, client=client)

    @property
    def status(self) -> GroupStatus:
        """The group's status, read from the server now."""
        return self._client._run(self._read_status())

    def submit(
        self, tasks: Iterable[Union[Task, tuple[Any, ...], Mapping[str, Any]]], *, seal: bool = True
    ) -> List[AgentRun]:
        """Creates a run for each task, in order, in batches of up to 100 (each with an
        Idempotency-Key, so a batch retried after a lost answer is created once), then seals
        the group unless ``seal=False``. A task is a :class:`~nodus.Task`, a ``(key, input)``
        or ``(key, input, depends_on)`` tuple, or a mapping; list a task after the tasks it
        depends on. Returns the runs' handles."""
        return self._client._run(self._submit(tasks, seal))

    def seal(self) -> GroupStatus:
        """Seals the group: it takes no more runs, and finishes once they have."""
        return self._client._run(self._seal())

    def wait(self, timeout: Optional[float] = None) -> GroupStatus:
        """Waits until the group has finished (Succeeded, Failed, Cancelled) and returns its
        status, waiting on the server's long poll for each change of it. A group finishes
        only once it is sealed. Raises :class:`~nodus.WaitTimeout` after ``timeout``
        seconds."""
        return self._client._run(self._wait(timeout))

    def results(self) -> List[Result]:
        """One result per run of the group, in the order the server lists them; for an
        evaluation group one per case, in batch order, with its state (``Pending``,
        ``Scored``, ``Unscored``), verdict, reward and evidence, beside its run's cost."""
        return self._client._run(self._results())

    def runs(self) -> List[AgentRun]:
        """A handle on each run of the group."""
        return self._client._run(self._runs())

    def cancel(self) -> GroupStatus:
        """Cancels every unfinished run; finished runs keep their answers."""
        return self._client._run(self._cancel())

    def retry(
        self, reasons: Optional[Iterable[str]] = None, tasks: Optional[Iterable[str]] = None
    ) -> List[Dict[str, Any]]:
        """Gives each unscored case of this finished evaluation group (of these ``reasons``
        and ``tasks``, default all) a new attempt, a new run in the group; answers the retried
        cases. The server refuses a running group or nothing to retry (:class:`nodus.Invalid`)."""
        return self._client._run(self._retry(reasons, tasks))

    def rescore(self, environment: str, name: Optional[str] = None) -> "AgentGroup":
        """A new evaluation group (default ``<name>-rescore``) grading this finished group's
        kept answers and working directories with Environment version ``environment``'s
        grader: no model call, no run."""
        created = self._client._run(self._rescore(environment, name))
        return AgentGroup(created, project=self.project, client=self._client)

    def delete(self) -> None:
        """Deletes the group with all of its runs."""
        self._client._run(self._delete())


class AgentEnvironment(_Sync, EnvironmentCore[Client]):
    """A handle on the AgentEnvironment ``name``: what a run's commands get besides their
    working directory — plain variables, variables from Secrets (the values reach the
    sandbox's environment and nothing else) and compute. :meth:`create`, :meth:`get`,
    :meth:`list` and :meth:`delete` it; name it with ``environment=`` when creating a run, or
    pass :meth:`inline` to write one into the run."""

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
        return handle._client._run(handle._store(env, secrets, compute))

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
        return client._run(cls._listed(project, client))

    def refresh(self) -> Dict[str, Any]:
        """Reads the environment again; returns it as stored."""
        return self._client._run(self._refresh())

    @property
    def spec(self) -> EnvironmentSpec:
        """Its variables, Secret references and compute, as last read."""
        return self._spec_of(self._document if self._document is not None else self.refresh())

    def reference(self, project: str) -> str:
        """How a run in ``project`` names it: its name, or ``project/name`` from another
        project."""
        return self._reference(project)

    def delete(self) -> None:
        """Deletes it; runs created before keep the snapshot they took."""
        self._client._run(self._delete())
