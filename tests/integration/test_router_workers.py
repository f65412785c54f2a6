"""`gpuroute router --workers 2`: two processes on one port, one shared view of
outstanding work, one admin listener, a dead worker restarted, and SIGTERM draining all."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support.live import (
    MODEL,
    ROUTER_ON_LOOPBACK,
    chat_body,
    fake_engines,
    free_port,
    gpuroute_cmd,
    http_ok,
    router_toml,
    wait_for,
)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _samples(admin: str, name: str) -> dict[tuple, float]:
    with urllib.request.urlopen(admin + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _served_by_worker(admin: str) -> dict[str, float]:
    served: dict[str, float] = {}
    for labels, value in _samples(admin, "gpuroute_requests_total").items():
        worker = dict(labels)["worker"]
        served[worker] = served.get(worker, 0) + value
    return served


def _open_stream(port: int, max_tokens: int) -> tuple[http.client.HTTPConnection, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps(chat_body(stream=True, max_tokens=max_tokens))
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    return conn, response


def _start(tmp_path, engine_url: str) -> tuple[subprocess.Popen, int, str]:
    port, admin_port = free_port(), free_port()
    config = router_toml([(engine_url, "L4")], port=port, admin_listen=f"port = {admin_port}")
    config = "drain_timeout_s = 60\n" + config.replace(ROUTER_ON_LOOPBACK, "")
    path = tmp_path / "router.toml"
    path.write_text(config)
    with (tmp_path / "router.log").open("wb") as log:  # never a pipe nobody reads
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path), "--workers", "2"),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    admin = f"http://127.0.0.1:{admin_port}"
    wait_for(lambda: http_ok(admin + "/readyz"), 60, "both workers ready")
    return router, port, admin


def test_two_workers_share_a_port_their_load_and_one_admin_listener(tmp_path) -> None:
    with fake_engines(("L4", 5.0)) as (engine,), ExitStack() as streams:
        router, port, admin = _start(tmp_path, engine.url)
        try:
            assert _get_json(admin + "/readyz")["workers"] == 2
            # new connections until the kernel has handed some to each worker (bounded)
            for _ in range(200):
                _open_stream(port, 1)[0].close()
                if len(_served_by_worker(admin)) == 2:
                    break
            assert set(_served_by_worker(admin)) == {"0", "1"}
            # long streams held open: each worker sees the other's booked work as shared
            held = [_open_stream(port, 200) for _ in range(12)]
            for conn, _response in held:
                streams.callback(conn.close)

            def each_sees_the_other() -> bool:
                views = _get_json(admin + "/admin/backends")["workers"]
                own = [v["backends"][0]["outstanding_s"] for v in views]
                shared = [v["backends"][0]["shared_s"] for v in views]
                return all(own) and all(s > 0 for s in shared)

            wait_for(each_sees_the_other, 10, "both workers booking and seeing each other's work")
            merged = _get_json(admin + "/admin/backends")["backends"][0]
            assert merged["in_flight"] == len(held)
            # the parent passes a prediction's query on to the workers
            asked = _get_json(admin + "/admin/backends?prompt_tokens=300")
            assert asked["predicted_for"]["output_tokens"] == 128
            assert all(w["backends"][0]["predicted"]["ttft_s"] > 0 for w in asked["workers"])
            assert _samples(admin, "gpuroute_workers_up")[()] == 2
            # the pools' sizes: one worker answers for all (they size on the shared rate)
            sizes = _get_json(admin + "/admin/autoscale")
            assert sizes["interval_s"] == 15.0 and set(sizes["pools"]) == {MODEL}
            assert set(sizes["pools"][MODEL]) == {
                "desired_backends", "desired_standby_backends", "in_rotation", "standby",
                "rate_rps", "forecast_rps", "utilisation", "capacity_rps", "reason",
            }  # fmt: skip
            desired = _samples(admin, "gpuroute_pool_desired_backends")
            assert {dict(labels)["worker"] for labels in desired} == {"0", "1"}
        finally:
            router.send_signal(signal.SIGTERM)
            assert router.wait(90) == 0
        # SIGTERM drained both workers: every held stream ran to its end
        for _conn, response in held:
            assert response.read().endswith(b"data: [DONE]\n\n")


def test_a_killed_worker_is_restarted_and_workers_die_with_their_parent(tmp_path) -> None:
    with fake_engines(("L4", 0.01)) as (engine,):
        router, _port, admin = _start(tmp_path, engine.url)
        try:
            children = _children(router.pid)
            assert len(children) == 2
            os.kill(children[0], signal.SIGKILL)
            wait_for(lambda: not http_ok(admin + "/readyz"), 10, "the parent sees it gone")
            wait_for(lambda: http_ok(admin + "/readyz"), 60, "the worker restarted")
            restarts = _samples(admin, "gpuroute_worker_restarts_total")
            assert sum(restarts.values()) == 1
            workers = _children(router.pid)
            router.kill()  # no drain, no cleanup: the workers must not serve on unsupervised
            router.wait(10)
            wait_for(lambda: not any(_alive(pid) for pid in workers), 60, "orphans exited")
        finally:
            if router.poll() is None:
                router.kill()
                router.wait(10)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status  # a zombie has exited


def test_a_port_in_use_or_a_bad_worker_count_is_one_clear_line(tmp_path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "router.toml"
        text = router_toml([("http://127.0.0.1:9", "L4")], port=port, admin_listen="port = 0")
        path.write_text(text.replace(ROUTER_ON_LOOPBACK, ""))
        for workers, code, message in (("2", 1, "Address already in use"), ("0", 2, "1 to 256")):
            done = subprocess.run(
                gpuroute_cmd("router", "--config", str(path), "--workers", workers),
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == code
            assert message in done.stdout + done.stderr
            assert "Traceback" not in done.stderr
