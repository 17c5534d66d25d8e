"""What the server answers, as Python values: run and group statuses, steps, message
deliveries and group results. Money is :class:`decimal.Decimal`, times are timezone-aware
:class:`datetime.datetime` values, and each object keeps the server's JSON in ``raw``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "Cost",
    "Turn",
    "RunStatus",
    "Step",
    "Delivery",
    "GroupStatus",
    "Evaluation",
    "Result",
    "Task",
    "SecretRef",
    "EnvironmentSpec",
    "RunResult",
    "RunRecord",
    "RunError",
    "LogLine",
    "PostRunActionInfo",
    "parse_time",
    "parse_money",
    "RUN_FINISHED",
    "GROUP_FINISHED",
]

#: The phases after which a run does nothing more.
RUN_FINISHED = frozenset({"Succeeded", "Failed", "Cancelled"})
#: The phases after which a group does nothing more.
GROUP_FINISHED = frozenset({"Succeeded", "Failed", "Cancelled"})

_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(Z|z|[+-]\d{2}:?\d{2})$"
)


def parse_time(value: Any) -> Optional[datetime]:
    """An RFC 3339 timestamp (``2026-12-01T15:23:47.445862612Z``, nanoseconds allowed) as a
    timezone-aware datetime; ``None`` for ``None``. Raises ``ValueError`` for other text."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    match = _TIME.match(str(value))
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    if offset in ("Z", "z"):
        tz = timezone.utc
    else:
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    return datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz
    )


def parse_money(value: Any) -> Optional[Decimal]:
    """A dollar amount (the server writes them as decimal strings) as an exact Decimal;
    ``None`` for ``None``. A float is refused: it cannot be exact."""
    if value is None:
        return None
    if isinstance(value, float):
        raise TypeError(f"money is never a float (got {value!r}); use a str or Decimal")
    try:
        return Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"not a decimal amount of dollars: {value!r}") from None


def money_text(value: Any, name: str) -> str:
    """An amount of dollars as the decimal string the server takes (``"0.60"``), from a str,
    int or Decimal. A float is refused, naming the argument."""
    if isinstance(value, float):
        raise TypeError(
            f'{name} is money: pass a str or Decimal such as "0.60", not the float {value!r}'
        )
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
        raise TypeError(f"{name} is a decimal amount of dollars (str or Decimal), not {value!r}")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{name} is a decimal amount of dollars, not {value!r}") from None
    if not amount.is_finite():
        raise ValueError(f"{name} is a finite amount of dollars, not {value!r}")
    return str(amount)


def _dict(value: Any) -> Dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Cost:
    """What was spent (``total``) and the cap (``limit``, ``None`` when uncapped), in USD."""

    total: Decimal
    limit: Optional[Decimal]

    @classmethod
    def from_json(cls, value: Any) -> "Cost":
        """From the server's ``{"totalUSD": "…", "limitUSD": "…"}``."""
        data = _dict(value)
        return cls(
            parse_money(data.get("totalUSD")) or Decimal("0"), parse_money(data.get("limitUSD"))
        )


@dataclass(frozen=True)
class Turn:
    """One prompt of a run: the model that served it, how it was chosen and what it cost."""

    model: str
    family: Optional[str]
    chosen_by: Optional[str]
    cost: Decimal
    input_tokens: int
    output_tokens: int
    commands: int

    @classmethod
    def from_json(cls, value: Any) -> "Turn":
        """From one item of ``status.turns``."""
        data = _dict(value)
        return cls(
            model=str(data.get("model", "")),
            family=data.get("family"),
            chosen_by=data.get("chosenBy"),
            cost=parse_money(data.get("costUSD")) or Decimal("0"),
            input_tokens=int(data.get("inputTokens", 0)),
            output_tokens=int(data.get("outputTokens", 0)),
            commands=int(data.get("commands", 0)),
        )


