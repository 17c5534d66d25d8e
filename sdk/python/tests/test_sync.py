"""The synchronous client against the real ``nodus server`` (fake model over HTTP): the spec's
Python examples as written, every public method and every error kind."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, List

import pytest

import nodus
from conftest import TOKEN, FakeAnthropic, LosingProxy, NodusServer, free_port, nodus_bin

ROOT = Path(__file__).resolve().parents[3]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def readme_snippet() -> str:
    """The first python block of the README's Python section (the spec's snippet)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python section has a python block"
    return match.group(1)


def test_the_spec_snippet_prints_the_answer(server: NodusServer, tmp_path: Path) -> None:
    snippet = readme_snippet()
    # The snippet is the spec's, word for word.
    assert (
        'agent = nodus.ClaudeAgent("helper", system="You are careful.", families=["haiku", "sonnet"])'
        in snippet
    )
    assert 'run.send("message", "Now the staging logs")' in snippet
    script = tmp_path / "from_python.py"
    script.write_text(snippet)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stderr
    # The answer of a run that ran `python3 --version` in its sandbox.
    assert re.fullmatch(r"It is Python 3\.\d+\.\d+\.\n", done.stdout), done.stdout
    # The keep-alive run the snippet started took its message; end it.
    runs = [
        r
        for r in nodus.Client().list("agentruns", field_selector="spec.agent=helper")
        if r["spec"].get("keepAlive")
    ]
    assert len(runs) == 1
    run = nodus.AgentRun(runs[0]["metadata"]["name"])
    assert run.answer(timeout=60) == "Noted: Now the staging logs"
    assert [s.summary for s in run.steps() if s.kind == "Answer"] == [
        "answer turn 0: answered",
        "answer turn 1: answered",
    ]
    run.cancel()
    assert run.wait(timeout=60).phase == "Cancelled"


def arithmetic_questions(fake_model: FakeAnthropic, since: int) -> List[str]:
    """The arithmetic questions the fake model was first asked after request ``since``."""
    questions = []
    for request in fake_model.requests[since:]:
        messages = request["body"].get("messages") or []
        if len(messages) == 1:
            first = messages[0]["content"]
            text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
            if text.startswith("What is "):
                questions.append(text)
    return questions


def answer_of(question: str) -> int:
    """The question's answer, worked out here (not by the server or the fake model)."""
    match = re.match(r"What is (-?\d+) ([-+*]) (-?\d+)\?", question)
    assert match, question
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return a + b if op == "+" else a - b if op == "-" else a * b


def test_the_spec_evaluation_example_as_written(
    fake_model: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    """evaluation.py as written against the real server: the group of two arithmetic cases
    (seed 42) runs, the fake model works each question out with one command, both cases are
    graded pass, and the example prints the phase, the counts, the pass rate, the mean reward
    and one line per case, then deletes the group with its runs."""
    nodus.Client().create(
        "agents",
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": {"name": "parallel-agents-worker"},
            "spec": {
                "system": "Answer in one short sentence.",
                "model": {"access": "Nodus", "families": ["haiku"]},
                "maxTokens": 1024,
                "perRunMaxCostUSD": "0.10",
            },
        },
    )
    since = len(fake_model.requests)
    example = Path(__file__).resolve().parents[1] / "examples" / "evaluation.py"
    runpy.run_path(str(example), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "Succeeded: cases=2, pending=0",
        "pass rate: 1.0",
        "mean reward: 1.0",
    ], lines
    cases = [line.split(" ") for line in lines[3:]]
    assert len(cases) == 2 and all(rest == ["Scored", "pass"] for _, *rest in cases), lines
    assert len({task for task, *_ in cases}) == 2, lines
    # The two questions reached the model, each once; its commands answered them.
    questions = arithmetic_questions(fake_model, since)
    assert len(questions) == 2, questions
    worked = {}
    for request in fake_model.requests[since:]:
        messages = request["body"].get("messages") or []
        if len(messages) == 3:
            question = messages[0]["content"]
            question = question if isinstance(question, str) else question[0]["text"]
            output = re.search(r"stdout:\n(-?\d+)\n", messages[2]["content"][0]["content"])
            assert output, messages[2]
            worked[question] = int(output.group(1))
    assert worked == {question: answer_of(question) for question in questions}
    # The example deleted the group, and its runs with it.
    with pytest.raises(nodus.NotFound):
        nodus.AgentGroup.from_name("parallel-agents-eval").status
    runs = nodus.Client().list("agentruns", field_selector="spec.group=parallel-agents-eval")
    assert runs == []


