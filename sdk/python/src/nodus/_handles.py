"""The handles of the synchronous and the asyncio API written once: :class:`AgentCore`,
:class:`RunCore`, :class:`GroupCore` and :class:`EnvironmentCore` hold a handle's state and
each of its calls as an operation (see :mod:`nodus._ops`). :mod:`nodus.agents` and
:mod:`nodus.aio` derive their public classes from them; each public method runs one
operation on the handle's client.
"""

from __future__ import annotations

import json
from typing import (
    Any,
    Dict,
    Generic,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from . import _core
from ._ops import ClientCore, Follow, Op, Pause, deadline
from .errors import AlreadyExists, ServerUnavailable
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
    as_tasks,
    evaluation_results,
    is_evaluation,
)

C = TypeVar("C", bound=ClientCore)
A = TypeVar("A", bound="AgentCore[Any]")
R = TypeVar("R", bound="RunCore[Any]")
G = TypeVar("G", bound="GroupCore[Any, Any]")
E = TypeVar("E", bound="EnvironmentCore[Any]")

#: What ``environment=`` takes: an AgentEnvironment's name (or ``project/name``), a handle,
#: or a spec written inline.
EnvironmentArg = Union[str, "EnvironmentCore[Any]", Mapping[str, Any]]
#: What a group's ``submit`` takes as one task.
TaskArg = Union[Task, Tuple[Any, ...], Mapping[str, Any]]
#: How many times a batch of runs is sent while the server answers that it is unavailable.
BATCH_ATTEMPTS = 3


def environment_value(
    environment: Optional[EnvironmentArg], project: str
) -> Union[None, str, Mapping[str, Any]]:
    """``environment=`` as a run in ``project`` names it."""
    if isinstance(environment, EnvironmentCore):
        return environment._reference(project)
    return environment


class HandleCore(Generic[C]):
    """What every handle has: the shared default client of its kind."""

    @classmethod
    def _default_client(cls) -> C:
        raise NotImplementedError

    @classmethod
    def _client_for(cls, agent: object, client: Optional[C]) -> C:
        """The client of a run or group of ``agent``: the one given, else the agent's, else
        the default."""
        if client is None and isinstance(agent, AgentCore):
            client = agent.client
        return client or cls._default_client()


class NamedHandle(HandleCore[C]):
    """A handle on the object ``name`` of a project, through a client."""

    #: The public class's name, as ``repr`` shows it.
    _kind = ""

    def __init__(
        self, name: str, *, project: Optional[str] = None, client: Optional[C] = None
    ) -> None:
        self.name: str = name
        self._client: C = client or self._default_client()
        self.project: str = project or self._client.project

    def __repr__(self) -> str:
        return f"{self._kind}({self.name!r}, project={self.project!r})"


class AgentCore(HandleCore[C]):
    """An Agent on Claude (see :class:`nodus.ClaudeAgent`)."""

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
        client: Optional[C] = None,
    ) -> None:
        self.name: str = name
        self._spec: Optional[Dict[str, Any]] = _core.agent_spec(
            system, families, api_key_secret, model, max_tokens, per_run_max_cost
        )
        if environment is not None:
            if isinstance(environment, EnvironmentCore):
                environment = environment._reference(project or environment.project)
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
    def _named(cls: Type[A], name: str, project: Optional[str], client: Any) -> A:
        agent = cls(name, project=project, client=client)
        agent._spec = None
        return agent

    def __repr__(self) -> str:
        return f"ClaudeAgent({self.name!r}, project={self.project!r})"

    @property
    def client(self) -> C:
        """The client this agent uses."""
        if self._client is None:
            self._client = self._default_client()
        return self._client

    @property
    def project(self) -> str:
        """The agent's project."""
        return self._project or self.client.project

    def _ensure(self) -> Op[Dict[str, Any]]:
        client, project = self.client, self.project
        if self._spec is None:
            agent = yield from client._get("agents", self.name, project)
        else:
            try:
                document = _core.agent_document(self.name, self._spec)
                agent = yield from client._create("agents", document, project)
            except AlreadyExists:
                agent = yield from client._get("agents", self.name, project)
                patch = _core.agent_patch(agent, self._spec)
                if patch is not None:
                    agent = yield from client._patch("agents", self.name, patch, project)
        self._ensured = True
        return agent