@dataclass(frozen=True)
class RunStatus:
    """A run's status as last read: ``phase`` (``Pending``, ``Running``, ``Waiting``,
    ``NeedsResolution``, ``Succeeded``, ``Failed``, ``Cancelled``), its ``reason``, the
    ``message``, the ``turns``, the ``cost``, the answer's ``preview``, the times, and
    ``cancel_requested`` (the reason) or ``close_requested`` while a cancellation or a close
    is being carried out."""

    name: str
    phase: Optional[str]
    reason: Optional[str]
    message: Optional[str]
    turns: Tuple[Turn, ...]
    cost: Cost
    answer_preview: Optional[str]
    answer_bytes: Optional[int]
    created: Optional[datetime]
    started: Optional[datetime]
    completed: Optional[datetime]
    keep_alive: bool
    cancel_requested: Optional[str]
    close_requested: bool
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, document: Any) -> "RunStatus":
        """From an AgentRun as the server answers it."""
        data = _dict(document)
        status = _dict(data.get("status"))
        answer = status.get("answer")
        answer_data = _dict(answer)
        return cls(
            name=str(_dict(data.get("metadata")).get("name", "")),
            phase=status.get("phase"),
            reason=status.get("reason"),
            message=status.get("message"),
            turns=tuple(Turn.from_json(t) for t in status.get("turns") or []),
            cost=Cost.from_json(status.get("cost")),
            answer_preview=answer_data.get("preview") if answer is not None else None,
            answer_bytes=answer_data.get("bytes") if answer is not None else None,
            created=parse_time(_dict(data.get("metadata")).get("creationTimestamp")),
            started=parse_time(status.get("startTime")),
            completed=parse_time(status.get("completionTime")),
            keep_alive=bool(_dict(data.get("spec")).get("keepAlive", False)),
            cancel_requested=status.get("cancelRequested"),
            close_requested=bool(status.get("closeRequested")),
            raw=data,
        )

    @property
    def finished(self) -> bool:
        """Whether the run has ended (Succeeded, Failed or Cancelled)."""
        return self.phase in RUN_FINISHED

    @property
    def awaiting_message(self) -> bool:
        """Whether a keep-alive run has answered its turn and waits for a message (and is
        not being cancelled or closed)."""
        return (
            self.phase == "Waiting"
            and self.reason == "AwaitingMessage"
            and not self.cancel_requested
            and not self.close_requested
        )


@dataclass(frozen=True)
class Step:
    """One recorded step of a run: ``kind`` (``SandboxCreation``, ``Routing``,
    ``ModelCall``, ``Command``, ``Answer``, …), ``state`` and a one-line ``summary``."""

    seq: int
    kind: str
    state: str
    summary: str
    started: Optional[datetime]
    finished: Optional[datetime]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> "Step":
        """From one item of the server's StepList."""
        data = _dict(value)
        return cls(
            seq=int(data.get("seq", 0)),
            kind=str(data.get("kind", "")),
            state=str(data.get("state", "")),
            summary=str(data.get("summary", "")),
            started=parse_time(data.get("startedAt")),
            finished=parse_time(data.get("finishedAt")),
            raw=data,
        )


@dataclass(frozen=True)
class Delivery:
    """The answer to a message: its sequence number in the run, and whether it was a
    ``duplicate`` of one sent before with the same key (then it is not delivered again)."""

    seq: int
    duplicate: bool
    key: Optional[str]

    @classmethod
    def from_json(cls, value: Any) -> "Delivery":
        """From the server's ``{"seq": …, "duplicate": …, "messageKey": …}``."""
        data = _dict(value)
        return cls(int(data.get("seq", 0)), bool(data.get("duplicate")), data.get("messageKey"))