def test_an_evaluation_group_reads_as_typed_values(fake_model: FakeAnthropic) -> None:
    """An evaluation group's summary and cases as typed values: counts, rates, the bracket and
    the interval, and each case with its run (whose cost is a Decimal) and its evidence."""
    agent = nodus.ClaudeAgent(
        unique("evaltyped"), system="x", families=["haiku"], per_run_max_cost="0.05"
    )
    group = nodus.AgentGroup.create(
        unique("evaltyped"),
        agent=agent,
        max_active=3,
        max_cost=Decimal("0.50"),
        evaluation={
            "environment": "nodus/arithmetic-v2@2.0.0",
            "split": "train",
            "tasks": 3,
            "repetitions": 2,
            "seed": 7,
            "timeout": "5m",
        },
    )
    status = group.wait(timeout=120)
    assert status.phase == "Succeeded" and status.cost.limit == Decimal("0.50")
    evaluation = status.evaluation
    assert evaluation and evaluation.cases == 6 and evaluation.pending == 0
    assert evaluation.scored == 6 and evaluation.n == 6 and evaluation.unscored == {}
    assert evaluation.pass_rate == 1.0 and evaluation.mean_reward == 1.0
    assert evaluation.get("passRate") == 1.0
    assert evaluation.bracket == (1.0, 1.0)
    # Wilson at 95 % for 6 of 6: the lower end is n / (n + z²) = 6 / (6 + 1.95996²).
    assert evaluation.interval is not None and evaluation.interval[1] == 1.0
    assert abs(evaluation.interval[0] - 6 / (6 + 1.959964**2)) < 1e-6
    # Two repetitions of 3 tasks, every one passed: pass@1 and pass@2 are 1 for each.
    assert evaluation.pass_at_k == {1: 1.0, 2: 1.0}
    assert [(t["attempts"], t["passes"]) for t in evaluation.per_task] == [(2, 2)] * 3
    # Nothing is unscored: a retry is refused, naming why.
    with pytest.raises(nodus.NodusError, match="none unscored"):
        group.retry()
    # A rescore with the same version grades the same answers again, with no model call.
    asked = len(fake_model.requests)
    rescore = group.rescore("nodus/arithmetic-v2@2.0.0")
    assert rescore.name == f"{group.name}-rescore"
    rescored = rescore.wait(timeout=120)
    assert rescored.evaluation.scored == 6 and rescored.evaluation.pass_rate == 1.0
    assert len(fake_model.requests) == asked
    rescore.delete()
    results = group.results()
    assert [(r.state, r.verdict, r.reward) for r in results] == [("Scored", "pass", 1.0)] * 6
    assert sorted(r.repetition for r in results) == [1, 1, 1, 2, 2, 2]
    assert len({r.task_id for r in results}) == 3
    for result in results:
        assert result.get("verdict") == "pass" and result.get("seed") == 7
        assert result.get("environment") == "nodus/arithmetic-v2@2.0.0"
        assert isinstance(result.cost.total, Decimal) and result.cost.total > 0
        assert result.preview is not None and result.preview.startswith("It is ")
        assert result.evidence and result.preview[6:-1] in result.evidence
        assert nodus.AgentRun(result.run).status.phase == "Succeeded"
    group.delete()
    with pytest.raises(nodus.NotFound):
        group.status


