"""SIGTERM drains the router process: no new connections, in-flight streams complete."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess

from support.live import (
    chat_body,
    fake_engines,
    free_port,
    gpuroute_cmd,
    http_ok,
    router_toml,
    wait_for,
)


def test_sigterm_finishes_in_flight_streams_then_exits(tmp_path) -> None:
    with fake_engines(("L4", 5.0)) as (engine,):
        port = free_port()
        path = tmp_path / "router.toml"
        path.write_text("drain_timeout_s = 60\n" + router_toml([(engine.url, "L4")], port=port))
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: http_ok(url + "/readyz"), 20, "router ready")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = json.dumps(chat_body(stream=True, max_tokens=40))
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200
            received = response.read1()
            router.send_signal(signal.SIGTERM)
            # the listener closes while our stream is still being served
            wait_for(lambda: not http_ok(url + "/healthz"), 10, "listener closed")
            received += response.read()
            conn.close()
            assert received.endswith(b"data: [DONE]\n\n")
            assert received.count(b" tok") == 40
            assert router.wait(30) == 0
        finally:
            if router.poll() is None:
                router.kill()
            router.stderr.close()
