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
