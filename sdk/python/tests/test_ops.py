"""The SDK's operations as data: the requests an operation makes, checked without a server."""

from __future__ import annotations

import nodus
from conftest import TOKEN

UNUSED = "http://127.0.0.1:9"


def test_a_template_s_group_and_run_go_in_the_creating_client_s_project() -> None:
    owner = nodus.Client(server=UNUSED, token=TOKEN, project="default")
    creator = nodus.Client(server=UNUSED, token=TOKEN, project="team-b")
    template = nodus.ClaudeAgent.from_name("claude-assistant", project="nodus", client=owner)

    group = nodus.AgentGroup._create("g", template, creator, None, "5", None, None, None)
    request = next(group)
    assert (request.method, request.path) == (
        "POST",
        "/apis/nodus.dev/v1/projects/team-b/agentgroups",
    )
    assert request.body["spec"]["agent"] == "nodus/claude-assistant"

    run = nodus.AgentRun._create(
        template,
        "hi",
        creator,
        name="r",
        environment=None,
        context=None,
        post_run_action=None,
        keep_alive=False,
        deadline=None,
        timeout=None,
        image=None,
        project=None,
    )
    request = next(run)
    assert (request.method, request.path) == (
        "POST",
        "/apis/nodus.dev/v1/projects/team-b/agentruns",
    )
    assert request.body["spec"]["agent"] == "nodus/claude-assistant"


def test_a_list_follows_continue_until_the_server_says_no_more() -> None:
    client = nodus.Client(server=UNUSED, token=TOKEN, project="default")
    op = client._list("agents", "status.state=Ready", "team=red", None)

    def page(names: list, token: object) -> dict:
        metadata = {"resourceVersion": "v"}
        if token is not None:
            metadata["continue"] = token
        return {"items": [{"metadata": {"name": n}} for n in names], "metadata": metadata}

    first = next(op)
    assert (first.method, first.path) == ("GET", "/apis/nodus.dev/v1/projects/default/agents")
    assert first.params == {
        "limit": "500",
        "fieldSelector": "status.state=Ready",
        "labelSelector": "team=red",
    }
    second = op.send(page(["a", "b"], "t1"))
    assert second.params == {**first.params, "continue": "t1"}
    third = op.send(page(["c"], "t2"))
    assert third.params == {**first.params, "continue": "t2"}
    try:
        op.send(page(["d"], None))
    except StopIteration as done:
        assert [item["metadata"]["name"] for item in done.value] == ["a", "b", "c", "d"]
    else:
        raise AssertionError("the list went on after the last page")


def test_a_server_that_answers_whole_lists_is_read_once() -> None:
    client = nodus.Client(server=UNUSED, token=TOKEN, project="default")
    op = client._list("agentruns", None, None, "team-b")
    first = next(op)
    assert first.path == "/apis/nodus.dev/v1/projects/team-b/agentruns"
    assert first.params == {"limit": "500"}
    try:
        op.send({"items": [{"metadata": {"name": "only"}}], "metadata": {}})
    except StopIteration as done:
        assert [item["metadata"]["name"] for item in done.value] == ["only"]
    else:
        raise AssertionError("a list without continue asked again")
