"""The harness of the SDK tests: a fake Anthropic Messages API over HTTP (streaming, as the
server calls it) and the real ``nodus server`` binary on a free loopback port, with the
platform key pointing at the fake. ``NODUS_BIN`` names the binary (scripts/test passes
``$CARGO_TARGET_DIR/debug/nodus``).

The fake model: a prompt that quotes commands in backticks gets a ``shell`` call of the
first one; an arithmetic question (``What is 17 + 42? …``, as ``nodus/arithmetic-v2`` asks)
gets a ``shell`` call that works it out (``echo $((17 + 42))``); a prompt asking for the
Python version gets ``python3 --version``; a tool result
is answered with ``It is <output>.``; any other prompt with ``Noted: <prompt>``. A run whose
first prompt holds ``[refuse]`` is refused (HTTP 400), so the run fails.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

TOKEN = "sdk-test-admin-token-0123456789abcdefghijklmnop"
PLATFORM_KEY = "sk-fake-platform-key-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
    return "\n".join(parts)


def _tool_result(content: Any) -> Optional[str]:
    if isinstance(content, list):
        for block in content:
            if block.get("type") == "tool_result":
                inner = block.get("content")
                return inner if isinstance(inner, str) else _text_of(inner)
    return None


def reply_for(request: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The content blocks the fake model answers ``request`` with."""
    last = request["messages"][-1]
    result = _tool_result(last.get("content"))
    if result is not None:
        match = re.search(r"stdout:\n(.*?)(?:\nstderr:|$)", result, re.S)
        output = (match.group(1) if match else result).strip()
        return [{"type": "text", "text": f"It is {output}."}]
    prompt = _text_of(last.get("content"))
    command = None
    quoted = re.findall(r"`([^`]+)`", prompt)
    arithmetic = re.match(r"What is (-?\d+) ([-+*]) (-?\d+)\?", prompt)
    if quoted:
        command = quoted[0]
    elif arithmetic:
        command = "echo $(({} {} {}))".format(*arithmetic.groups())
    elif "python version" in prompt.lower():
        command = "python3 --version"
    if command is not None:
        return [
            {
                "type": "tool_use",
                "id": f"toolu_{time.time_ns()}",
                "name": "shell",
                "input": {"command": command},
            }
        ]
    return [{"type": "text", "text": f"Noted: {prompt}"}]


