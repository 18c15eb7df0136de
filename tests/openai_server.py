"""A small OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

No provider is reachable from here, so the remote path (litellm's ``openai/`` provider with
``api_base``) is exercised over real HTTP against this: scripted answers, delays, 429s and 500s,
and a log of every request it received.

    with OpenAIServer(reply=lambda body: "- a note", delay=0.5) as server:
        litellm.acompletion(model="openai/gpt-4o-mini", api_base=server.url, api_key="test", ...)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[dict[str, Any]], str]


@dataclass
class Received:
    body: dict[str, Any]
    at: float
    status: int


@dataclass
class OpenAIServer:
    """``reply(body) -> text``; ``failures``: statuses to answer before succeeding (consumed in
    order, e.g. ``[429, 500]``); ``delay``: seconds each answer takes; ``usage``: token counts
    reported per answer (litellm prices them)."""

    reply: Reply = lambda body: "- noted"
    delay: float = 0.0
    failures: list[int] = field(default_factory=list)
    fail_always: int | None = None
    usage: tuple[int, int] | None = None
    received: list[Received] = field(default_factory=list)
    api_key_seen: list[str] = field(default_factory=list)
    echo_key: bool = False  # error messages quote the Authorization header, as some servers do

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                server.api_key_seen.append(self.headers.get("Authorization", ""))
                status, payload = server._answer(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            status = self.failures.pop(0) if self.failures else (self.fail_always or 200)
            self.received.append(Received(body, time.monotonic(), status))
        if self.delay:
            time.sleep(self.delay)
        if status != 200:
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            message = f"scripted {status}"
            if self.echo_key:
                message = f"Incorrect API key provided: {self.api_key_seen[-1]}"
            return status, {"error": {"message": message, "type": kind, "code": kind}}
        text = self.reply(body)
        prompt, completion = self.usage or (sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4,
                                            len(text) // 4)
        return 200, {
            "id": f"chatcmpl-{len(self.received)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    def ok(self) -> list[Received]:
        return [r for r in self.received if r.status == 200]

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
