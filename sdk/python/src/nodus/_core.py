"""What the synchronous and the asyncio clients share: the requests they send, how answers
and failures become values and exceptions, the documents they create, and the back-off of
their waits. Nothing here does input or output.

A wait reads the object once, then asks the server for its next version with a long poll
(``GET …?watch=true&resourceVersion=RV&timeoutSeconds=N``), which answers as soon as the
object changes; an answer that did not change (the poll timed out, or a server that does not
wait) is followed by a pause of :func:`backoff` before the next one.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import (
    ConnectionFailed,
    Invalid,
    NodusError,
    RunFailed,
    WaitTimeout,
    error_from_response,
)
from .types import GroupStatus, LogLine, RunStatus, SecretRef, Step, Task, money_text

API_VERSION = "nodus.dev/v1"
#: Runs per batch request: the server takes at most 100.
MAX_BATCH = 100
#: The model a BYOK agent uses when none is named.
DEFAULT_BYOK_MODEL = "claude-sonnet-4-5"
#: The read-only project of Nodus's ready-made agents (``claude-assistant``).
TEMPLATE_PROJECT = "nodus"
#: Connections kept for reuse: an idle one is dropped after 5 s, before the server closes
#: idle keep-alive connections (10 s by default), so a request never goes out on a
#: connection the server is closing.
LIMITS = httpx.Limits(max_connections=20, max_keepalive_connections=10, keepalive_expiry=5.0)
#: What the client sends as its User-Agent.
USER_AGENT = "nodus-python/0.1.0"


@dataclass
class Request:
    """One HTTP request to the API, relative to the server."""

    method: str
    path: str
    body: Any = None
    headers: Dict[str, str] = field(default_factory=dict)
    params: Dict[str, str] = field(default_factory=dict)
    #: Seconds this request may take, when not the client's ``timeout`` (a long poll).
    timeout: Optional[float] = None
    #: Answer the body's bytes as they are (a result's file), not its JSON.
    raw: bool = False


def resource_path(
    project: str, plural: str, name: Optional[str] = None, sub: Optional[str] = None
) -> str:
    """``/apis/nodus.dev/v1/projects/{project}/{plural}[/{name}[/{sub}]]``, each part quoted."""
    path = f"/apis/nodus.dev/v1/projects/{quote(project, safe='')}/{plural}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    if sub is not None:
        path += f"/{sub}"
    return path


def encode(body: Any) -> bytes:
    """A request body as JSON; Decimals are written as their exact decimal text."""

    def default(value: Any) -> Any:
        if isinstance(value, Decimal):
            return str(value)
        raise TypeError(f"{value!r} cannot be sent as JSON")

    return json.dumps(body, default=default).encode("utf-8")


def decode(response: httpx.Response) -> Any:
    """The JSON of an answer, with every non-integer number as an exact Decimal."""
    if not response.content:
        return None
    try:
        return json.loads(response.content, parse_float=Decimal)
    except ValueError:
        return None


def decode_bytes(content: bytes) -> Any:
    """JSON bytes (a result's file) as values, numbers with a fraction as Decimal."""
    return json.loads(content, parse_float=Decimal)


def result(response: httpx.Response, raw: bool = False) -> Any:
    """The JSON of a successful answer (its bytes when ``raw``), or the exception for a
    failed one."""
    if raw and response.is_success:
        return response.content
    body = decode(response)
    if response.is_success:
        return body
    raise error_from_response(response.status_code, body, response.text[:500])


def connection_error(server: str, error: Exception) -> NodusError:
    """The exception for a request that never got an answer: says which server and why, and
    hides the HTTP library's own traceback (raise it ``from None``)."""
    if isinstance(error, httpx.TimeoutException):
        why = "it did not answer in time"
    elif isinstance(error, httpx.ConnectError):
        why = f"cannot connect ({_short(error)})"
    else:
        why = _short(error)
    return ConnectionFailed(
        f"the Nodus server at {server} is unreachable: {why}. Is it running (`nodus server`), "
        f"and is NODUS_SERVER right?"
    )


def _short(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]


def headers(token: str) -> Dict[str, str]:
    """The headers of every request."""
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }


