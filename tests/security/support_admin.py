"""What a web page in a browser on the tier's own host can send to a tokenless admin
listener (issue 42 item 2), as raw requests: a cross-site form or `no-cors` fetch (a
foreign `Origin`, a `text/plain` body, a loopback `Host`), the same page's requests after
its name was rebound to 127.0.0.1 (a foreign `Host`; an `Origin` on writes, none on a
same-origin GET), and a simple request from a client that sends no `Origin` at all."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import aiohttp
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import GlobalApp, GlobalServer
from support.live import MODEL, free_port
from support.paths import REPO

from gpuroute.proto import load_pb2

EVIL = "evil.example"


@dataclass(frozen=True)
class Attack:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None
    status: int  # what the guard answers
    code: str  # the OpenAI-format error code naming why

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.headers}"


def page_attacks(port: int, writes: list[tuple[str, str, bytes]], reads: list[str]) -> list[Attack]:
    """Each write (method, path, JSON body) and each read as a page would try it against
    the admin listener on `port`."""
    rebound = f"{EVIL}:{port}"  # the Host a rebound name sends
    attacks = []
    for method, path, body in writes:
        attacks += [
            Attack(method, path, {"Content-Type": "text/plain", "Origin": f"http://{EVIL}"},
                   body, 403, "cross_origin_refused"),  # a cross-site form, or no-cors fetch
            Attack(method, path, {"Content-Type": "application/json", "Host": rebound,
                                  "Origin": f"http://{rebound}"},
                   body, 403, "cross_origin_refused"),  # same-origin once rebound
            Attack(method, path, {"Content-Type": "application/json", "Host": rebound},
                   body, 403, "host_not_loopback"),  # a client that sends no Origin
            Attack(method, path, {"Content-Type": "text/plain"}, body, 415, "json_required"),
        ]  # fmt: skip
    for path in reads:
        attacks += [
            Attack("GET", path, {"Host": rebound}, None, 403, "host_not_loopback"),
            Attack("GET", path, {"Origin": f"http://{EVIL}"}, None, 403, "cross_origin_refused"),
        ]
    return attacks


async def unrefused(base: str, attacks: list[Attack]) -> list[str]:
    """The attacks the listener at `base` did not refuse as expected (status and code),
    each with what it answered."""
    wrong = []
    async with aiohttp.ClientSession() as s:
        for a in attacks:
            async with s.request(a.method, base + a.path, headers=a.headers, data=a.body) as r:
                text = await r.text()
                if (r.status, error_code(text)) != (a.status, a.code):
                    wrong.append(f"{a}: {r.status} {text[:120]}")
    return wrong


def error_code(text: str) -> str | None:
    """The `code` of an OpenAI-format error body, if it is one."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


@contextlib.asynccontextmanager
async def global_admin_apart(tmp_path):
    """The global tier as shipped: its admin routes on a listener of their own, on
    loopback, without a token; yields that listener's URL."""
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        'regions_file = "regions.toml"\n[listen]\nport = 0\n[admin_listen]\nport = 0\n'
        '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:9"\n'
        f'report = "127.0.0.1:{free_port()}"\n'
    )
    app = GlobalApp(*load_global_config(tmp_path / "global.toml"))
    server = GlobalServer(app)
    await server.start()
    app.feeds.on_report("eu-west", load_pb2.RegionReport(models=[MODEL], timestamp=time.time()))
    try:
        yield f"http://127.0.0.1:{server.admin_port}", server.admin_port
    finally:
        await server.drain(timeout=2.0)
