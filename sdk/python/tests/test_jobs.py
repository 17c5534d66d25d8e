"""Runs as jobs from Python, against the real ``nodus server`` (fake model over HTTP):
AgentEnvironments, inline environments and agents, a run's context checked against its
agent's schema, results downloaded and unpacked, logs followed to the end of a run, and
post-run actions."""

from __future__ import annotations

import asyncio
import json
import tarfile
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import nodus
import nodus.aio as aio
from conftest import TOKEN, FakeAnthropic, NodusServer, WebhookReceiver


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def inline_agent() -> Dict[str, Any]:
    return {"system": "You are careful.", "model": {"access": "Nodus", "families": ["haiku"]}}


def test_an_environment_variable_reaches_the_command_and_a_secret_stays_a_reference() -> None:
    client = nodus.default_client()
    level = unique("level")
    secret_value = unique("never-shown-secret-value")
    secret = unique("github")
    client.create_secret(secret, {"token": secret_value})
    name = unique("research")
    environment = nodus.AgentEnvironment.create(
        name,
        env={"LOG_LEVEL": level},
        secrets={"GITHUB_TOKEN": nodus.SecretRef(secret, "token")},
        compute={"cpu": "1", "memory": "512Mi"},
    )
    # Read back, listed, typed.
    assert environment.spec.env == {"LOG_LEVEL": level}
    assert environment.spec.secrets == {"GITHUB_TOKEN": nodus.SecretRef(secret, "token")}
    assert environment.spec.compute == {"cpu": "1", "memory": "512Mi"}
    got = nodus.AgentEnvironment.get(name)
    assert got.spec.env == {"LOG_LEVEL": level}
    assert name in [e.name for e in nodus.AgentEnvironment.list()]

    agent = nodus.ClaudeAgent(unique("env-agent"), system="You are careful.", families=["haiku"])
    # The command prints the variable; its value is nowhere in the prompt.
    run = nodus.AgentRun.create(
        agent,
        'Run `printf "level=%s secret-bytes=%s\\n" "$LOG_LEVEL" "${#GITHUB_TOKEN}"`',
        environment=environment,
    )
    lines = list(run.logs(follow=True, timeout=60))
    stdout = [line.text for line in lines if line.stream == "stdout"]
    assert stdout == [f"level={level} secret-bytes={len(secret_value)}"]
    assert run.status.phase == "Succeeded"
    # The run's snapshot names the Secret by name, key and version, never its value.
    snapshot = run.environment()
    assert snapshot is not None
    assert snapshot.env == {"LOG_LEVEL": level}
    ref = snapshot.secrets["GITHUB_TOKEN"]
    assert (ref.name, ref.key) == (secret, "token")
    assert ref.version
    assert secret_value not in json.dumps(run.document())
    assert secret_value not in "\n".join(line.text for line in lines)

    # Deleting the environment leaves the run's snapshot as it was.
    environment.delete()
    with pytest.raises(nodus.NotFound):
        nodus.AgentEnvironment.get(name)
    after = run.environment()
    assert after is not None and after.env == {"LOG_LEVEL": level}


def test_an_agents_environment_is_the_default_of_its_runs() -> None:
    value = unique("default")
    environment = nodus.AgentEnvironment.create(unique("agent-env"), env={"STAGE": value})
    agent = nodus.ClaudeAgent(
        unique("with-env"), system="You are careful.", families=["haiku"], environment=environment
    )
    assert agent.ensure()["spec"]["environment"] == environment.name
    run = agent.submit('Run `printf "stage=%s\\n" "$STAGE"`')
    assert run.answer(timeout=60) == f"It is stage={value}."
    # A run's own environment wins over the agent's.
    other = agent.submit(
        'Run `printf "stage=%s\\n" "$STAGE"`',
        environment=nodus.AgentEnvironment.inline(env={"STAGE": "own"}),
    )
    assert other.answer(timeout=60) == "It is stage=own."


def test_an_inline_agent_with_an_inline_environment() -> None:
    value = unique("inline")
    run = nodus.AgentRun.create(
        inline_agent(),
        'Run `printf "mode=%s\\n" "$MODE"`',
        environment=nodus.AgentEnvironment.inline(env={"MODE": value}),
    )
    lines = [line.text for line in run.logs(follow=True, timeout=60) if line.stream == "stdout"]
    assert lines == [f"mode={value}"]
    document = run.document()
    # Kept with the run, never stored as an Agent.
    assert document["spec"]["agent"]["system"] == "You are careful."
    assert "agentRef" not in document["status"]["snapshot"]
    assert run.record().answer == f"It is mode={value}."