class Evaluation:
    """A group's evaluation summary (``status.evaluation``), computed by the server from the
    cases: ``cases``, ``pending``, ``scored``, ``unscored`` by reason, and over the ``n``
    scored cases only the ``pass_rate``, ``mean_reward``, their 95 % ``interval`` and the
    ``bracket`` (the pass rate if every case without a score had failed, or passed). Rates are
    fractions (floats), not money. :meth:`get` reads any field by its JSON name, such as
    ``passRate``. Empty (every field ``None``) for a group without ``spec.evaluation``."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data: Dict[str, Any] = dict(data)

    def _int(self, key: str) -> Optional[int]:
        value = self._data.get(key)
        return int(value) if value is not None else None

    def _float(self, key: str) -> Optional[float]:
        value = self._data.get(key)
        return float(value) if value is not None else None

    def _range(self, key: str) -> Optional[Tuple[float, float]]:
        value = _dict(self._data.get(key))
        if "low" not in value or "high" not in value:
            return None
        return (float(value["low"]), float(value["high"]))

    @property
    def cases(self) -> Optional[int]:
        """Cases in the batch (tasks × repetitions); ``None`` when not evaluated."""
        return self._int("cases")

    @property
    def pending(self) -> Optional[int]:
        """How many cases are not finished yet (``None`` when not evaluated)."""
        return self._int("pending")

    @property
    def scored(self) -> Optional[int]:
        """How many cases were graded (a wrong or invalid answer is scored)."""
        return self._int("scored")

    @property
    def unscored(self) -> Dict[str, int]:
        """Cases ended without a score, by reason (``RunFailed``, ``NoAnswer``,
        ``LimitReached``, ``GraderFailed``, ``EvaluationTimeout``, ``Cancelled``)."""
        return {str(k): int(v) for k, v in _dict(self._data.get("unscored")).items()}

    @property
    def n(self) -> Optional[int]:
        """The number of scored cases the rates are over."""
        return self._int("n")

    @property
    def pass_rate(self) -> Optional[float]:
        """Passed ÷ scored; ``None`` while nothing is scored."""
        return self._float("passRate")

    @property
    def mean_reward(self) -> Optional[float]:
        """The mean reward of the scored cases; ``None`` while nothing is scored."""
        return self._float("meanReward")

    @property
    def bracket(self) -> Optional[Tuple[float, float]]:
        """``(low, high)``: the pass rate over all cases if every case without a score had
        failed, or had passed."""
        return self._range("bracket")

    @property
    def interval(self) -> Optional[Tuple[float, float]]:
        """``(low, high)``: the 95 % Wilson interval of the pass rate over the scored cases."""
        return self._range("interval")

    @property
    def pass_at_k(self) -> Dict[int, float]:
        """For each k, the mean pass@k over the tasks with at least k scored cases."""
        return {int(k): float(v) for k, v in _dict(self._data.get("passAtK")).items()}

    @property
    def per_task(self) -> List[Dict[str, Any]]:
        """Each task over its repetitions: ``taskId``, ``attempts``, ``scored``, ``passes``,
        ``passAtK`` (k as a string → value) and the reduced ``reward``."""
        return [dict(task) for task in self._data.get("perTask") or []]

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the summary by its JSON name (``passRate``, ``meanReward``, …), or
        ``default``."""
        return self._data.get(key, default)

    def __bool__(self) -> bool:
        return bool(self._data)

    def __repr__(self) -> str:
        return f"Evaluation({self._data!r})"


@dataclass(frozen=True)
class GroupStatus:
    """A group's status as last read: ``phase`` (``Running``, ``Cancelling``,
    ``Succeeded``, ``Failed``, ``Cancelled``), ``reason``, the run ``counts`` (queued,
    active, waiting, succeeded, failed, cancelled), ``blocked_reasons``, ``cost``,
    ``sealed`` and the ``evaluation`` summary."""

    name: str
    phase: Optional[str]
    reason: Optional[str]
    counts: Dict[str, int]
    blocked_reasons: Dict[str, int]
    cost: Cost
    sealed: bool
    evaluation: Evaluation
    created: Optional[datetime]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, document: Any) -> "GroupStatus":
        """From an AgentGroup as the server answers it."""
        data = _dict(document)
        status = _dict(data.get("status"))
        metadata = _dict(data.get("metadata"))
        return cls(
            name=str(metadata.get("name", "")),
            phase=status.get("phase"),
            reason=status.get("reason"),
            counts={str(k): int(v) for k, v in _dict(status.get("counts")).items()},
            blocked_reasons={
                str(k): int(v) for k, v in _dict(status.get("blockedReasons")).items()
            },
            cost=Cost.from_json(status.get("cost")),
            sealed=bool(_dict(data.get("spec")).get("sealed", False)),
            evaluation=Evaluation(_dict(status.get("evaluation"))),
            created=parse_time(metadata.get("creationTimestamp")),
            raw=data,
        )

    @property
    def finished(self) -> bool:
        """Whether the group has ended (Succeeded, Failed or Cancelled)."""
        return self.phase in GROUP_FINISHED