def test_remote_status_steps_and_money() -> None:
    agent = nodus.ClaudeAgent(unique("remote"), system="You are careful.", families=["haiku"])
    assert agent.remote("Please run `echo remote-ok`", timeout=60) == "It is remote-ok."
    run = agent.submit("run `echo second`")
    assert isinstance(run, nodus.AgentRun)
    status = run.wait(timeout=60)
    assert status.phase == "Succeeded" and status.finished
    assert isinstance(status.cost.total, Decimal) and status.cost.total > 0
    assert status.cost.limit == Decimal("1.00")
    assert status.turns[0].family == "haiku" and isinstance(status.turns[0].cost, Decimal)
    assert status.turns[0].cost == status.cost.total
    assert isinstance(status.started, datetime) and status.started.tzinfo is not None
    assert status.completed is not None and status.completed >= status.started
    assert status.answer_preview == "It is second."
    assert run.status.phase == "Succeeded"
    kinds = [s.kind for s in run.steps()]
    assert kinds == [
        "SandboxCreation",
        "Routing",
        "ModelCall",
        "Command",
        "ModelCall",
        "Answer",
        "SandboxDeletion",
    ]
    assert all(s.state == "Completed" and s.started and s.started.tzinfo for s in run.steps())
    assert run.answer() == "It is second."
    run.delete()
    with pytest.raises(nodus.NotFound):
        run.status


def test_claude_agent_creates_then_updates_on_first_use() -> None:
    name = unique("upd")
    client = nodus.Client()
    first = nodus.ClaudeAgent(
        name, system="first", families=["haiku", "sonnet"], per_run_max_cost="0.50"
    )
    stored = first.ensure()
    assert stored["spec"]["system"] == "first"
    assert stored["spec"]["model"] == {"access": "Nodus", "families": ["haiku", "sonnet"]}
    assert stored["spec"]["perRunMaxCostUSD"] == "0.50"
    # Unchanged: no write (the resourceVersion stays).
    again = nodus.ClaudeAgent(
        name, system="first", families=["haiku", "sonnet"], per_run_max_cost=Decimal("0.5")
    ).ensure()
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    # Changed fields are updated, the others left as stored.
    nodus.ClaudeAgent(name, system="second").remote("run `true`", timeout=60)
    after = client.get("agents", name)
    assert after["spec"]["system"] == "second"
    assert after["spec"]["model"]["families"] == ["haiku", "sonnet"]
    assert after["spec"]["perRunMaxCostUSD"] == "0.50"


def test_the_template_from_name_runs_in_the_callers_project() -> None:
    agent = nodus.ClaudeAgent.from_name("claude-assistant", project="nodus")
    assert agent.project == "nodus"
    run = agent.submit("run `echo from-template`")
    assert run.project == "default"
    assert run.answer(timeout=60) == "It is from-template."
    assert nodus.Client().get("agentruns", run.name)["spec"]["agent"] == "nodus/claude-assistant"
    with pytest.raises(nodus.NotFound):
        nodus.ClaudeAgent.from_name(unique("missing")).remote("hi")
    group = nodus.AgentGroup.create(unique("tplgrp"), agent=agent, max_cost="5")
    assert group.project == "default"
    group.submit([("only", "run `echo grouped`")])
    assert group.wait(timeout=60).phase == "Succeeded"
    assert [(r.task_id, r.preview) for r in group.results()] == [("only", "It is grouped.")]
    group.delete()