def test_a_bad_environment_is_refused_naming_the_field() -> None:
    with pytest.raises(nodus.Invalid) as refused:
        nodus.AgentEnvironment.create(unique("bad"), env={"PATH": "/tmp"})
    assert refused.value.field is not None and "env" in refused.value.field
    with pytest.raises(nodus.Invalid) as refused:
        nodus.AgentEnvironment.create(unique("bad"), compute={"tpu": "1"})
    assert refused.value.field is not None and "compute" in refused.value.field


def test_results_are_listed_and_a_tarball_downloaded_and_unpacked(tmp_path: Path) -> None:
    run = nodus.AgentRun.create(
        inline_agent(), "Run `printf 'made by the run\\n' > made.txt && echo written`"
    )
    run.wait(timeout=60)
    results = {r.name: r for r in run.results()}
    assert {"inputWorkdir", "outputWorkdir", "artifacts", "runRecord"} <= set(results)
    assert "error" not in results
    output = results["outputWorkdir"]
    assert (output.file_name, output.content_type) == ("outputWorkdir.tar.gz", "application/gzip")
    saved = tmp_path / "out.tar.gz"
    assert run.download_result("outputWorkdir", saved) == output.size
    assert saved.stat().st_size == output.size
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with tarfile.open(saved, "r:gz") as archive:
        archive.extractall(unpacked, filter="data")
    assert (unpacked / "made.txt").read_text() == "made by the run\n"
    # The artifacts hold the command's output in full.
    artifacts = tmp_path / "artifacts.tar.gz"
    run.download_result("artifacts", artifacts)
    with tarfile.open(artifacts, "r:gz") as archive:
        stdout = archive.extractfile("commands/001/stdout")
        assert stdout is not None and stdout.read() == b"written\n"
    # The run record, typed.
    record = run.record()
    assert (record.name, record.phase) == (run.name, "Succeeded")
    assert record.answer == "It is written."
    assert len(record.turns) == 1 and record.cost.total == run.status.cost.total
    assert record.completed is not None and record.started is not None
    assert run.error() is None
    # No such result: NotFound, and nothing is written.
    missing = tmp_path / "missing.bin"
    with pytest.raises(nodus.NotFound):
        run.download_result("nosuch", missing)
    assert not missing.exists() and not list(tmp_path.glob(".*.part"))


def test_a_runs_trajectory_is_read_as_a_dict_and_a_run_may_keep_none() -> None:
    run = nodus.AgentRun.create(inline_agent(), "Run `echo traced`")
    status = run.wait(timeout=60)
    assert "trajectory" in {r.name for r in run.results()}
    trajectory = run.trajectory()
    assert isinstance(trajectory, dict)
    assert trajectory["schema_version"] == "ATIF-v1.8"
    assert trajectory["session_id"] == run.record().uid
    steps = trajectory["steps"]
    assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    assert [s["source"] for s in steps[:2]] == ["system", "user"]
    assert steps[1]["message"] == "Run `echo traced`"
    calls = [s for s in steps if s["extra"]["kind"] == "model_call"]
    assert len(calls) == 2
    assert calls[0]["tool_calls"][0]["arguments"] == {"command": "echo traced"}
    result = calls[0]["observation"]["results"][0]
    assert result["content"] == "exit code 0\nstdout:\ntraced\n"
    assert result["extra"]["exit_code"] == 0
    assert calls[1]["message"] == "It is traced."
    # The totals are the run's status: its exact spend, and its tokens.
    totals = trajectory["final_metrics"]
    assert status.cost.total > 0
    assert Decimal(totals["extra"]["cost_usd_exact"]) == status.cost.total
    assert totals["total_cost_usd"] == float(status.cost.total)
    assert totals["total_completion_tokens"] == sum(t.output_tokens for t in status.turns)

    quiet = nodus.AgentRun.create(inline_agent(), "Run `echo hush`", auto_telemetry=False)
    quiet.wait(timeout=60)
    assert quiet.document()["spec"]["autoTelemetry"] is False
    assert "trajectory" not in {r.name for r in quiet.results()}
    with pytest.raises(nodus.NotFound) as missing:
        quiet.trajectory()
    assert "autoTelemetry is false" in str(missing.value)


def test_a_failed_run_has_an_error_result() -> None:
    run = nodus.AgentRun.create(inline_agent(), "[refuse] this prompt")
    run.wait(timeout=60)
    error = run.error()
    assert error is not None
    assert error.type == run.status.reason
    assert error.timeout is False
    assert run.record().phase == "Failed"