def backoff(first: float = 0.1, factor: float = 1.5, most: float = 2.0) -> Iterator[float]:
    """The pauses between two reads of a wait: short at first, then growing to ``most``."""
    delay = first
    while True:
        yield delay
        delay = min(most, delay * factor)


#: The longest wait asked of the server in one long poll, in seconds.
LONG_POLL = 30
#: How much longer than its wait a long poll may take to be answered.
LONG_POLL_MARGIN = 15.0


def watch_request(path: str, resource_version: str, seconds: int) -> Request:
    """The long poll of the object at ``path``: answered with the object as soon as its
    ``metadata.resourceVersion`` differs from ``resource_version``, or as it is after
    ``seconds`` (1 to 300)."""
    return Request(
        "GET",
        path,
        params={
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(seconds),
        },
        timeout=seconds + LONG_POLL_MARGIN,
    )


def version_of(document: Mapping[str, Any]) -> Optional[str]:
    """An object's ``metadata.resourceVersion``."""
    version = (document.get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) else None


def watch_seconds(left: Optional[float]) -> int:
    """How long the next long poll of a wait with ``left`` seconds to go asks the server to
    wait: whole seconds, at most :data:`LONG_POLL`; 0 when less than a second is left (the
    wait then reads once more at its deadline)."""
    if left is None:
        return LONG_POLL
    return max(0, min(LONG_POLL, int(left)))


def run_target(agent_project: str, client_project: str, agent: str) -> tuple[str, str]:
    """Where a run of ``agent`` goes and how it names the agent: in the agent's project,
    except for a ready-made template (project ``nodus``, read-only), whose runs go in the
    client's project and name it ``nodus/<agent>``."""
    if agent_project == TEMPLATE_PROJECT and client_project != TEMPLATE_PROJECT:
        return client_project, f"{TEMPLATE_PROJECT}/{agent}"
    return agent_project, agent


def new_run_name(agent: str) -> str:
    """A fresh run name for ``agent``: ``<agent>-<10 random hex>``, a DNS label."""
    suffix = secrets.token_hex(5)
    return f"{agent[: 63 - len(suffix) - 1]}-{suffix}"


def agent_model(
    families: Optional[Sequence[str]], api_key_secret: Optional[str], model: Optional[str]
) -> Optional[Dict[str, Any]]:
    """``spec.model`` for what ClaudeAgent was given: Nodus's Claude (optionally limited to
    ``families``), or BYOK with the Secret ``api_key_secret`` and ``model``."""
    if api_key_secret is not None:
        spec: Dict[str, Any] = {
            "access": "BYOK",
            "name": model or DEFAULT_BYOK_MODEL,
            "apiKeySecret": api_key_secret,
        }
        if families is not None:
            spec["families"] = list(families)
        return spec
    if families is None and model is None:
        return None
    spec = {"access": "Nodus"}
    if families is not None:
        if isinstance(families, str):
            raise TypeError(
                f'families is a list of model families such as ["haiku"], not the string {families!r}'
            )
        spec["families"] = list(families)
    if model is not None:
        spec["name"] = model
    return spec


def agent_spec(
    system: Optional[str],
    families: Optional[Sequence[str]],
    api_key_secret: Optional[str],
    model: Optional[str],
    max_tokens: Optional[int],
    per_run_max_cost: Any,
) -> Dict[str, Any]:
    """The fields of ``spec`` ClaudeAgent sets; fields not given are left to the server."""
    spec: Dict[str, Any] = {}
    if system is not None:
        spec["system"] = system
    model_spec = agent_model(families, api_key_secret, model)
    if model_spec is not None:
        spec["model"] = model_spec
    if max_tokens is not None:
        spec["maxTokens"] = max_tokens
    if per_run_max_cost is not None:
        spec["perRunMaxCostUSD"] = money_text(per_run_max_cost, "per_run_max_cost")
    return spec


