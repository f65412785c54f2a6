"""The fake engine as a process: vLLM's metric names, faults, timing from the engine model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from support.live import MODEL, FakeEngineProcess, chat_body, wait_for


def post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    values = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            key = name.split("{")[0]  # summed over label sets (finished_reason)
            values[key] = values.get(key, 0.0) + float(value)
    return values


def test_metrics_use_vllm_names_and_count_tokens() -> None:
    engine = FakeEngineProcess("A100")
    try:
        for _ in range(3):
            status, reply = post(
                engine.url + "/v1/chat/completions", chat_body("x" * 400, max_tokens=9)
            )
            assert status == 200 and reply["usage"] == {
                "prompt_tokens": 100,
                "completion_tokens": 9,
                "total_tokens": 109,
            }
        m = metrics(engine.url)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
        ):
            assert name in m
        assert m["vllm:prompt_tokens_total"] == 300
        assert m["vllm:generation_tokens_total"] == 27
        assert m["vllm:request_success_total"] == 3  # finished_reason "length", each
        assert m["vllm:num_requests_running"] == 0
    finally:
        engine.stop()


def test_faults_error_rate_slow_throttle_and_crash() -> None:
    engine = FakeEngineProcess("H100")
    try:
        status, state = post(engine.url + "/_fault", {"error_rate": 1.0, "slow": 20})
        assert status == 200 and state["slow"] == 20 and state["error_rate"] == 1.0
        status, reply = post(engine.url + "/v1/chat/completions", chat_body())
        assert status == 500 and reply["error"]["code"] == "fault_error_rate"
        assert metrics(engine.url)["gpuroute_fake_slowdown"] == 20
        status, _ = post(engine.url + "/_fault", {"clear": True, "throttle": 1.5})
        assert status == 200
        m = metrics(engine.url)
        assert m["gpuroute_fake_slowdown"] == 1.5 and m["gpuroute_fake_throttled"] == 1
        status, reply = post(engine.url + "/_fault", {"slow": -1})
        assert status == 400 and "slow" in reply["error"]["message"]
        status, reply = post(engine.url + "/_fault", {"explode": True})
        assert status == 400 and "explode" in reply["error"]["message"]
        post(engine.url + "/_fault", {"crash": True})
        wait_for(lambda: engine.proc.poll() is not None, 10, "engine to exit on crash")
        assert engine.proc.returncode == 1
    finally:
        engine.stop()


def test_requests_too_big_for_the_kv_cache_are_refused_clearly() -> None:
    engine = FakeEngineProcess("L4")
    try:
        huge = chat_body("y" * 4 * 400_000, max_tokens=4)
        status, reply = post(engine.url + "/v1/chat/completions", huge)
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
        status, reply = post(
            engine.url + "/v1/chat/completions", {"model": "other", "messages": []}
        )
        assert status == 404 and MODEL not in reply["error"]["message"]
    finally:
        engine.stop()


def test_a_client_that_hangs_up_aborts_its_request_as_in_vllm() -> None:
    """Issue 30: after a client disconnected, the fake engine kept running requests the
    router had already closed (aiohttp does not cancel a handler on its own)."""
    import socket

    engine = FakeEngineProcess("L4", time_scale=50.0)  # slow: the answer is seconds away
    try:
        for stream in (False, True):
            body = json.dumps(chat_body("x" * 4000, max_tokens=2000, stream=stream)).encode()
            with socket.create_connection(("127.0.0.1", engine.port)) as s:
                s.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                wait_for(lambda: metrics(engine.url)["vllm:num_requests_running"] == 1, 10,
                         "the request running")  # fmt: skip
            wait_for(lambda: metrics(engine.url)["vllm:num_requests_running"] == 0, 10,
                     "the request aborted")  # fmt: skip
        success = {}
        with urllib.request.urlopen(engine.url + "/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("vllm:request_success_total{"):
                    reason = line.split('finished_reason="')[1].split('"')[0]
                    success[reason] = float(line.rsplit(" ", 1)[1])
        assert success["abort"] == 2 and success["length"] == 0
    finally:
        engine.stop()