def test_logs_follow_a_run_to_its_end() -> None:
    marker = unique("done")
    run = nodus.AgentRun.create(inline_agent(), f"Run `sleep 1; echo {marker}`")
    phases: List[str] = []
    lines: List[nodus.LogLine] = []
    for line in run.logs(follow=True, timeout=60):
        if not lines:
            phases.append(str(run.status.phase))
        lines.append(line)
    # It began while the run went on, and ended once it had ended, with everything shown.
    assert phases[0] not in ("Succeeded", "Failed", "Cancelled")
    assert run.status.phase == "Succeeded"
    texts = [str(line) for line in lines]
    assert f"$ sleep 1; echo {marker}" in texts
    assert texts.index(f"$ sleep 1; echo {marker}") < texts.index(marker)
    assert [line.text for line in lines if line.stream == "stdout"] == [marker]
    assert lines[0].stream == "step" and lines[0].text.startswith("[0] SandboxCreation ")

    # Without follow: what there is now; the same commands and output.
    def output(lines: List[nodus.LogLine]) -> List[str]:
        return [line.text for line in lines if line.stream in ("command", "stdout", "stderr")]

    assert output(list(run.logs())) == output(lines)


def test_a_context_that_fails_the_agents_schema_is_refused_naming_the_path() -> None:
    schema = {
        "type": "object",
        "properties": {
            "ticket": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            }
        },
        "required": ["ticket"],
    }
    agent = nodus.ClaudeAgent(
        unique("ctx"), system="You are careful.", families=["haiku"], context_schema=schema
    )
    with pytest.raises(nodus.Invalid) as refused:
        agent.submit("Hello", context={"ticket": {"id": "not-a-number"}})
    assert refused.value.field == "spec.context.ticket.id"
    assert refused.value.status_code == 422
    assert "contextSchema" in (refused.value.rule or refused.value.message)
    with pytest.raises(nodus.Invalid) as missing:
        agent.submit("Hello")
    assert missing.value.field == "spec.context"
    run = agent.submit("Hello", context={"ticket": {"id": 7}})
    assert run.wait(timeout=60).phase == "Succeeded"


def test_post_run_actions_are_listed_and_a_webhook_delivers_the_record(
    receiver: WebhookReceiver,
) -> None:
    url, received = receiver.url, receiver.received
    actions = {a.kind: a for a in nodus.default_client().post_run_actions()}
    assert {"agents.noop", "agents.webhook"} <= set(actions)
    webhook = actions["agents.webhook"]
    assert webhook.title and webhook.description
    assert "url" in webhook.config_schema.get("properties", {})
    run = nodus.AgentRun.create(
        inline_agent(),
        "Say hello",
        post_run_action={"kind": "agents.webhook", "config": {"url": url}},
    )
    assert run.wait(timeout=60).phase == "Succeeded"
    assert [(r["path"], r["body"]["name"]) for r in received] == [("/hook", run.name)]
    assert "webhookDelivery" in [r.name for r in run.results()]
    assert run.document()["status"]["snapshot"]["postRunAction"]["kind"] == "agents.webhook"
    # An agent that declares the webhook as its only kind: its runs take it, and may not
    # choose another.
    agent = nodus.ClaudeAgent(
        unique("hooked"),
        system="You are careful.",
        families=["haiku"],
        post_run_actions=["agents.webhook"],
    )
    assert agent.ensure()["spec"]["postRunActions"] == ["agents.webhook"]
    with pytest.raises(nodus.Invalid) as refused:
        agent.submit("Hi", post_run_action={"kind": "agents.noop"})
    assert refused.value.field is not None and "postRunAction" in refused.value.field
    hooked = agent.submit("Hi", post_run_action={"kind": "agents.webhook", "config": {"url": url}})
    assert hooked.wait(timeout=60).phase == "Succeeded"
    assert [r["body"]["name"] for r in received] == [run.name, hooked.name]
    # A kind the server does not install is refused when the run is created.
    with pytest.raises(nodus.Invalid) as refused:
        nodus.AgentRun.create(inline_agent(), "Hi", post_run_action={"kind": "agents.nosuch"})
    assert refused.value.field is not None and "postRunAction" in refused.value.field