def test_byok_agent_uses_the_key_of_its_secret(fake_model: FakeAnthropic) -> None:
    client = nodus.Client()
    secret = unique("anthropic-key")
    user_key = "sk-user-own-key-" + uuid.uuid4().hex
    created = client.create_secret(secret, {"ANTHROPIC_API_KEY": user_key})
    assert user_key not in str(created)
    agent = nodus.ClaudeAgent(unique("byok"), system="You are careful.", api_key_secret=secret)
    seen = len(fake_model.requests)
    run = agent.submit("run `echo byok`")
    assert run.answer(timeout=60) == "It is byok."
    calls = [
        r for r in fake_model.requests[seen:] if user_key in str(r["body"]) or r["key"] == user_key
    ]
    assert calls and all(
        r["key"] == user_key and r["body"]["model"] == "claude-sonnet-4-5" for r in calls
    )
    spec = client.get("agents", agent.name)["spec"]["model"]
    assert spec == {"access": "BYOK", "name": "claude-sonnet-4-5", "apiKeySecret": secret}
    assert run.status.cost.total == Decimal("0")


def test_keep_alive_conversation_with_a_message_key_sent_twice(fake_model: FakeAnthropic) -> None:
    agent = nodus.ClaudeAgent(unique("chat"), system="You are careful.")
    run = agent.submit("run `echo one`", keep_alive=True)
    assert run.answer(timeout=60) == "It is one."
    assert run.status.awaiting_message
    first = run.send("message", "now run `echo two`", key="staging-1")
    again = run.send("message", "now run `echo two`", key="staging-1")
    assert (first.duplicate, again.duplicate) == (False, True)
    assert first.seq == again.seq == 1 and first.key == "staging-1"
    assert run.answer(timeout=60) == "It is two."
    # Delivered once: one more turn, and the model saw the message once.
    answers = [s for s in run.steps() if s.kind == "Answer"]
    assert len(answers) == 2
    last = fake_model.requests[-1]["body"]["messages"]
    assert sum(1 for m in last if "now run `echo two`" in str(m["content"])) == 1
    # Another message under a used key is refused, naming the key's field.
    with pytest.raises(nodus.Invalid) as reused:
        run.send("message", "something else", key="staging-1")
    assert reused.value.field == "messageKey"
    # A handle made from the name alone waits for the turn in progress too.
    other = nodus.AgentRun(run.name)
    assert other.send("message", "thanks").seq == 2
    assert other.answer(timeout=60) == "Noted: thanks"
    # Closing ends the conversation well: the last message is answered, the run succeeds.
    other.send("message", "last `echo three`")
    closing = other.close()
    assert closing.close_requested and not closing.awaiting_message
    status = other.wait(timeout=60)
    assert status.phase == "Succeeded"
    assert other.answer() == "It is three."
    assert [s.kind for s in other.steps()][-1] == "SandboxDeletion"
    with pytest.raises(nodus.AgentRunFinished) as finished:
        run.send("message", "too late", key="late")
    assert finished.value.reason == "AgentRunFinished" and finished.value.status_code == 409
    assert isinstance(finished.value, nodus.Conflict)
    with pytest.raises(nodus.AgentRunFinished):
        run.close()


def test_a_cancelled_run() -> None:
    agent = nodus.ClaudeAgent(unique("cancel"), system="You are careful.")
    run = agent.submit("run `sleep 5`")
    deadline = time.monotonic() + 30
    while run.status.phase != "Running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(nodus.WaitTimeout) as timed_out:
        run.wait(timeout=0.3)
    assert isinstance(timed_out.value, TimeoutError)
    assert timed_out.value.status.phase == "Running"
    run.cancel()
    status = run.wait(timeout=60)
    assert (status.phase, status.reason) == ("Cancelled", "CancelRequested")
    with pytest.raises(nodus.RunFailed) as failed:
        run.answer()
    assert failed.value.reason == "CancelRequested"
    assert failed.value.status.phase == "Cancelled"


