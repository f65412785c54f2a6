"""With `--workers`, the parent's admin listener tells every worker: a key added there
works whichever worker a connection lands on, and SIGHUP to the parent reloads them all."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

from support.live import (
    MODEL,
    fake_engines,
    free_port,
    get_json,
    gpuroute_cmd,
    http_ok,
    router_toml,
    wait_for,
)

from gpuroute.auth import key_digest

KEY = "sk-added"


def call(url: str, data: dict | None = None, method: str = "GET", key: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(url, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_parent_tells_every_worker_and_sighup_reloads_them_all(tmp_path) -> None:
    with fake_engines(("L4", 1.0)) as (engine,):
        port, admin_port = free_port(), free_port()
        text = router_toml([(engine.url, "L4")], port=port, admin_listen=f"port = {admin_port}")
        text = text.replace("admin_on_public_listener = true\n", "")
        text += f'[[auth.keys]]\nsha256 = "{key_digest("sk-file")}"\ntenant = "file"\n'
        path = tmp_path / "router.toml"
        path.write_text(text)
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path), "--workers", "2"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            admin, public = f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{port}"
            wait_for(lambda: http_ok(admin + "/readyz"), 60, "both workers ready")
            added = call(admin + "/admin/keys", {"key": KEY, "tenant": "new"}, "POST")
            assert added == 201
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            codes = {call(public + "/v1/chat/completions", body, "POST", KEY) for _ in range(12)}
            assert codes == {200}
            path.write_text(text.replace("tick_s = 0.05", 'tick_s = 0.05\npolicy = "round_robin"'))
            router.send_signal(signal.SIGHUP)
            wait_for(
                lambda: get_json(admin + "/admin/config")["policy"] == "round_robin", 10, "reload"
            )
            assert router.poll() is None
        finally:
            router.terminate()
            router.wait(30)