def test_jobs_with_asyncio(tmp_path: Path) -> None:
    async def main() -> None:
        async with aio.AsyncClient() as client:
            value = unique("aio")
            name = unique("aio-env")
            environment = await aio.AgentEnvironment.create(
                name, env={"FLAVOUR": value}, client=client
            )
            assert name in [e.name for e in await aio.AgentEnvironment.list(client=client)]
            assert (await aio.AgentEnvironment.get(name, client=client)).spec.env == {
                "FLAVOUR": value
            }
            run = await aio.AgentRun.create(
                inline_agent(),
                'Run `printf "flavour=%s\\n" "$FLAVOUR" > flavour.txt; cat flavour.txt`',
                environment=environment,
                client=client,
            )
            lines = [line async for line in run.logs(follow=True, timeout=60)]
            assert [line.text for line in lines if line.stream == "stdout"] == [f"flavour={value}"]
            results = {r.name: r for r in await run.results()}
            saved = tmp_path / "out.tar.gz"
            assert await run.download_result("outputWorkdir", saved) == (
                results["outputWorkdir"].size
            )
            with tarfile.open(saved, "r:gz") as archive:
                member = archive.extractfile("flavour.txt")
                assert member is not None and member.read() == f"flavour={value}\n".encode()
            record = await run.record()
            assert record.phase == "Succeeded" and record.answer == f"It is flavour={value}."
            trajectory = await run.trajectory()
            assert trajectory["session_id"] == record.uid
            exact = trajectory["final_metrics"]["extra"]["cost_usd_exact"]
            assert Decimal(exact) == record.cost.total
            assert await run.error() is None
            snapshot = await run.environment()
            assert snapshot is not None and snapshot.env == {"FLAVOUR": value}
            kinds = [a.kind for a in await client.post_run_actions()]
            assert "agents.webhook" in kinds
            await environment.delete()
            with pytest.raises(nodus.NotFound):
                await aio.AgentEnvironment.get(name, client=client)

    asyncio.run(main())


def test_a_log_shows_each_step_once_and_its_output_once_it_has_finished() -> None:
    from nodus import _core

    started = {"seq": 3, "kind": "Command", "state": "Started", "summary": "run `x`"}
    command = {**started, "intent": {"command": "x"}}
    state = _core.LogState()
    lines = state.lines({"items": [command]})
    assert [(line.stream, line.text) for line in lines] == [
        ("step", "[3] Command Started: run `x`"),
        ("command", "$ x"),
    ]
    assert not state.complete
    # Nothing new: nothing shown again.
    assert state.lines({"items": [command]}) == []
    done = {
        **command,
        "state": "Completed",
        "summary": "run `x`: exit 0",
        "finishedAt": "2026-12-01T10:00:00Z",
        "outcome": {"output": {"stdout": {"bytes": "one\ntwo\n"}, "stderr": {"bytes": [255, 254]}}},
    }
    lines = state.lines({"items": [done]})
    assert [(line.stream, line.text) for line in lines] == [
        ("finished", "[3] Command Completed: run `x`: exit 0 (finished)"),
        ("stdout", "one"),
        ("stdout", "two"),
        ("stderr", "(2 bytes that are not text)"),
    ]
    assert state.complete and state.lines({"items": [done]}) == []
    # A step seen first when it has finished: its line and its output at once.
    fresh = _core.LogState()
    assert [line.stream for line in fresh.lines({"items": [done]})] == [
        "step",
        "command",
        "stdout",
        "stdout",
        "stderr",
    ]


def test_logs_follow_a_running_commands_output_line_by_line(fake_model: FakeAnthropic) -> None:
    # The bubblewrap sandbox reports a command's output as it comes (the unisolated one of
    # the other tests does not, and its output shows from the finished step).
    process = NodusServer(fake_model.url, sandbox="process")
    try:
        client = nodus.Client(process.url, TOKEN, "default")
        run = nodus.AgentRun.create(
            inline_agent(),
            "Run `for i in 1 2 3; do echo line-$i; sleep 1; done`",
            client=client,
        )
        seen = [
            (line.text, line.step.state)
            for line in run.logs(follow=True, timeout=60)
            if line.stream == "stdout"
        ]
        # Each line once, the first while its command was still running.
        assert [text for text, _ in seen] == ["line-1", "line-2", "line-3"]
        assert seen[0][1] == "Started"
        assert run.status.phase == "Succeeded"

        async def followed() -> List[Tuple[str, str]]:
            async with aio.AsyncClient(process.url, TOKEN, "default") as connection:
                again = await aio.AgentRun.create(
                    inline_agent(),
                    "Run `for i in 1 2; do echo async-$i; sleep 1; done`",
                    client=connection,
                )
                return [
                    (line.text, line.step.state)
                    async for line in again.logs(follow=True, timeout=60)
                    if line.stream == "stdout"
                ]

        seen = asyncio.run(followed())
        assert [text for text, _ in seen] == ["async-1", "async-2"]
        assert seen[0][1] == "Started"
    finally:
        process.stop()