@dataclass(frozen=True)
class Result:
    """One task of a group: its ``task_id``, the ``run`` name, its ``state``, ``reason``,
    ``cost`` and the answer ``preview``.

    In a group without evaluation ``task_id`` is the run's ``spec.taskKey`` and ``state`` the
    run's phase. In an evaluation group a result is one case (task × ``repetition``):
    ``state`` is ``Pending``, ``Scored`` or ``Unscored``, ``reason`` says why it is unscored,
    and a scored case has its ``reward`` (0 to 1) and ``verdict`` (``pass``, ``fail``,
    ``invalid``); ``evidence`` is what the grader saw. :meth:`get` reads any field of the
    case's record (``verdict``, ``environment``, ``seed``, …) by its JSON name."""

    task_id: str
    run: str
    state: Optional[str]
    reason: Optional[str]
    cost: Cost
    preview: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False)
    repetition: Optional[int] = None
    reward: Optional[float] = None
    verdict: Optional[str] = None
    evidence: Optional[str] = field(default=None, repr=False)
    record: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, document: Any) -> "Result":
        """From an AgentRun of the group."""
        status = RunStatus.from_json(document)
        spec = _dict(_dict(document).get("spec"))
        return cls(
            task_id=str(spec.get("taskKey", status.name)),
            run=status.name,
            state=status.phase,
            reason=status.reason,
            cost=status.cost,
            preview=status.answer_preview,
            raw=status.raw,
        )

    @classmethod
    def from_case(cls, case: Any, run: Any = None) -> "Result":
        """From one item of an ``EvaluationResultList`` and, when given, its AgentRun (for
        the run's cost and answer preview)."""
        record = _dict(case)
        status = RunStatus.from_json(run) if run is not None else None
        reward = record.get("reward")
        repetition = record.get("repetition")
        return cls(
            task_id=str(record.get("taskId", "")),
            run=str(record.get("run", "")),
            state=record.get("state"),
            reason=record.get("reason"),
            cost=status.cost if status is not None else Cost(Decimal("0"), None),
            preview=status.answer_preview if status is not None else None,
            raw=status.raw if status is not None else {},
            repetition=int(repetition) if repetition is not None else None,
            reward=float(reward) if reward is not None else None,
            verdict=record.get("verdict"),
            evidence=record.get("evidence"),
            record=record,
        )

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the case's evaluation record (``verdict``, ``reward``, ``seed``, …),
        else of the run's status; ``default`` when neither has it (as for ``verdict`` in a
        group without evaluation)."""
        if key in self.record:
            return self.record[key]
        return _dict(self.raw.get("status")).get(key, default)


@dataclass(frozen=True)
class Task:
    """A task to run in a group: its ``key`` (a DNS label, unique in the group; the run is
    named ``<group>-<key>``), its ``input`` prompt and the keys it ``depends_on``."""

    key: str
    input: str
    depends_on: Tuple[str, ...] = ()

    def document(self, group: str, agent: str) -> Dict[str, Any]:
        """The AgentRun this task becomes in ``group``."""
        spec: Dict[str, Any] = {
            "agent": agent,
            "group": group,
            "taskKey": self.key,
            "input": self.input,
        }
        if self.depends_on:
            spec["dependsOn"] = list(self.depends_on)
        return {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": f"{group}-{self.key}"},
            "spec": spec,
        }


def evaluation_results(body: Any, runs: List[Dict[str, Any]]) -> List[Result]:
    """The cases of an ``EvaluationResultList`` in batch order, each with its run."""
    by_name = {str(_dict(run.get("metadata")).get("name", "")): run for run in runs}
    items = _dict(body).get("items") or []
    return [Result.from_case(item, by_name.get(str(_dict(item).get("run", "")))) for item in items]


def is_evaluation(document: Mapping[str, Any]) -> bool:
    """Whether the AgentGroup ``document`` is an evaluation group."""
    return _dict(document.get("spec")).get("evaluation") is not None


def as_tasks(tasks: Any) -> List[Task]:
    """Tasks from :class:`Task` values, ``(key, input)`` or ``(key, input, depends_on)``
    tuples, or mappings with ``key``, ``input`` and optional ``depends_on``/``dependsOn``."""
    result: List[Task] = []
    for index, item in enumerate(tasks):
        if isinstance(item, Task):
            result.append(item)
        elif isinstance(item, tuple) and len(item) in (2, 3):
            depends = tuple(item[2]) if len(item) == 3 else ()
            result.append(Task(str(item[0]), str(item[1]), depends))
        elif isinstance(item, Mapping) and "key" in item and "input" in item:
            depends = item.get("depends_on", item.get("dependsOn", ()))
            result.append(Task(str(item["key"]), str(item["input"]), tuple(depends)))
        else:
            raise TypeError(
                f"tasks[{index}] is a Task, a (key, input[, depends_on]) tuple or a mapping "
                f"with key and input, not {item!r}"
            )
    return result


@dataclass(frozen=True)
class SecretRef:
    """An environment variable's value taken from a key of a Secret (``valueFrom:
    {secretKeyRef: {name, key}}``): the Secret's ``name`` and the ``key`` in it, never the
    value. In a run's snapshot ``version`` is the Secret's resourceVersion when the run was
    created."""

    name: str
    key: str
    version: Optional[str] = None


@dataclass(frozen=True)
class EnvironmentSpec:
    """What an AgentEnvironment gives a run's commands: plain variables (``env``, name →
    value), variables from Secrets (``secrets``, name → :class:`SecretRef`) and ``compute``
    (``cpu``, ``memory``, ``nvidia.com/gpu``, as the server has them)."""

    env: Dict[str, str]
    secrets: Dict[str, SecretRef]
    compute: Dict[str, Any]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(
        cls, spec: Any, versions: Optional[Mapping[str, str]] = None
    ) -> "EnvironmentSpec":
        """From an AgentEnvironment's ``spec`` (``versions``: a Secret's name → the version a
        run's snapshot recorded)."""
        data = _dict(spec)
        env: Dict[str, str] = {}
        secrets: Dict[str, SecretRef] = {}
        for item in data.get("env") or []:
            var = _dict(item)
            name = str(var.get("name", ""))
            ref = _dict(_dict(var.get("valueFrom")).get("secretKeyRef"))
            if ref:
                secret = str(ref.get("name", ""))
                secrets[name] = SecretRef(
                    secret, str(ref.get("key", "")), (versions or {}).get(secret)
                )
            else:
                env[name] = str(var.get("value", ""))
        return cls(env, secrets, _dict(data.get("compute")), data)

    @classmethod
    def from_run(cls, document: Any) -> Optional["EnvironmentSpec"]:
        """The environment an AgentRun took when it was created (``status.snapshot.
        environment``, each Secret with the version it had then), or ``None``."""
        snapshot = _dict(
            _dict(_dict(_dict(document).get("status")).get("snapshot")).get("environment")
        )
        if not snapshot:
            return None
        versions = {
            str(_dict(s).get("name")): str(_dict(s).get("resourceVersion"))
            for s in snapshot.get("secrets") or []
        }
        return cls.from_json(snapshot.get("spec"), versions)