def agent_document(name: str, spec: Mapping[str, Any]) -> Dict[str, Any]:
    """A new Agent with ``spec`` (Nodus's Claude unless the spec says otherwise)."""
    full = {"system": "", "model": {"access": "Nodus"}}
    full.update(spec)
    return {"apiVersion": API_VERSION, "kind": "Agent", "metadata": {"name": name}, "spec": full}


def agent_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The merge patch that brings the stored agent's spec to the fields ClaudeAgent was given,
    or ``None`` when it has them already. ``spec.model`` is replaced whole (a null clears the
    fields the new model does not name)."""
    spec = current.get("spec") or {}
    changes: Dict[str, Any] = {}
    for key, value in wanted.items():
        stored = spec.get(key)
        if key == "perRunMaxCostUSD" and stored is not None:
            if Decimal(str(stored)) != Decimal(str(value)):
                changes[key] = value
        elif key == "model":
            old = dict(stored or {})
            if old != value:
                patch = {k: None for k in old if k not in value}
                patch.update(value)
                changes[key] = patch
        elif stored != value:
            changes[key] = value
    return {"spec": changes} if changes else None


def run_document(
    name: str,
    agent: Union[str, Mapping[str, Any]],
    prompt: Optional[str],
    keep_alive: bool,
    deadline: Optional[str] = None,
    context: Optional[Mapping[str, Any]] = None,
    *,
    environment: Union[None, str, Mapping[str, Any]] = None,
    post_run_action: Optional[Mapping[str, Any]] = None,
    timeout: Optional[str] = None,
    image: Optional[str] = None,
    auto_telemetry: bool = True,
) -> Dict[str, Any]:
    """A new AgentRun of ``agent`` (a name, or a whole agent spec written inline) with
    ``prompt`` as its input (the agent's ``defaultInput`` when ``None``); ``environment`` is
    an AgentEnvironment's name or a spec written inline, ``post_run_action`` is ``{"kind":
    …, "config": {…}}``; ``auto_telemetry=False`` keeps no ``trajectory`` result."""
    if prompt is not None and not isinstance(prompt, str):
        raise TypeError(f"prompt is text, not {prompt!r}")
    if not isinstance(agent, (str, Mapping)):
        raise TypeError(f"agent is an agent's name or an inline agent spec, not {agent!r}")
    spec: Dict[str, Any] = {"agent": agent if isinstance(agent, str) else dict(agent)}
    if prompt is not None:
        spec["input"] = prompt
    if keep_alive:
        spec["keepAlive"] = True
    if deadline is not None:
        spec["deadline"] = deadline
    if context is not None:
        if not isinstance(context, Mapping):
            raise TypeError(f"context is a mapping of the run's parameters, not {context!r}")
        spec["context"] = dict(context)
    if environment is not None:
        if not isinstance(environment, (str, Mapping)):
            raise TypeError(
                f"environment is an AgentEnvironment's name or an inline spec, not {environment!r}"
            )
        spec["environment"] = environment if isinstance(environment, str) else dict(environment)
    if post_run_action is not None:
        if not isinstance(post_run_action, Mapping) or "kind" not in post_run_action:
            raise TypeError(
                f'post_run_action is {{"kind": …, "config": {{…}}}}, not {post_run_action!r}'
            )
        spec["postRunAction"] = dict(post_run_action)
    if timeout is not None:
        spec["timeout"] = timeout
    if image is not None:
        spec["image"] = image
    if not auto_telemetry:
        spec["autoTelemetry"] = False
    return {"apiVersion": API_VERSION, "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}


def environment_spec(
    env: Optional[Mapping[str, str]],
    secrets: Optional[Mapping[str, Union[SecretRef, Tuple[str, str]]]],
    compute: Optional[Mapping[str, Any]],
) -> Dict[str, Any]:
    """An AgentEnvironment's ``spec``: ``env`` (name → plain value), ``secrets`` (name →
    :class:`~nodus.SecretRef` or ``(secret, key)``), ``compute`` (``cpu``, ``memory``,
    ``nvidia.com/gpu``) as the server takes them."""
    variables: List[Dict[str, Any]] = []
    for name, value in (env or {}).items():
        if not isinstance(value, str):
            raise TypeError(f"env[{name!r}] is text, not {value!r}")
        variables.append({"name": name, "value": value})
    for name, ref in (secrets or {}).items():
        if isinstance(ref, SecretRef):
            secret, key = ref.name, ref.key
        elif isinstance(ref, tuple) and len(ref) == 2:
            secret, key = str(ref[0]), str(ref[1])
        else:
            raise TypeError(
                f"secrets[{name!r}] is a SecretRef or a (secret, key) tuple, not {ref!r}"
            )
        variables.append(
            {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        )
    spec: Dict[str, Any] = {}
    if variables:
        spec["env"] = variables
    if compute is not None:
        spec["compute"] = dict(compute)
    return spec


def environment_document(name: str, spec: Mapping[str, Any]) -> Dict[str, Any]:
    """A new AgentEnvironment with ``spec``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentEnvironment",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


