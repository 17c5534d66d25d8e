"""Clients generated from the served ``/openapi.json``, as a team that does not write Python
(or writes it without this SDK) makes them: ``openapi-python-client`` and
``openapi-typescript`` must take every operation but the log stream, and the generated Python
client must carry a walkthrough against the real server (an agent and a run, the run waited
for, its steps and answer read, a list paged).

``openapi-python-client`` is installed beside the SDK (scripts/test); ``openapi-typescript``
is an npm package whose command ``OPENAPI_TYPESCRIPT`` names (scripts/test installs it).
Without either the test fails and says so.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Set, Tuple

import httpx
import pytest
from conftest import TOKEN, NodusServer

# The only operation a generator may leave out: the run's output as a stream of JSON lines
# (no generator reads line streams; the SDK's `logs(follow=True)` does).
STREAMS = {("GET", "/apis/nodus.dev/v1/projects/{project}/agentruns/{name}/logs")}


def dropped(output: str) -> Set[Tuple[str, str]]:
    """The operations openapi-python-client warned about (``WARNING parsing GET /path``)."""
    return set(re.findall(r"WARNING parsing (\w+) (\S+)", output))


@pytest.fixture(scope="module")
def document(server: NodusServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("openapi") / "openapi.json"
    answer = httpx.get(f"{server.url}/openapi.json")
    answer.raise_for_status()
    path.write_text(answer.text)
    return path


@pytest.fixture(scope="module")
def generated(document: Path) -> Iterator[Any]:
    generator = shutil.which("openapi-python-client", path=os.path.dirname(sys.executable))
    assert generator, "openapi-python-client is not installed beside the tests' Python"
    out = document.parent / "python"
    done = subprocess.run(
        [generator, "generate", "--path", str(document), "--output-path", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert dropped(output) <= STREAMS, output
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("nodus_client")
    finally:
        sys.path.remove(str(out))


def test_openapi_typescript_takes_the_document(document: Path) -> None:
    command = os.environ.get("OPENAPI_TYPESCRIPT")
    assert command, "OPENAPI_TYPESCRIPT names no openapi-typescript command"
    out = document.parent / "schema.d.ts"
    done = subprocess.run(
        [command, str(document), "-o", str(out)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    types = out.read_text()
    # Each kind's operations are typed with the kind's schema.
    for operation in ["listAgentRuns", "createAgentRun", "readAgentRunSteps", "cancelAgentGroup"]:
        assert f"    {operation}: {{" in types, operation
    assert "AgentRunList: {" in types


def test_the_generated_python_client_walks_through_a_run(generated: Any) -> None:
    client_module = importlib.import_module("nodus_client.client")
    agents = importlib.import_module("nodus_client.api.agent")
    runs = importlib.import_module("nodus_client.api.agent_run")
    models = importlib.import_module("nodus_client.models")
    for name in ["create_agent", "read_agent"]:
        importlib.import_module(f"nodus_client.api.agent.{name}")
    for name in [
        "create_agent_run",
        "read_agent_run",
        "read_agent_run_steps",
        "read_agent_run_answer",
        "list_agent_runs",
    ]:
        importlib.import_module(f"nodus_client.api.agent_run.{name}")
    client = client_module.AuthenticatedClient(
        base_url=os.environ["NODUS_SERVER"], token=TOKEN, raise_on_unexpected_status=True
    )
    project = "default"
    suffix = str(time.monotonic_ns())
    agent = models.Agent.from_dict(
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": {"name": f"gen-{suffix}"},
            "spec": {"system": "Run what you are asked to."},
        }
    )
    created = agents.create_agent.sync(project, client=client, body=agent)
    assert isinstance(created, models.Agent), created
    assert created.to_dict()["metadata"]["name"] == f"gen-{suffix}"

    names = [f"gen-{suffix}-{i}" for i in range(3)]
    for name in names:
        run = models.AgentRun.from_dict(
            {
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name, "labels": {"walk": suffix}},
                "spec": {"agent": f"gen-{suffix}", "input": "Please run `echo generated`."},
            }
        )
        answer = runs.create_agent_run.sync(project, client=client, body=run)
        assert isinstance(answer, models.AgentRun), answer

    deadline = time.monotonic() + 60
    while True:
        read = runs.read_agent_run.sync(project, names[0], client=client)
        assert isinstance(read, models.AgentRun), read
        phase = read.to_dict().get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed", "Cancelled"):
            break
        assert time.monotonic() < deadline, read.to_dict()
        time.sleep(0.1)
    assert phase == "Succeeded", read.to_dict()

    steps = runs.read_agent_run_steps.sync(project, names[0], client=client)
    assert isinstance(steps, models.StepList), steps
    listed = json.dumps(steps.to_dict())
    assert "echo generated" in listed, listed
    answer = runs.read_agent_run_answer.sync(project, names[0], client=client)
    assert isinstance(answer, models.Answer), answer
    assert answer.to_dict()["answer"] == "It is generated.", answer.to_dict()

    seen = []
    token = None
    while True:
        page = runs.list_agent_runs.sync(
            project,
            client=client,
            label_selector=f"walk={suffix}",
            limit=1,
            **({"continue_": token} if token else {}),
        )
        assert isinstance(page, models.AgentRunList), page
        seen += [item.to_dict()["metadata"]["name"] for item in page.items]
        token = page.to_dict().get("metadata", {}).get("continue")
        if not token:
            break
    assert seen == names
