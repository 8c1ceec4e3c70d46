"""A loopback HTTP/1.1 proxy that breaks a seeded share of chat requests, for the fault soak.

    proxy = FaultProxy("http://127.0.0.1:8000", rate=0.2, seed=0)
    port = proxy.start()          # serves on 127.0.0.1:<port> from a thread of its own
    ...                           # point the agents at the port
    proxy.stop(); print(proxy.injected)

Each `POST /v1/chat/completions` is failed with probability `rate` (a seeded RNG), the kinds
taking turns in `FAULT_KINDS` order: HTTP 429 with `Retry-After`, 500, 503, a dropped
connection (closed without a reply), and three 200 replies the client cannot read: a non-UTF-8
body, an HTML page and the upstream's real JSON cut in half. Everything else (other routes,
the requests not picked) goes to the upstream unchanged. `max_faults_per_request` bounds how
often one identical request body is failed, so the soak tests recovery from transient faults and
never exhausts the client's retry budget by chance (7 tries in all: `nip_core.agents.retry`).
Plain asyncio streams, so a fault can be anything on the wire; no dependency beyond httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import threading
from collections import Counter
from http import HTTPStatus

import httpx

FAULT_KINDS = ("429", "500", "503", "drop", "non_utf8", "html", "truncated")
CHAT_PATH = "/v1/chat/completions"
RETRY_AFTER_SECONDS = "1"
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
    "upgrade", "host", "content-length", "accept-encoding", "content-encoding",
}  # fmt: skip
NON_UTF8_BODY = b'{"id": "chatcmpl-\xff\xfe\x80", "choices": []}'
HTML_BODY = b"<html><head><title>502 Bad Gateway</title></head><body>bad gateway</body></html>"
ERROR_BODY = b'{"error": {"message": "injected fault", "type": "server_error"}}'

Request = tuple[str, str, list[tuple[str, str]], bytes]
Reply = tuple[int, list[tuple[str, str]], bytes]


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """(method, target, headers, body) of the next request, or None at a clean end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if line]
    names = {name.lower(): value for name, value in headers}
    if names.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await reader.readexactly(int(names.get("content-length", "0")))
    return method, target, headers, body  # type: ignore[return-value]


def encode_reply(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
    lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class FaultProxy:
    """See the module doc. `injected` counts faults per kind, `forwarded` requests passed on."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float,
        seed: int = 0,
        kinds: tuple[str, ...] = FAULT_KINDS,
        max_faults_per_request: int = 3,
    ) -> None:
        if not 0.0 <= rate <= 1.0 or not kinds or set(kinds) - set(FAULT_KINDS):
            raise ValueError(f"rate must be in [0, 1] and kinds among {FAULT_KINDS}")
        self.upstream, self.rate, self.kinds = upstream.rstrip("/"), rate, kinds
        self.max_faults_per_request = max_faults_per_request
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self.chat_requests = 0
        self._turn = 0
        self._per_body: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve from a background thread; returns the port."""
        ready: list[int] = []
        started = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main(host, port, ready, started)), daemon=True
        )
        self._thread.start()
        if not started.wait(30) or not ready:
            raise RuntimeError("the fault proxy did not start")
        return ready[0]

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(30)

    async def _main(self, host: str, port: int, ready: list, started: threading.Event) -> None:
        self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with httpx.AsyncClient(base_url=self.upstream, timeout=None) as http:
                server = await asyncio.start_server(
                    lambda r, w: self._connection(r, w, http), host, port
                )
                ready.append(server.sockets[0].getsockname()[1])
                started.set()
                async with server:
                    await self._stopped.wait()
        finally:
            started.set()

    # ------------------------------------------------------------------ requests

    def fault_for(self, method: str, target: str, body: bytes) -> str | None:
        """The fault to inject into this request, or None to forward it."""
        if method != "POST" or target.split("?", 1)[0] != CHAT_PATH:
            return None
        self.chat_requests += 1
        digest = hashlib.sha256(body).hexdigest()
        if self.rng.random() >= self.rate or self._per_body[digest] >= self.max_faults_per_request:
            return None
        self._per_body[digest] += 1
        kind = self.kinds[self._turn % len(self.kinds)]
        self._turn += 1
        self.injected[kind] += 1
        return kind

    async def _connection(self, reader, writer, http: httpx.AsyncClient) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                method, target, headers, body = request
                kind = self.fault_for(method, target, body)
                if kind == "drop":
                    return  # close without a reply
                status, reply_headers, payload = await self._reply(kind, request, http)
                writer.write(encode_reply(status, reply_headers, payload))
                await writer.drain()
                if any(k.lower() == "connection" and v.lower() == "close" for k, v in headers):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _reply(self, kind: str | None, request: Request, http: httpx.AsyncClient) -> Reply:
        json_type = [("content-type", "application/json")]
        if kind == "429":
            return 429, [*json_type, ("retry-after", RETRY_AFTER_SECONDS)], ERROR_BODY
        if kind in ("500", "503"):
            return int(kind), json_type, ERROR_BODY
        if kind == "non_utf8":
            return 200, json_type, NON_UTF8_BODY
        if kind == "html":
            return 200, [("content-type", "text/html")], HTML_BODY
        status, headers, body = await self._forward(request, http)
        if kind == "truncated":
            return status, headers, body[: len(body) // 2]
        return status, headers, body

    async def _forward(self, request: Request, http: httpx.AsyncClient) -> Reply:
        method, target, headers, body = request
        sent = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        try:
            response = await http.request(method, target, headers=sent, content=body)
        except httpx.HTTPError as error:  # the upstream itself failed: say so, like a gateway
            return 502, [("content-type", "text/plain")], repr(error).encode()
        self.forwarded += 1
        return response.status_code, response.headers.multi_items(), response.content