@dataclass(frozen=True)
class RunResult:
    """One result of a finished run, as listed: its ``name`` (``inputWorkdir``,
    ``outputWorkdir``, ``artifacts``, ``runRecord``, ``error``, or what a post-run action
    saved), the ``file_name`` it downloads as, its ``content_type`` and its ``size`` in
    bytes."""

    name: str
    file_name: str
    content_type: str
    size: int

    @classmethod
    def from_json(cls, value: Any) -> "RunResult":
        """From one item of the server's ``RunResultList``."""
        data = _dict(value)
        return cls(
            name=str(data.get("name", "")),
            file_name=str(data.get("fileName", "")),
            content_type=str(data.get("contentType", "")),
            size=int(data.get("bytes", 0)),
        )


@dataclass(frozen=True)
class RunError:
    """Why a run did not succeed (its ``error`` result): ``type`` (the reason, such as
    ``TimeoutExceeded``), the ``message``, and whether a time limit ended it."""

    type: str
    message: str
    timeout: bool

    @classmethod
    def from_json(cls, value: Any) -> "RunError":
        """From the ``error`` result's JSON."""
        data = _dict(value)
        return cls(
            str(data.get("type", "")), str(data.get("message", "")), bool(data.get("timeout"))
        )


@dataclass(frozen=True)
class EgressRecord:
    """One connection a run's sandbox asked the egress proxy for (a line of its ``egress``
    result): when, the ``host`` and ``port`` asked for, the ``address`` dialled or refused
    (``None`` when none was resolved), the ``verdict`` (``allowed`` or ``refused``), the
    ``rule`` that decided, and the bytes each way and how long it lasted."""

    time: str
    host: str
    port: int
    address: Optional[str]
    verdict: str
    rule: str
    bytes_out: int
    bytes_in: int
    duration_ms: int

    @classmethod
    def from_json(cls, value: Any) -> "EgressRecord":
        """From one line of the ``egress`` result."""
        data = _dict(value)
        address = data.get("address")
        return cls(
            time=str(data.get("time", "")),
            host=str(data.get("host", "")),
            port=int(data.get("port") or 0),
            address=None if address is None else str(address),
            verdict=str(data.get("verdict", "")),
            rule=str(data.get("rule", "")),
            bytes_out=int(data.get("bytesOut") or 0),
            bytes_in=int(data.get("bytesIn") or 0),
            duration_ms=int(data.get("durationMs") or 0),
        )

    @classmethod
    def lines(cls, raw: bytes) -> List["EgressRecord"]:
        """The records of the ``egress`` result's JSON Lines."""
        return [cls.from_json(json.loads(line)) for line in raw.splitlines() if line.strip()]