class RunCore(NamedHandle[C]):
    """A handle on one run (see :class:`nodus.AgentRun`)."""

    _kind = "AgentRun"

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[C] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(name, project=project, client=client)
        # The answered turns a wait for a keep-alive run waits for: the input's, then one
        # per message delivered through this handle.
        self._answers_expected = 1 if _document is not None else 0

    @classmethod
    def _create(
        cls: Type[R],
        agent: Union[str, AgentCore[Any], Mapping[str, Any]],
        input: Optional[str],
        client: Any,
        *,
        name: Optional[str],
        environment: Optional[EnvironmentArg],
        context: Optional[Mapping[str, Any]],
        post_run_action: Optional[Mapping[str, Any]],
        keep_alive: bool,
        deadline: Optional[str],
        timeout: Optional[str],
        image: Optional[str],
        project: Optional[str],
        auto_telemetry: bool = True,
    ) -> Op[R]:
        """Creates the run with ``client`` (an agent handle is ensured before)."""
        if isinstance(agent, AgentCore):
            target, reference = _core.run_target(agent.project, client.project, agent.name)
            project = project or target
            stem = agent.name
            spec_agent: Union[str, Mapping[str, Any]] = reference
        else:
            stem = agent.rsplit("/", 1)[-1] if isinstance(agent, str) else "run"
            spec_agent = agent
        project = project or client.project
        run_name = name or _core.new_run_name(stem)
        document = _core.run_document(
            run_name,
            spec_agent,
            input,
            keep_alive,
            deadline,
            context,
            environment=environment_value(environment, project),
            post_run_action=post_run_action,
            timeout=timeout,
            image=image,
            auto_telemetry=auto_telemetry,
        )
        created = yield from client._create("agentruns", document, project)
        return cls(run_name, project=project, client=client, _document=created)

    def _sub(self, method: str, sub: str, body: Any = None) -> Op[Any]:
        return (
            yield from self._client._sub(method, "agentruns", self.name, sub, body, self.project)
        )

    def _read(self) -> Op[Dict[str, Any]]:
        return (yield from self._client._get("agentruns", self.name, self.project))

    def _environment(self) -> Op[Optional[EnvironmentSpec]]:
        return EnvironmentSpec.from_run((yield from self._read()))

    def _results(self) -> Op[List[RunResult]]:
        body = yield _core.Request("GET", _core.result_path(self.project, self.name))
        return [RunResult.from_json(item) for item in body.get("items", [])]

    def _result_path(self, result: str) -> str:
        return _core.result_path(self.project, self.name, result)

    def _result_json(self, result: str) -> Op[Any]:
        raw = yield _core.Request("GET", self._result_path(result), raw=True)
        return _core.decode_bytes(raw)

    def _record(self) -> Op[RunRecord]:
        return RunRecord.from_json((yield from self._result_json("runRecord")))

    def _trajectory(self) -> Op[Dict[str, Any]]:
        raw = yield _core.Request("GET", self._result_path("trajectory"), raw=True)
        # Plain JSON, as ATIF writes it: costs are numbers (floats) there, and each has its
        # exact decimal string beside it (``extra.cost_usd_exact``).
        trajectory = json.loads(raw)
        if not isinstance(trajectory, dict):
            raise TypeError(f"the trajectory result is not a JSON object: {trajectory!r}")
        return trajectory

    def _egress(self) -> Op[List[EgressRecord]]:
        raw = yield _core.Request("GET", self._result_path("egress"), raw=True)
        return EgressRecord.lines(raw)

    def _error(self) -> Op[Optional[RunError]]:
        if not any(r.name == "error" for r in (yield from self._results())):
            return None
        return RunError.from_json((yield from self._result_json("error")))

    def _log_now(self) -> Op[List[LogLine]]:
        steps = yield _core.steps_request(self.project, self.name)
        return _core.LogState().lines(steps)

    def _follow(self, timeout: Optional[float]) -> Follow:
        path = _core.resource_path(self.project, "agentruns", self.name)
        return Follow(path, deadline(timeout))

    def _read_status(self) -> Op[RunStatus]:
        return RunStatus.from_json((yield from self._read()))

    def _settled(self, status: RunStatus) -> Op[bool]:
        settled = _core.run_settled(status)
        if settled is None:
            steps = yield from self._sub("GET", "steps")
            return _core.count_answers(steps) >= self._answers_expected
        return settled

    def _wait(self, timeout: Optional[float]) -> Op[RunStatus]:
        follow = self._follow(timeout)
        status: Optional[RunStatus] = None
        while True:
            document = yield from follow.next()
            if document is None:
                break
            status = RunStatus.from_json(document)
            if (yield from self._settled(status)):
                return status
        assert status is not None
        raise _core.run_timeout(self.name, status, timeout)

    def _answer(self, timeout: Optional[float]) -> Op[str]:
        status = yield from self._wait(timeout)
        _core.check_answerable(self.name, status)
        body = yield from self._sub("GET", "answer")
        return str(body.get("answer") or "")

    def _steps(self) -> Op[List[Step]]:
        body = yield from self._sub("GET", "steps")
        return [Step.from_json(item) for item in body.get("items", [])]

    def _send(self, kind: str, payload: str, key: Optional[str]) -> Op[Delivery]:
        body = _core.message_body(kind, payload, key)
        delivery = Delivery.from_json((yield from self._sub("POST", "messages", body)))
        self._answers_expected = max(self._answers_expected, delivery.seq + 1)
        return delivery

    def _fork(
        self,
        at_step: Union[int, str],
        count: int,
        name: Optional[str],
        agent: Optional[str],
        replace: bool,
        input: Optional[str] = None,
    ) -> Op[List[Any]]:
        """``POST …/fork``: handles on the new runs, in order (``R`` is this handle's class)."""
        body: Dict[str, Any] = {"atStep": at_step, "count": count, "replace": replace}
        if name is not None:
            body["name"] = name
        if agent is not None:
            body["agent"] = agent
        if input is not None:
            body["input"] = input
        reply = yield from self._sub("POST", "fork", body)
        return [
            type(self)(
                str(item["metadata"]["name"]),
                project=self.project,
                client=self._client,
                _document=item,
            )
            for item in reply.get("items", [])
        ]

    def _post(self, sub: str) -> Op[RunStatus]:
        """``POST …/{sub}`` (``cancel``, ``close``): the status the server answers."""
        return RunStatus.from_json((yield from self._sub("POST", sub)))

    def _delete(self) -> Op[None]:
        yield from self._client._delete("agentruns", self.name, self.project)


