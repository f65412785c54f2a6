"""The fake engine against a real vLLM: what the router, the agent and clients depend on
must be the same in both (endpoints, answer shapes, SSE framing and final chunks, usage,
error bodies, metric names, types and label sets). Values differ (the fake's text is
" tok" tokens, its model a roofline); shapes must not. Differences accepted on purpose: an
error's `type` and `code` strings (vLLM: "BadRequestError", 400; the fake: OpenAI's
"invalid_request_error", null) and `param` spellings other than model and max_tokens."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from gpuroute.agent.engine_metrics import ENGINE_METRIC_NAMES
from prometheus_client.parser import text_string_to_metric_families
from support.live import MODEL, FakeEngineProcess
from support.real_engine import SERVED

pytestmark = pytest.mark.real_engine
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def engines(vllm):
    fake = FakeEngineProcess("L4")
    try:
        yield {"fake": (fake.url, MODEL), "vllm": (vllm.url, SERVED)}
    finally:
        fake.stop()


def call(url: str, path: str, body: dict | bytes | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, or of a POST when `body` is given."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


def both(engines, path: str, make_body=None) -> dict[str, tuple[int, str, bytes]]:
    return {
        name: call(url, path, make_body(model) if make_body else None)
        for name, (url, model) in engines.items()
    }


def skeleton(value, depth: int = 0):
    """The keys and JSON types of a document (lists by their first item)."""
    if isinstance(value, dict):
        return {k: skeleton(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(value[0], depth + 1)] if value else []
    return type(value).__name__ if value is not None else None


def missing(fake, real, path: str = "") -> list[str]:
    """Keys the real document has (with a non-null value) that the fake lacks or types
    differently: what a client reading vLLM's answers could trip on in the fake."""
    if isinstance(real, dict):
        if not isinstance(fake, dict):
            return [f"{path}: {type(fake).__name__} instead of an object"]
        out = []
        for key, value in real.items():
            if value is None:
                continue  # vLLM's optional extras (prompt_logprobs, kv_transfer_params, ...)
            if key not in fake:
                out.append(f"{path}.{key}")
            else:
                out += missing(fake[key], value, f"{path}.{key}")
        return out
    if isinstance(real, list) and real:
        return missing(fake[0], real[0], path + "[0]") if fake else [f"{path}: empty"]
    if real in ("float", "int") and fake in ("float", "int"):
        return []
    return [] if fake == real else [f"{path}: {fake} instead of {real}"]


def test_health_and_models_answer_alike(engines) -> None:
    health = both(engines, "/health")
    assert {name: r[0] for name, r in health.items()} == {"fake": 200, "vllm": 200}
    models = {name: json.loads(r[2]) for name, r in both(engines, "/v1/models").items()}
    assert missing(skeleton(models["fake"]), skeleton(models["vllm"])) == [
        ".data[0].permission"  # vLLM's legacy permission list: nothing here reads it
    ]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_answers_and_usage_have_vllms_shape(engines, kind) -> None:
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"

    def body(model: str) -> dict:
        prompt = (
            {"messages": [{"role": "user", "content": "hi"}]}
            if kind == "chat"
            else {"prompt": "hi"}
        )
        return {"model": model, "max_tokens": 5, "ignore_eos": True, **prompt}

    answers = {name: json.loads(r[2]) for name, r in both(engines, path, body).items()}
    assert missing(skeleton(answers["fake"]), skeleton(answers["vllm"])) == []
    for answer in answers.values():
        usage = answer["usage"]
        assert usage["completion_tokens"] == 5
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert answer["choices"][0]["finish_reason"] == "length"


def event_kinds(body: bytes) -> list[str]:
    """Each SSE event as what it carries, runs of content collapsed: the framing a relay
    and a client depend on."""
    assert body.endswith(b"\n\n"), "the stream does not end with a blank line"
    kinds: list[str] = []
    for event in body.decode().split("\n\n")[:-1]:
        assert event.startswith("data: "), f"not an SSE data event: {event[:80]!r}"
        payload = event.removeprefix("data: ")
        if payload == "[DONE]":
            kinds.append("done")
            continue
        chunk = json.loads(payload)
        if not chunk["choices"]:
            kinds.append("usage" if chunk.get("usage") else "empty")
            continue
        choice = chunk["choices"][0]
        delta = choice.get("delta", {})
        if choice.get("finish_reason"):
            kind = "finish"
        elif delta.get("role"):
            kind = "role"
        else:
            kind = "content"
        if not (kind == "content" and kinds and kinds[-1] == "content"):
            kinds.append(kind)
    return kinds


@pytest.mark.parametrize("usage", [False, True])
def test_streams_are_framed_alike(engines, usage) -> None:
    def body(model: str) -> dict:
        b = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
             "stream": True, "ignore_eos": True}  # fmt: skip
        if usage:
            b["stream_options"] = {"include_usage": True}
        return b

    streams = both(engines, "/v1/chat/completions", body)
    for name, (status, content_type, _) in streams.items():
        assert status == 200 and content_type.startswith("text/event-stream"), name
    kinds = {name: event_kinds(r[2]) for name, r in streams.items()}
    expected = ["role", "content", "finish", *(["usage"] if usage else []), "done"]
    assert kinds == {"fake": expected, "vllm": expected}


ERROR_CASES = {
    "unknown model": (lambda m: {"model": "no-such-model", "messages": []}, 404, "model"),
    "messages not a list": (lambda m: {"model": m, "messages": "hi"}, 400, None),
    "body not JSON": (lambda m: b"{not json", 400, None),
    "max_tokens beyond the context": (
        lambda m: {
            "model": m,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10_000_000,
        },
        400,
        "max_tokens",
    ),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_have_the_same_status_and_body(engines, case) -> None:
    make, status, param = ERROR_CASES[case]
    answers = both(engines, "/v1/chat/completions", make)
    for name, (code, content_type, raw) in answers.items():
        assert code == status, (name, raw[:300])
        assert content_type.startswith("application/json"), name
        error = json.loads(raw)["error"]
        assert set(error) == ERROR_KEYS and error["message"], (name, error)
        if param is not None:
            assert error["param"] == param, (name, error)


def families(url: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Each metric family's type and label names."""
    _, _, raw = call(url, "/metrics")
    out = {}
    for family in text_string_to_metric_families(raw.decode()):
        labels = frozenset(k for s in family.samples for k in s.labels)
        out[family.name] = (family.type, labels)
    return out


def test_metrics_share_vllms_names_types_and_labels(engines) -> None:
    fake, real = families(engines["fake"][0]), families(engines["vllm"][0])
    vllm_families = {n for n in fake if n.startswith("vllm:")}
    wrong = {
        name: (fake[name], real.get(name))
        for name in vllm_families
        if real.get(name) is None
        or real[name][0] != fake[name][0]
        or not fake[name][1] <= real[name][1]
    }
    assert wrong == {}, "the fake exports these unlike vLLM: (fake, vLLM)"
    # every name the agent reads first for a vLLM engine is in both
    for fields in ENGINE_METRIC_NAMES["vllm"].values():
        family = fields[0].removesuffix("_total")
        assert family in fake and family in real, family