@dataclass(frozen=True)
class RunRecord:
    """A finished run's record (its ``runRecord`` result): what it was and how it ended —
    ``phase``, ``reason``, ``message``, the whole ``answer``, the ``turns``, the ``cost`` and
    the times."""

    name: str
    project: Optional[str]
    uid: Optional[str]
    agent_ref: Optional[str]
    phase: Optional[str]
    reason: Optional[str]
    message: Optional[str]
    answer: Optional[str]
    turns: Tuple[Turn, ...]
    cost: Cost
    created: Optional[datetime]
    started: Optional[datetime]
    completed: Optional[datetime]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> "RunRecord":
        """From the ``runRecord`` result's JSON."""
        data = _dict(value)
        return cls(
            name=str(data.get("name", "")),
            project=data.get("project"),
            uid=data.get("uid"),
            agent_ref=data.get("agentRef"),
            phase=data.get("phase"),
            reason=data.get("reason"),
            message=data.get("message"),
            answer=data.get("answer"),
            turns=tuple(Turn.from_json(t) for t in data.get("turns") or []),
            cost=Cost.from_json(data.get("cost")),
            created=parse_time(data.get("creationTimestamp")),
            started=parse_time(data.get("startTime")),
            completed=parse_time(data.get("completionTime")),
            raw=data,
        )


@dataclass(frozen=True)
class LogLine:
    """One line of a run's log, as ``nodus agentrun logs`` prints it: ``stream`` is
    ``"step"`` (a step began: ``[seq] Kind State: summary``), ``"finished"`` (a step that was
    shown started has finished), ``"command"`` (``$ command`` of a command step),
    ``"stdout"`` or ``"stderr"`` (one line of a finished command's output, without its
    newline); ``step`` is the step it belongs to. ``str(line)`` is its ``text``."""

    seq: int
    stream: str
    text: str
    step: Step = field(repr=False, compare=False)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PostRunActionInfo:
    """A post-run action the server installs: its ``kind`` (``agents.webhook``), ``title``,
    ``description`` and the JSON Schema of its config."""

    kind: str
    title: str
    description: str
    config_schema: Dict[str, Any]

    @classmethod
    def from_json(cls, value: Any) -> "PostRunActionInfo":
        """From one item of ``GET /apis/nodus.dev/v1/postrunactions``."""
        data = _dict(value)
        return cls(
            kind=str(data.get("kind", "")),
            title=str(data.get("title", "")),
            description=str(data.get("description", "")),
            config_schema=_dict(data.get("configSchema")),
        )