class QuietHandler(BaseHTTPRequestHandler):
    """The base of the test servers here: HTTP/1.1 keep-alive, no request log, and no Nagle.

    ``BaseHTTPRequestHandler`` writes a response's head and its body in two writes; with Nagle
    on, the body waits for the client to acknowledge the head, which a client delays by up to
    40 ms on a kept-alive connection (about 44 ms a request here, measured; 0.3 ms without).
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass


class FakeAnthropic:
    """The fake Messages API; ``requests`` holds every request with its ``x-api-key``."""

    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        fake = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(
                    {"key": self.headers.get("x-api-key"), "path": self.path, "body": body}
                )
                if self.path.endswith("/count_tokens"):
                    return self._json({"input_tokens": 20})
                first = (body.get("messages") or [{}])[0].get("content")
                if "[refuse]" in _text_of(first):
                    return self._json(
                        {
                            "type": "error",
                            "error": {
                                "type": "invalid_request_error",
                                "message": "this request is refused",
                            },
                        },
                        400,
                    )
                content = reply_for(body)
                stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
                model = body.get("model", "claude-haiku-4-5")
                usage = {"input_tokens": 20, "output_tokens": 10}
                if not body.get("stream"):
                    return self._json(
                        {
                            "id": "msg_1",
                            "type": "message",
                            "role": "assistant",
                            "model": model,
                            "content": content,
                            "stop_reason": stop,
                            "usage": usage,
                        }
                    )
                events = [
                    (
                        "message_start",
                        {
                            "type": "message_start",
                            "message": {
                                "id": "msg_1",
                                "type": "message",
                                "role": "assistant",
                                "model": model,
                                "content": [],
                                "stop_reason": None,
                                "usage": {"input_tokens": 20, "output_tokens": 1},
                            },
                        },
                    )
                ]
                for index, block in enumerate(content):
                    if block["type"] == "text":
                        events.append(
                            (
                                "content_block_start",
                                {
                                    "type": "content_block_start",
                                    "index": index,
                                    "content_block": {"type": "text", "text": ""},
                                },
                            )
                        )
                        events.append(
                            (
                                "content_block_delta",
                                {
                                    "type": "content_block_delta",
                                    "index": index,
                                    "delta": {"type": "text_delta", "text": block["text"]},
                                },
                            )
                        )
                    else:
                        events.append(
                            (
                                "content_block_start",
                                {
                                    "type": "content_block_start",
                                    "index": index,
                                    "content_block": {
                                        "type": "tool_use",
                                        "id": block["id"],
                                        "name": block["name"],
                                        "input": {},
                                    },
                                },
                            )
                        )
                        events.append(
                            (
                                "content_block_delta",
                                {
                                    "type": "content_block_delta",
                                    "index": index,
                                    "delta": {
                                        "type": "input_json_delta",
                                        "partial_json": json.dumps(block["input"]),
                                    },
                                },
                            )
                        )
                    events.append(
                        ("content_block_stop", {"type": "content_block_stop", "index": index})
                    )
                events.append(
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": stop},
                            "usage": {"output_tokens": 10},
                        },
                    )
                )
                events.append(("message_stop", {"type": "message_stop"}))
                data = "".join(
                    f"event: {name}\ndata: {json.dumps(payload)}\n\n" for name, payload in events
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, value: Any, status: int = 200) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def nodus_bin() -> str:
    explicit = os.environ.get("NODUS_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR", "/var/tmp/nodus-target")
    return str(Path(target) / "debug" / "nodus")


class NodusServer:
    """A ``nodus server`` child with the fake model: by default an in-memory store and the
    unisolated sandbox."""

    def __init__(
        self,
        model_url: str,
        *,
        store: str = "memory:",
        directory: Optional[str] = None,
        sandbox: str = "unisolated",
        extra: Sequence[str] = (),
    ) -> None:
        self.dir = directory or tempfile.mkdtemp(prefix="nodus-sdk-test-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(self.dir) / f"server-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODUS_")}
        env.update({"ANTHROPIC_API_KEY": PLATFORM_KEY, "ANTHROPIC_BASE_URL": model_url})
        # The tests' webhook receivers listen on loopback, which a server refuses unless
        # allowed (a server without the option ignores it).
        env["NODUS_WEBHOOK_ALLOW"] = "127.0.0.1"
        self.process = subprocess.Popen(
            [
                nodus_bin(),
                "server",
                "--store",
                store,
                "--sandbox",
                sandbox,
                "--data-dir",
                str(Path(self.dir) / "data"),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--bootstrap-token",
                TOKEN,
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("wb"),
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nodus server did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def requests(self) -> int:
        """The server's count of answered requests (``nodus_http_requests_total``)."""
        import httpx

        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith("nodus_http_requests_total "):
                return int(line.split()[1])
        raise AssertionError("/metrics has no request count")

    def kill(self) -> None:
        """SIGKILL: the server stops at once, as in a crash."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def fake_model() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def server(fake_model: FakeAnthropic) -> Iterator[NodusServer]:
    process = NodusServer(fake_model.url)
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def connection_env(server: NodusServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test sees the test server through NODUS_SERVER / NODUS_TOKEN, no NODUS_PROJECT,
    and an empty CLI config directory; the shared default clients start afresh."""
    import nodus.aio
    import nodus.client

    for name in list(os.environ):
        if name.startswith("NODUS_") and name != "NODUS_BIN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("NODUS_SERVER", server.url)
    monkeypatch.setenv("NODUS_TOKEN", TOKEN)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(nodus.client, "_default", None)
    monkeypatch.setattr(nodus.aio, "_default", None)


class LosingProxy:
    """An HTTP proxy to ``target`` that passes each run-creating POST (…/agentruns) on to the
    server, but the first ``lose`` times drops the connection instead of returning the answer:
    the runs were created, the client never heard so. ``keys`` holds their Idempotency-Keys."""

    def __init__(self, target: str, lose: int = 1) -> None:
        import httpx

        self.keys: List[Optional[str]] = []
        self.lose = lose
        proxy = self

        class Handler(QuietHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length")
                }
                answer = httpx.request(
                    self.command, target + self.path, content=body, headers=headers
                )
                if self.command == "POST" and self.path.endswith("/agentruns"):
                    proxy.keys.append(self.headers.get("idempotency-key"))
                    if proxy.lose > 0:
                        proxy.lose -= 1
                        self.close_connection = True
                        return
                self.send_response(answer.status_code)
                self.send_header(
                    "content-type", answer.headers.get("content-type", "application/json")
                )
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WebhookReceiver:
    """A receiver of webhook deliveries on a free loopback port: ``url`` (path ``/hook``) and
    ``received``, each request's path and JSON body in order; it answers 204."""

    def __init__(self) -> None:
        self.received: List[Dict[str, Any]] = []
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                receiver.received.append(
                    {"path": self.path, "body": json.loads(self.rfile.read(length) or b"{}")}
                )
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hooks = WebhookReceiver()
    yield hooks
    hooks.close()