def test_a_group_submits_in_batches_seals_and_finishes() -> None:
    agent = nodus.ClaudeAgent(
        unique("worker"), system="Answer briefly.", families=["haiku"], per_run_max_cost="0.10"
    )
    group = nodus.AgentGroup.create(unique("grp"), agent=agent, max_active=2, max_cost="0.60")
    runs = group.submit(
        [
            ("a", "run `echo A`"),
            nodus.Task("b", "run `echo B`"),
            {"key": "c", "input": "run `echo C`", "depends_on": ["a", "b"]},
        ]
    )
    assert [r.name for r in runs] == [f"{group.name}-a", f"{group.name}-b", f"{group.name}-c"]
    status = group.wait(timeout=120)
    assert status.phase == "Succeeded" and status.sealed
    assert status.counts["succeeded"] == 3
    assert isinstance(status.cost.total, Decimal) and status.cost.limit == Decimal("0.60")
    assert status.evaluation.pending is None and status.evaluation.get("passRate") is None
    results = group.results()
    assert sorted((r.task_id, r.state, r.get("verdict")) for r in results) == [
        ("a", "Succeeded", None),
        ("b", "Succeeded", None),
        ("c", "Succeeded", None),
    ]
    assert {r.preview for r in results} == {"It is A.", "It is B.", "It is C."}
    assert sorted(r.name for r in group.runs()) == sorted(r.name for r in runs)
    assert nodus.AgentRun(f"{group.name}-c").answer() == "It is C."
    with pytest.raises(nodus.Conflict):
        group.submit([("d", "too late")])
    group.delete()
    with pytest.raises(nodus.NotFound):
        group.status
    with pytest.raises(nodus.NotFound):
        nodus.AgentRun(f"{group.name}-a").status


def test_a_large_submit_goes_in_batches_of_100_and_repeats_idempotently() -> None:
    agent = nodus.ClaudeAgent(unique("many"), system="x", per_run_max_cost="1.00")
    # A cap below one run's cap: no run starts, the test only creates them.
    group = nodus.AgentGroup.create(
        unique("big"), agent=agent, max_active=1, max_cost=Decimal("0.01")
    )
    tasks = [nodus.Task(f"t{i}", f"task {i}", ("t0",) if i else ()) for i in range(150)]
    runs = group.submit(tasks, seal=False)
    assert len(runs) == 150 and runs[149].name == f"{group.name}-t149"
    # The same batches again (as after a lost answer) are replayed, not created twice.
    again = group.submit(tasks, seal=False)
    assert [r.name for r in again] == [r.name for r in runs]
    assert len(group.runs()) == 150
    # The group's counts follow as its controller reconciles it.
    deadline = time.monotonic() + 30
    while sum((status := group.status).counts.values()) < 150:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert not status.sealed and status.counts["queued"] == 150
    assert group.seal().sealed
    cancelled = group.cancel()
    assert cancelled.phase in ("Cancelling", "Cancelled")
    assert group.wait(timeout=60).phase == "Cancelled"
    group.delete()


def test_a_batch_whose_answer_was_lost_is_sent_again_and_created_once(server: NodusServer) -> None:
    proxy = LosingProxy(server.url, lose=1)
    try:
        with nodus.Client(server=proxy.url, token=TOKEN) as client:
            agent = nodus.ClaudeAgent(unique("lost"), system="x", client=client)
            group = nodus.AgentGroup.create(
                unique("lost"), agent=agent, max_active=1, max_cost="0.01", client=client
            )
            runs = group.submit([("a", "first"), ("b", "second", ["a"])], seal=False)
            assert [r.name for r in runs] == [f"{group.name}-a", f"{group.name}-b"]
            # Sent twice under one key; the server created the runs once and replayed them.
            assert (
                len(proxy.keys) == 2
                and proxy.keys[0] is not None
                and proxy.keys[0] == proxy.keys[1]
            )
            listed = client.list("agentruns", field_selector=f"spec.group={group.name}")
            assert sorted(r["metadata"]["name"] for r in listed) == [r.name for r in runs]
            group.delete()
    finally:
        proxy.close()