#: Where the server lists the post-run actions it installs (not under a project).
POST_RUN_ACTIONS_PATH = "/apis/nodus.dev/v1/postrunactions"


def result_path(project: str, run: str, result: Optional[str] = None) -> str:
    """``…/agentruns/{run}/results[/{result}]``."""
    path = resource_path(project, "agentruns", run, "results")
    if result is not None:
        path += f"/{quote(result, safe='')}"
    return path


def partial_path(target: Path) -> Path:
    """Where a download to ``target`` is written until it is whole (beside it, hidden)."""
    return target.with_name(f".{target.name}.part")


def steps_request(project: str, run: str) -> Request:
    """The steps of a run with each step's recorded intent and outcome (its command and
    output)."""
    return Request(
        "GET", resource_path(project, "agentruns", run, "steps"), params={"payload": "true"}
    )


#: The most bytes of a line of live output held back while it is not complete: a longer one
#: is shown from the command's step when it finishes.
MAX_PENDING_LINE = 1 << 20


def _piece_bytes(value: Any) -> Optional[bytes]:
    """A piece's or a step's output as bytes: a string is UTF-8, an array its bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list):
        return bytes(b if isinstance(b, int) and 0 <= b < 256 else 63 for b in value)
    return None


def live_piece(line: Any) -> Optional[Dict[str, Any]]:
    """One line of ``GET …/logs?follow=true`` as a piece of output (``{"seq", "stream",
    "offset", "bytes"}``), or ``None`` for any other line (the ``{"following": …}`` head)."""
    try:
        piece = json.loads(line)
    except ValueError:
        return None
    if not isinstance(piece, dict) or not isinstance(piece.get("seq"), int):
        return None
    return piece


class _Streamed:
    """One stream of one command as followed live: bytes shown from its start, bytes after
    those not shown yet (the start of a line), and whether a piece was missed (the rest is
    then shown from the finished step)."""

    def __init__(self) -> None:
        self.shown = 0
        self.pending = bytearray()
        self.broken = False


class LogState:
    """What a log has shown of a run so far, as ``nodus agentrun logs -f`` prints it: each
    step once it is seen, a running command's output line by line as the live stream brings
    it (:meth:`piece`), and the rest of a command's output from its step once it has finished
    (:meth:`lines`), so that nothing shows twice."""

    def __init__(self) -> None:
        # Per step seq: whether its end was shown.
        self._shown: Dict[int, bool] = {}
        self._steps: Dict[int, Step] = {}
        self._live: Dict[Tuple[int, str], _Streamed] = {}
        # Live pieces of steps not listed yet.
        self._early: List[Dict[str, Any]] = []
        self._listed = 0

    @property
    def complete(self) -> bool:
        """Whether every step seen has been shown whole."""
        return len(self._shown) == self._listed and all(self._shown.values())

    def lines(self, steps: Any) -> List[LogLine]:
        """The new lines for the StepList ``steps`` (read with ``payload=true``)."""
        items = steps.get("items", []) if isinstance(steps, dict) else []
        self._listed = len(items)
        out: List[LogLine] = []
        for item in items:
            step = Step.from_json(item)
            finished = item.get("finishedAt") is not None
            head = f"[{step.seq}] {step.kind} {step.state}: {step.summary}"
            self._steps[step.seq] = step
            shown = self._shown.get(step.seq)
            if shown is None:
                self._shown[step.seq] = finished
                out.append(LogLine(step.seq, "step", head, step))
                command = (item.get("intent") or {}).get("command")
                if isinstance(command, str):
                    out.append(LogLine(step.seq, "command", f"$ {command}", step))
                if finished:
                    out.extend(self._rest(step, item))
            elif not shown and finished:
                self._shown[step.seq] = True
                out.append(LogLine(step.seq, "finished", f"{head} (finished)", step))
                out.extend(self._rest(step, item))
            if self._shown.get(step.seq) is False:
                for piece in [p for p in self._early if p["seq"] == step.seq]:
                    out.extend(self._take(piece))
        self._early = [p for p in self._early if p["seq"] not in self._shown]
        return out

    def piece(self, piece: Mapping[str, Any]) -> Optional[List[LogLine]]:
        """The lines a live piece of output completes, to show now; ``None`` when its step is
        not listed yet (read the steps, then it is shown after its step's line)."""
        seq = piece.get("seq")
        if not isinstance(seq, int):
            return []
        shown = self._shown.get(seq)
        if shown is None:
            self._early.append(dict(piece))
            return None
        return [] if shown else self._take(piece)

    def _take(self, piece: Mapping[str, Any]) -> List[LogLine]:
        seq, stream, offset = piece.get("seq"), piece.get("stream"), piece.get("offset")
        data = _piece_bytes(piece.get("bytes"))
        if not isinstance(seq, int) or not isinstance(stream, str) or not isinstance(offset, int):
            return []
        if data is None:
            return []
        live = self._live.setdefault((seq, stream), _Streamed())
        if live.broken:
            return []
        if offset != live.shown + len(live.pending):
            live.broken = True
            live.pending.clear()
            return []
        live.pending.extend(data)
        end = live.pending.rfind(b"\n")
        if end < 0:
            if len(live.pending) > MAX_PENDING_LINE:
                live.broken = True
                live.pending.clear()
            return []
        complete = bytes(live.pending[: end + 1])
        del live.pending[: end + 1]
        live.shown += len(complete)
        step = self._steps[seq]
        text = complete.decode("utf-8", "replace")
        return [LogLine(seq, stream, line, step) for line in text.splitlines()]

    def _rest(self, step: Step, item: Mapping[str, Any]) -> List[LogLine]:
        """A finished command's output that was not shown live."""
        output = ((item.get("outcome") or {}).get("output")) or {}
        out: List[LogLine] = []
        for stream in ("stdout", "stderr"):
            value = (output.get(stream) or {}).get("bytes")
            data = _piece_bytes(value)
            if not data:
                continue
            shown = self._live[(step.seq, stream)].shown if (step.seq, stream) in self._live else 0
            if isinstance(value, list) and shown == 0:
                text = f"({len(data)} bytes that are not text)"
            else:
                text = data[shown:].decode("utf-8", "replace")
            out.extend(LogLine(step.seq, stream, line, step) for line in text.splitlines())
        return out


def group_document(
    name: str,
    agent: str,
    max_active: Optional[int],
    max_cost: Any,
    evaluation: Optional[Mapping[str, Any]],
    max_pending: Optional[int],
) -> Dict[str, Any]:
    """A new AgentGroup; ``evaluation`` is passed to the server as ``spec.evaluation``."""
    spec: Dict[str, Any] = {"agent": agent}
    limits: Dict[str, Any] = {}
    if max_active is not None:
        limits["maxActive"] = max_active
    if max_pending is not None:
        limits["maxPending"] = max_pending
    if limits:
        spec["limits"] = limits
    if max_cost is not None:
        spec["maxCostUSD"] = money_text(max_cost, "max_cost")
    if evaluation is not None:
        spec["evaluation"] = dict(evaluation)
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def secret_document(name: str, values: Mapping[str, str]) -> Dict[str, Any]:
    """A new Secret with ``values`` (sent as ``stringData``; the server seals them)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": dict(values),
    }


def message_body(kind: str, payload: str, key: Optional[str]) -> Dict[str, Any]:
    """The body of ``POST …/messages``. ``kind`` must be ``"message"``."""
    if kind != "message":
        raise Invalid(
            f'send takes "message" as what to send, not {kind!r}',
            details={"field": "kind", "rule": 'is "message"', "value": repr(kind)},
        )
    if not isinstance(payload, str):
        raise TypeError(f"payload is text, not {payload!r}")
    body: Dict[str, Any] = {"payload": payload}
    if key is not None:
        body["messageKey"] = key
    return body


def batches(
    group: str, group_uid: str, agent: str, tasks: List[Task]
) -> List[tuple[str, Dict[str, Any]]]:
    """The tasks as AgentRunLists of at most 100 runs, in order, each with its
    Idempotency-Key. The key is a digest of the group's uid and the batch, so sending the same
    batch again (a retry, or the same program run twice) creates its runs once."""
    result = []
    for start in range(0, len(tasks), MAX_BATCH):
        items = [task.document(group, agent) for task in tasks[start : start + MAX_BATCH]]
        body = {"apiVersion": API_VERSION, "kind": "AgentRunList", "items": items}
        digest = hashlib.sha256(group_uid.encode() + b"\0" + encode(body)).hexdigest()[:32]
        result.append((f"{group}-{digest}", body))
    return result


def count_answers(steps: Any) -> int:
    """How many turns a run has answered, from its StepList."""
    items = steps.get("items", []) if isinstance(steps, dict) else []
    return sum(1 for s in items if s.get("kind") == "Answer" and s.get("state") == "Completed")


def run_settled(status: RunStatus) -> Optional[bool]:
    """Whether a wait for a run ends at ``status``: ``True`` when the run has finished or
    needs a resolution, ``None`` when a keep-alive run awaits a message (the wait ends once
    it has answered every turn it was sent; count its answers), else ``False``."""
    if status.finished or status.phase == "NeedsResolution":
        return True
    if status.awaiting_message:
        return None
    return False


def check_answerable(name: str, status: RunStatus) -> None:
    """Raises RunFailed unless the run at ``status`` has an answer to return (it succeeded,
    or a keep-alive run answered its turn)."""
    if status.phase == "Succeeded" or status.awaiting_message:
        return
    raise RunFailed(
        f"run {name!r} is {status.phase} ({status.reason or 'no reason'})"
        + (f": {status.message}" if status.message else "")
        + ", with no answer to return",
        reason=status.reason or status.phase,
        status=status,
    )


def run_timeout(name: str, status: RunStatus, timeout: Optional[float]) -> WaitTimeout:
    """The error of a run wait that ran out of time."""
    return WaitTimeout(
        f"run {name!r} is still {status.phase} ({status.reason or 'no reason'}) after {timeout}s",
        status=status,
    )


def group_timeout(name: str, status: GroupStatus, timeout: Optional[float]) -> WaitTimeout:
    """The error of a group wait that ran out of time."""
    return WaitTimeout(
        f"group {name!r} is still {status.phase} after {timeout}s (runs: {status.counts})",
        status=status,
    )
