"""``nodus.aio`` against the real ``nodus server``: the same surface as the synchronous
client, as coroutines, and the same errors."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal
from typing import Any, Awaitable, Callable, TypeVar

import pytest

import nodus
import nodus.aio as aio
from conftest import TOKEN, FakeAnthropic, NodusServer, free_port

T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_async(test: Callable[[aio.AsyncClient], Awaitable[T]], **client: Any) -> T:
    async def main() -> T:
        async with aio.AsyncClient(**client) as connection:
            return await test(connection)

    return asyncio.run(main())


def test_aio_exports_the_same_names_and_errors() -> None:
    for name in [
        "ClaudeAgent",
        "AgentRun",
        "AgentGroup",
        "AgentEnvironment",
        "Task",
        "SecretRef",
        "RunResult",
        "RunRecord",
        "LogLine",
        "NodusError",
        "AgentRunFinished",
        "Invalid",
    ]:
        assert hasattr(aio, name)
    assert aio.NotFound is nodus.NotFound and aio.Task is nodus.Task
    assert aio.SecretRef is nodus.SecretRef and aio.RunRecord is nodus.RunRecord
    for cls in (aio.ClaudeAgent, aio.AgentRun, aio.AgentGroup, aio.AgentEnvironment):
        sync = getattr(nodus, cls.__name__)
        public = {n for n in dir(sync) if not n.startswith("_")}
        assert public <= {n for n in dir(cls) if not n.startswith("_")}, cls


def test_aio_remote_submit_status_steps_and_template() -> None:
    async def test(client: aio.AsyncClient) -> None:
        agent = aio.ClaudeAgent(
            unique("aremote"), system="You are careful.", families=["haiku"], client=client
        )
        assert await agent.remote("run `echo async-ok`", timeout=60) == "It is async-ok."
        run = await agent.submit("run `echo again`")
        status = await run.wait(timeout=60)
        assert status.phase == "Succeeded" and isinstance(status.cost.total, Decimal)
        assert (await run.status).answer_preview == "It is again."
        assert [s.kind for s in await run.steps()][-1] == "SandboxDeletion"
        assert await run.answer() == "It is again."
        await run.delete()
        with pytest.raises(nodus.NotFound):
            await run.status
        template = aio.ClaudeAgent.from_name("claude-assistant", project="nodus", client=client)
        assert await template.remote("run `echo tpl`", timeout=60) == "It is tpl."
        stored = await aio.ClaudeAgent(agent.name, system="changed", client=client).ensure()
        assert stored["spec"]["system"] == "changed"

    run_async(test)


def test_aio_keep_alive_send_twice_delivered_once_then_cancel(fake_model: FakeAnthropic) -> None:
    async def test(client: aio.AsyncClient) -> None:
        agent = aio.ClaudeAgent(unique("achat"), system="x", client=client)
        run = await agent.submit("run `echo one`", keep_alive=True)
        assert await run.answer(timeout=60) == "It is one."
        first = await run.send("message", "then `echo two`", key="k")
        again = await run.send("message", "then `echo two`", key="k")
        assert (first.seq, first.duplicate, again.seq, again.duplicate) == (1, False, 1, True)
        assert await run.answer(timeout=60) == "It is two."
        assert len([s for s in await run.steps() if s.kind == "Answer"]) == 2
        await run.cancel()
        assert (await run.wait(timeout=60)).phase == "Cancelled"
        with pytest.raises(nodus.RunFailed):
            await run.answer()
        with pytest.raises(nodus.AgentRunFinished):
            await run.send("message", "late")
        talk = await agent.submit("hello", keep_alive=True)
        assert await talk.answer(timeout=60) == "Noted: hello"
        assert (await talk.close()).close_requested
        assert (await talk.wait(timeout=60)).phase == "Succeeded"
        assert await talk.answer() == "Noted: hello"

    run_async(test)


def test_aio_cancel_a_working_run_and_time_out() -> None:
    async def test(client: aio.AsyncClient) -> None:
        run = await aio.ClaudeAgent(unique("acancel"), system="x", client=client).submit(
            "run `sleep 5`"
        )
        with pytest.raises(nodus.WaitTimeout):
            await run.wait(timeout=0.3)
        await run.cancel()
        status = await run.wait(timeout=60)
        assert (status.phase, status.reason) == ("Cancelled", "CancelRequested")

    run_async(test)


def test_aio_group_byok_and_errors(fake_model: FakeAnthropic) -> None:
    async def test(client: aio.AsyncClient) -> None:
        secret = unique("akey")
        user_key = "sk-async-user-" + uuid.uuid4().hex
        await client.create_secret(secret, {"ANTHROPIC_API_KEY": user_key})
        agent = aio.ClaudeAgent(unique("abyok"), system="x", api_key_secret=secret, client=client)
        seen = len(fake_model.requests)
        group = await aio.AgentGroup.create(
            unique("agrp"), agent=agent, max_active=2, max_cost="0.60"
        )
        runs = await group.submit([("a", "run `echo A`"), ("b", "run `echo B`", ["a"])])
        assert [r.name for r in runs] == [f"{group.name}-a", f"{group.name}-b"]
        status = await group.wait(timeout=120)
        assert status.phase == "Succeeded" and status.counts["succeeded"] == 2
        assert (await group.status).cost.total == Decimal("0")
        assert {r["key"] for r in fake_model.requests[seen:]} == {user_key}
        results = await group.results()
        assert sorted((r.task_id, r.state, r.get("verdict")) for r in results) == [
            ("a", "Succeeded", None),
            ("b", "Succeeded", None),
        ]
        assert len(await group.runs()) == 2
        with pytest.raises(nodus.Conflict):
            await group.submit([("c", "late")], seal=False)
        assert (await group.cancel()).phase == "Succeeded"
        await group.delete()
        with pytest.raises(nodus.NotFound):
            await aio.AgentGroup.from_name(group.name, client=client).status
        with pytest.raises(nodus.Invalid) as invalid:
            await aio.AgentGroup.create(
                unique("aeval"),
                agent=agent.name,
                evaluation={"environment": "nodus/x@1.0.0", "tasks": 1},
            )
        assert invalid.value.field == "spec.evaluation.environment"
        with pytest.raises(nodus.AlreadyExists):
            await client.create_secret(secret, {"A": "b"})
        with pytest.raises(nodus.Forbidden):
            await aio.AgentRun("x", project="elsewhere", client=client).status
        name = unique("astopped")
        await aio.ClaudeAgent(name, system="x", client=client).ensure()
        await client.patch("agents", name, {"spec": {"state": "Stopped"}})
        with pytest.raises(nodus.AgentStopped):
            await aio.ClaudeAgent.from_name(name, client=client).submit("hi")
        assert len(await client.list("agentruns", field_selector=f"spec.agent={name}")) == 0

    run_async(test)


def test_aio_evaluation_group_waits_reads_results_and_deletes() -> None:
    async def test(client: aio.AsyncClient) -> None:
        agent = aio.ClaudeAgent(
            unique("aevalok"),
            system="x",
            families=["haiku"],
            per_run_max_cost="0.05",
            client=client,
        )
        group = await aio.AgentGroup.create(
            unique("aevalok"),
            agent=agent,
            max_active=2,
            max_cost="0.20",
            evaluation={
                "environment": "nodus/arithmetic-v2@2.0.0",
                "split": "test",
                "tasks": 2,
                "repetitions": 1,
                "seed": 3,
                "timeout": "5m",
            },
        )
        status = await group.wait(timeout=120)
        assert status.phase == "Succeeded"
        assert status.evaluation.pending == 0 and status.evaluation.get("passRate") == 1.0
        assert (await group.status).evaluation.scored == 2
        results = await group.results()
        assert [(r.state, r.get("verdict")) for r in results] == [("Scored", "pass")] * 2
        assert all(isinstance(r.cost.total, Decimal) and r.get("seed") == 3 for r in results)
        await group.delete()
        with pytest.raises(nodus.NotFound):
            await aio.AgentGroup.from_name(group.name, client=client).status

    run_async(test)


def test_aio_evaluation_pass_at_k_retry_and_rescore(fake_model: FakeAnthropic) -> None:
    """The asyncio client reads pass@k and each task's summary, has a retry of nothing
    unscored refused naming why, and rescores without a model call, as the sync client."""

    async def test(client: aio.AsyncClient) -> None:
        agent = aio.ClaudeAgent(
            unique("aepochs"),
            system="x",
            families=["haiku"],
            per_run_max_cost="0.05",
            client=client,
        )
        group = await aio.AgentGroup.create(
            unique("aepochs"),
            agent=agent,
            max_active=3,
            max_cost="0.50",
            evaluation={
                "environment": "nodus/arithmetic-v2@2.0.0",
                "split": "train",
                "tasks": 2,
                "repetitions": 3,
                "seed": 11,
                "timeout": "5m",
            },
        )
        status = await group.wait(timeout=120)
        assert status.phase == "Succeeded"
        evaluation = status.evaluation
        assert evaluation.scored == 6 and evaluation.unscored == {}
        # Every repetition passed: pass@1..3 are 1 for each task and across them.
        assert evaluation.pass_at_k == {1: 1.0, 2: 1.0, 3: 1.0}
        per_task = evaluation.per_task
        assert [(t["attempts"], t["scored"], t["passes"]) for t in per_task] == [(3, 3, 3)] * 2
        assert all(t["passAtK"] == {"1": 1.0, "2": 1.0, "3": 1.0} for t in per_task)
        with pytest.raises(nodus.Invalid, match="none unscored"):
            await group.retry()
        with pytest.raises(nodus.Invalid, match="GraderFailed"):
            await group.retry(reasons=["GraderFailed"])
        asked = len(fake_model.requests)
        rescore = await group.rescore("nodus/arithmetic-v2@2.0.0", name=f"{group.name}-again")
        assert rescore.name == f"{group.name}-again"
        rescored = await rescore.wait(timeout=120)
        assert rescored.evaluation.scored == 6 and rescored.evaluation.pass_rate == 1.0
        assert rescored.evaluation.pass_at_k == {1: 1.0, 2: 1.0, 3: 1.0}
        assert len(fake_model.requests) == asked, "a rescore calls no model"
        with pytest.raises(nodus.Invalid, match="rescoreOf"):
            await rescore.retry()
        await rescore.delete()
        await group.delete()

    run_async(test)


def test_aio_wrong_token_and_a_server_that_is_down(server: NodusServer) -> None:
    async def wrong(client: aio.AsyncClient) -> None:
        with pytest.raises(nodus.Unauthorized):
            await aio.AgentRun("x", client=client).status

    run_async(wrong, server=server.url, token="not-the-token-" + "y" * 32)
    url = f"http://127.0.0.1:{free_port()}"

    async def down(client: aio.AsyncClient) -> None:
        with pytest.raises(nodus.ConnectionFailed) as error:
            await aio.ClaudeAgent("a", system="x", client=client).remote("hi")
        assert url in error.value.message and error.value.__suppress_context__

    run_async(down, server=url, token=TOKEN)


def test_aio_default_client_from_the_environment(server: NodusServer) -> None:
    async def main() -> str:
        agent = aio.ClaudeAgent(unique("adefault"), system="x")
        answer = await agent.remote("run `echo env`", timeout=60)
        assert agent.client.server == server.url
        await agent.client.aclose()
        return answer

    assert asyncio.run(main()) == "It is env."


def test_aio_without_a_token_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODUS_TOKEN")
    with pytest.raises(nodus.ConfigError, match="no token for http://127.0.0.1:"):
        aio.AsyncClient()
    with pytest.raises(nodus.ConfigError):
        aio.AgentRun("x")


def test_aio_wait_is_a_long_poll_that_answers_a_change_at_once(server: NodusServer) -> None:
    async def test(client: aio.AsyncClient) -> None:
        agent = aio.ClaudeAgent(unique("awatched"), system="x", client=client)
        group = await aio.AgentGroup.create(unique("awatched"), agent=agent, max_active=1)
        before = server.requests()
        started = time.monotonic()
        with pytest.raises(nodus.WaitTimeout):
            await group.wait(timeout=3)
        assert 3 <= time.monotonic() - started < 4.5
        assert server.requests() - before - 1 <= 4

        async def seal_later() -> float:
            await asyncio.sleep(3.3)
            sealed_at = time.monotonic()
            await aio.AgentGroup.from_name(group.name, client=client).seal()
            return sealed_at

        sealing = asyncio.ensure_future(seal_later())
        status = await group.wait(timeout=30)
        answered = time.monotonic()
        assert status.phase == "Succeeded"
        assert answered - await sealing < 0.5

    run_async(test)


def test_aio_list_reads_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    team = unique("apaged")
    names = [unique("ap") for _ in range(3)]
    monkeypatch.setattr(nodus._ops, "LIST_CHUNK", 2)

    async def test(client: aio.AsyncClient) -> list:
        for name in names:
            await client.create(
                "agents",
                {
                    "apiVersion": "nodus.dev/v1",
                    "kind": "Agent",
                    "metadata": {"name": name, "labels": {"paged": team}},
                    "spec": {"system": "You help.", "model": {"access": "Nodus"}},
                },
            )
        request = client._http.request

        async def recorded(**arguments: Any) -> Any:
            sent.append(dict(arguments.get("params") or {}))
            return await request(**arguments)

        monkeypatch.setattr(client._http, "request", recorded)
        return await client.list("agents", label_selector=f"paged={team}")

    sent: list = []
    listed = run_async(test)
    assert [item["metadata"]["name"] for item in listed] == names
    assert [params["limit"] for params in sent] == ["2", "2"]
    assert sent[1]["continue"]
