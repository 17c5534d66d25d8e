"""A run's egress records through the SDK (sync and async), on a real ``nodus server`` with
process sandboxes whose egress proxy knows the test's names: the run fetches from an allowed
name and is refused another; ``run.egress()`` lists both with their verdicts and rules."""

from __future__ import annotations

import asyncio
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List

import nodus
import nodus.aio as aio
from conftest import TOKEN, FakeAnthropic, NodusServer, QuietHandler


class Hello(QuietHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_runs_egress_records_come_through_the_sdk(
    fake_model: FakeAnthropic, tmp_path: Path
) -> None:
    origin = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    port = origin.server_address[1]
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    hosts = tmp_path / "egress-hosts"
    hosts.write_text("127.0.0.1 files.test other.test\n")
    process = NodusServer(
        fake_model.url,
        sandbox="process",
        extra=["--egress-allow", "127.0.0.1", "--egress-hosts", str(hosts)],
    )
    try:
        client = nodus.Client(process.url, TOKEN, "default")
        environment: Dict[str, Any] = {
            "network": {
                "egress": "allowlist",
                "allow": [{"host": "files.test", "ports": [port]}],
            }
        }
        run = nodus.AgentRun.create(
            {"system": "You are careful.", "model": {"access": "Nodus", "families": ["haiku"]}},
            f"Run `curl -s http://files.test:{port}/a; curl -s http://other.test:{port}/b`",
            environment=environment,
            client=client,
        )
        assert run.wait(timeout=60).phase == "Succeeded"
        records = run.egress()
        assert [(r.host, r.port, r.verdict) for r in records] == [
            ("files.test", port, "allowed"),
            ("other.test", port, "refused"),
        ]
        assert records[0].address == "127.0.0.1"
        assert records[0].rule == "spec.network.allow[0]"
        assert records[0].bytes_in > len("hello") and records[0].bytes_out > 0
        assert records[1].address is None
        assert records[1].rule == "other.test is not in spec.network.allow"

        async def listed() -> List[nodus.EgressRecord]:
            async with aio.AsyncClient(process.url, TOKEN, "default") as connection:
                return await aio.AgentRun(run.name, client=connection).egress()

        assert asyncio.run(listed()) == records
    finally:
        process.stop()
        origin.shutdown()