class GroupCore(NamedHandle[C], Generic[C, R]):
    """A handle on one group (see :class:`nodus.AgentGroup`); ``R`` is its runs' handle."""

    _kind = "AgentGroup"

    #: The handle of the group's runs.
    _run_class: Type[R]

    def __init__(
        self, name: str, *, project: Optional[str] = None, client: Optional[C] = None
    ) -> None:
        super().__init__(name, project=project, client=client)
        self._document: Optional[Dict[str, Any]] = None

    @classmethod
    def _create(
        cls: Type[G],
        name: str,
        agent: Union[str, AgentCore[Any]],
        client: Any,
        max_active: Optional[int],
        max_cost: Any,
        evaluation: Optional[Mapping[str, Any]],
        max_pending: Optional[int],
        project: Optional[str],
    ) -> Op[G]:
        """Creates the group with ``client`` (an agent handle is ensured before)."""
        if isinstance(agent, AgentCore):
            # A template's group lives in the creating client's project, as its runs do.
            target, reference = _core.run_target(agent.project, client.project, agent.name)
            project = project or target
            agent = reference
        group = cls(name, project=project, client=client)
        document = _core.group_document(name, agent, max_active, max_cost, evaluation, max_pending)
        group._document = yield from group._client._create("agentgroups", document, group.project)
        return group

    def _read(self) -> Op[Dict[str, Any]]:
        document = yield from self._client._get("agentgroups", self.name, self.project)
        self._document = document
        return document

    def _read_status(self) -> Op[GroupStatus]:
        return GroupStatus.from_json((yield from self._read()))

    def _submit(self, tasks: Iterable[TaskArg], seal: bool) -> Op[List[R]]:
        items = as_tasks(tasks)
        document = self._document or (yield from self._read())
        uid = str(document.get("metadata", {}).get("uid", ""))
        agent = str(document.get("spec", {}).get("agent", ""))
        runs: List[R] = []
        for key, body in _core.batches(self.name, uid, agent, items):
            created = yield from self._create_batch(key, body)
            runs.extend(
                self._run_class(
                    str(run["metadata"]["name"]),
                    project=self.project,
                    client=self._client,
                    _document=run,
                )
                for run in created.get("items", [])
            )
        if seal:
            yield from self._seal()
        return runs

    def _create_batch(self, key: str, body: Dict[str, Any]) -> Op[Dict[str, Any]]:
        """Sends one batch, again with the same Idempotency-Key while the server is
        unavailable."""
        for attempt in range(BATCH_ATTEMPTS):
            try:
                return (yield from self._client._create("agentruns", body, self.project, key))
            except ServerUnavailable:
                if attempt == BATCH_ATTEMPTS - 1:
                    raise
                yield Pause(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    def _seal(self) -> Op[GroupStatus]:
        patch = {"spec": {"sealed": True}}
        document = yield from self._client._patch("agentgroups", self.name, patch, self.project)
        self._document = document
        return GroupStatus.from_json(document)

    def _wait(self, timeout: Optional[float]) -> Op[GroupStatus]:
        follow = Follow(
            _core.resource_path(self.project, "agentgroups", self.name), deadline(timeout)
        )
        status: Optional[GroupStatus] = None
        while True:
            document = yield from follow.next()
            if document is None:
                break
            self._document = document
            status = GroupStatus.from_json(document)
            if status.finished:
                return status
        assert status is not None
        raise _core.group_timeout(self.name, status, timeout)

    def _list_runs(self) -> Op[List[Dict[str, Any]]]:
        selector = f"spec.group={self.name}"
        return (yield from self._client._list("agentruns", selector, None, self.project))

    def _results(self) -> Op[List[Result]]:
        document = self._document or (yield from self._read())
        runs = yield from self._list_runs()
        if is_evaluation(document):
            cases = yield from self._client._sub(
                "GET", "agentgroups", self.name, "results", None, self.project
            )
            return evaluation_results(cases, runs)
        return [Result.from_json(run) for run in runs]

    def _runs(self) -> Op[List[R]]:
        runs = yield from self._list_runs()
        return [
            self._run_class(str(run["metadata"]["name"]), project=self.project, client=self._client)
            for run in runs
        ]

    def _cancel(self) -> Op[GroupStatus]:
        answer = yield from self._client._sub(
            "POST", "agentgroups", self.name, "cancel", None, self.project
        )
        return GroupStatus.from_json(answer)

    def _delete(self) -> Op[None]:
        yield from self._client._delete("agentgroups", self.name, self.project)

    def _retry(
        self, reasons: Optional[Iterable[str]], tasks: Optional[Iterable[str]]
    ) -> Op[List[Dict[str, Any]]]:
        body = {"reasons": list(reasons or []), "tasks": list(tasks or [])}
        answer = yield from self._client._sub(
            "POST", "agentgroups", self.name, "retry", body, self.project
        )
        return [dict(case) for case in answer.get("retried", [])]

    def _rescore(self, environment: str, name: Optional[str]) -> Op[str]:
        body: Dict[str, Any] = {"environment": environment}
        if name is not None:
            body["name"] = name
        answer = yield from self._client._sub(
            "POST", "agentgroups", self.name, "rescore", body, self.project
        )
        return str(answer["metadata"]["name"])


#: What ``secrets=`` of an environment takes: a variable's SecretRef or ``(secret, key)``.
SecretsArg = Mapping[str, Union[SecretRef, Tuple[str, str]]]


class EnvironmentCore(NamedHandle[C]):
    """A handle on one AgentEnvironment (see :class:`nodus.AgentEnvironment`)."""

    _kind = "AgentEnvironment"

    def __init__(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        client: Optional[C] = None,
        _document: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(name, project=project, client=client)
        self._document: Optional[Dict[str, Any]] = dict(_document) if _document else None

    def _store(
        self: E,
        env: Optional[Mapping[str, str]],
        secrets: Optional[SecretsArg],
        compute: Optional[Mapping[str, Any]],
    ) -> Op[E]:
        """Creates it with the spec :meth:`nodus.AgentEnvironment.inline` makes of the
        arguments."""
        spec = _core.environment_spec(env, secrets, compute)
        document = _core.environment_document(self.name, spec)
        self._document = yield from self._client._create(
            "agentenvironments", document, self.project
        )
        return self

    @classmethod
    def _listed(cls: Type[E], project: Optional[str], client: Any) -> Op[List[E]]:
        items = yield from client._list("agentenvironments", None, None, project)
        return [
            cls(
                str(item["metadata"]["name"]),
                project=project or client.project,
                client=client,
                _document=item,
            )
            for item in items
        ]

    def _refresh(self) -> Op[Dict[str, Any]]:
        document = yield from self._client._get("agentenvironments", self.name, self.project)
        self._document = document
        return document

    def _spec_of(self, document: Optional[Mapping[str, Any]]) -> EnvironmentSpec:
        return EnvironmentSpec.from_json((document or {}).get("spec"))

    def _reference(self, project: str) -> str:
        return self.name if project == self.project else f"{self.project}/{self.name}"

    def _delete(self) -> Op[None]:
        yield from self._client._delete("agentenvironments", self.name, self.project)