def test_stopped_agent_invalid_input_and_existing_objects() -> None:
    client = nodus.Client()
    name = unique("stopped")
    nodus.ClaudeAgent(name, system="x").ensure()
    client.patch("agents", name, {"spec": {"state": "Stopped"}})
    with pytest.raises(nodus.AgentStopped) as stopped:
        nodus.ClaudeAgent.from_name(name).submit("hi")
    assert stopped.value.reason == "AgentStopped"
    with pytest.raises(nodus.Invalid) as invalid:
        nodus.ClaudeAgent("Not_A_Name", system="x").ensure()
    assert invalid.value.field == "metadata.name" and invalid.value.rule and invalid.value.value
    with pytest.raises(nodus.AlreadyExists) as exists:
        client.create(
            "agents",
            {
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"system": "x", "model": {"access": "Nodus"}},
            },
        )
    assert isinstance(exists.value, nodus.Conflict)
    with pytest.raises(nodus.Invalid) as kind:
        nodus.AgentRun("whatever").send("telegram", "hi")
    assert kind.value.field == "kind"
    with pytest.raises(TypeError, match="max_cost"):
        nodus.AgentGroup.create(unique("g"), agent=name, max_cost=0.6)
    with pytest.raises(nodus.NodusError) as method:
        client.send(
            nodus._core.Request("PUT", "/apis/nodus.dev/v1/projects/default/agentruns/x/steps")
        )
    assert method.value.reason == "MethodNotAllowed" and method.value.status_code == 405


def test_forbidden_projects() -> None:
    with pytest.raises(nodus.Forbidden) as other:
        nodus.AgentRun("x", project="someone-else").status
    assert "someone-else" in other.value.message
    with pytest.raises(nodus.Forbidden) as read_only:
        nodus.ClaudeAgent(unique("tpl"), system="x", project="nodus").ensure()
    assert "read-only" in read_only.value.message


def test_a_wrong_token_is_unauthorized_and_never_shown(server: NodusServer) -> None:
    wrong = "wrong-token-" + "x" * 32
    client = nodus.Client(server=server.url, token=wrong)
    with pytest.raises(nodus.Unauthorized) as refused:
        nodus.ClaudeAgent("any", system="x", client=client).remote("hi")
    assert refused.value.status_code == 401
    assert wrong not in str(refused.value) and wrong not in repr(client)


def test_a_server_that_is_down_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = nodus.Client(server=url, token="t" * 40)
    with pytest.raises(nodus.ConnectionFailed) as down:
        nodus.AgentRun("x", client=client).status
    error = down.value
    assert isinstance(error, nodus.ServerUnavailable)
    assert url in error.message and "unreachable" in error.message
    # No chain into the HTTP library's exceptions.
    assert error.__cause__ is None and error.__suppress_context__
    script = f"import nodus\nnodus.ClaudeAgent('a', system='x', client=nodus.Client(server={url!r}, token='t'*40)).remote('hi')\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "nodus.errors.ConnectionFailed: ConnectionFailed: the Nodus server at" in done.stderr
    assert "httpx" not in done.stderr and "httpcore" not in done.stderr


def test_connection_from_arguments_environment_and_the_cli_login(
    server: NodusServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODUS_SERVER")
    monkeypatch.delenv("NODUS_TOKEN")
    with pytest.raises(nodus.ConfigError, match="no token for http://127.0.0.1:7070"):
        nodus.Client()
    # `nodus login` writes the config the SDK reads.
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    login = subprocess.run(
        [nodus_bin(), "login", "--server", server.url, "--token", TOKEN],
        env=env,
        capture_output=True,
        text=True,
    )
    assert login.returncode == 0, login.stderr
    client = nodus.Client()
    assert (client.server, client.project) == (server.url, "default")
    assert nodus.AgentRun("x", client=client).project == "default"
    with pytest.raises(nodus.NotFound):
        nodus.AgentRun("x", client=client).status
    # The environment wins over the context; arguments over both.
    monkeypatch.setenv("NODUS_PROJECT", "env-project")
    assert nodus.Client().project == "env-project"
    assert nodus.Client(project="arg-project").project == "arg-project"
    # A saved token is not sent to another server.
    monkeypatch.setenv("NODUS_SERVER", "http://127.0.0.1:1")
    with pytest.raises(nodus.ConfigError, match="no token for http://127.0.0.1:1"):
        nodus.Client()
    assert nodus.Client(token="explicit-token").server == "http://127.0.0.1:1"


def test_unit_errors_by_reason_and_status() -> None:
    make = nodus.errors.error_from_response
    body: Any = {
        "kind": "Status",
        "status": "Failure",
        "code": 503,
        "reason": "Unavailable",
        "message": "store down",
    }
    assert type(make(503, body, "")) is nodus.ServerUnavailable
    assert (
        type(make(500, {"reason": "InternalError", "message": "boom"}, "")) is nodus.InternalError
    )
    assert (
        type(make(404, {"reason": "WorkdirNotKept", "message": "too big"}, ""))
        is nodus.WorkdirNotKept
    )
    assert type(make(429, None, "slow down")) is nodus.ServerUnavailable
    unknown = make(418, {"reason": "Teapot", "message": "short and stout"}, "")
    assert type(unknown) is nodus.NodusError and unknown.reason == "Teapot"
    assert str(make(409, {"reason": "AgentStopped", "message": "m"}, "")) == "AgentStopped: m"
    assert nodus.types.parse_time("2026-12-01T15:23:47.445862612Z") == datetime.fromisoformat(
        "2026-12-01T15:23:47.445862+00:00"
    )
    assert nodus.types.parse_time("2026-12-01T15:23:47+02:00").utcoffset().total_seconds() == 7200  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        nodus.types.parse_money(0.1)


def test_wait_is_a_long_poll_that_answers_a_change_at_once(server: NodusServer) -> None:
    agent = nodus.ClaudeAgent(unique("watched"), system="You are careful.")
    group = nodus.AgentGroup.create(unique("watched"), agent=agent, max_active=1)
    # Nothing changes for 3 s: a read and a long poll or two, not a read every pause.
    before = server.requests()
    started = time.monotonic()
    with pytest.raises(nodus.WaitTimeout):
        group.wait(timeout=3)
    took = time.monotonic() - started
    assert 3 <= took < 4.5, took
    assert server.requests() - before - 1 <= 4
    # A change answers the wait at once, however long it has waited.
    sealed_at: List[float] = []

    def seal_later() -> None:
        time.sleep(3.3)
        sealed_at.append(time.monotonic())
        nodus.AgentGroup.from_name(group.name).seal()

    sealer = threading.Thread(target=seal_later)
    sealer.start()
    status = group.wait(timeout=30)
    answered = time.monotonic()
    sealer.join()
    assert status.phase == "Succeeded"
    assert answered - sealed_at[0] < 0.5, answered - sealed_at[0]


def _paged_agent(name: str, team: str) -> Dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": name, "labels": {"paged": team}},
        "spec": {"system": "You help.", "model": {"access": "Nodus"}},
    }


def test_list_reads_every_chunk_in_creation_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunks of 2, a list of 5 takes three requests (limit=2, then the continue token of
    each answer) and answers all 5 in creation order."""
    client = nodus.Client()
    team = unique("paged")
    names = [unique("p") for _ in range(5)]
    for name in names:
        client.create("agents", _paged_agent(name, team))
    client.create("agents", _paged_agent(unique("other"), unique("paged")))
    monkeypatch.setattr(nodus._ops, "LIST_CHUNK", 2)
    sent: List[Dict[str, Any]] = []
    request = client._http.request

    def recorded(**arguments: Any) -> Any:
        sent.append(dict(arguments.get("params") or {}))
        return request(**arguments)

    monkeypatch.setattr(client._http, "request", recorded)
    listed = client.list("agents", label_selector=f"paged={team}")
    assert [item["metadata"]["name"] for item in listed] == names
    assert [params["limit"] for params in sent] == ["2", "2", "2"]
    assert "continue" not in sent[0]
    assert all(params.get("continue") for params in sent[1:])
