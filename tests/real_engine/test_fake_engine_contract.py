"""The fake engine against a real vLLM: what the router, the agent and clients depend on
must be the same in both (endpoints, answer shapes, SSE framing and final chunks, usage,
error bodies, metric names, types and label sets). Values differ (the fake's text is
" tok" tokens, its model a roofline); shapes must not. Differences accepted on purpose: an
error's `type` and `code` strings (vLLM: "BadRequestError", 400; the fake: OpenAI's
"invalid_request_error", null; in Anthropic's format vLLM's "NotFoundError", the fake's
Anthropic "not_found_error") and `param` spellings other than model, max_tokens,
max_output_tokens and response_id (vLLM: "body.input"; the fake: "input").

Every API issue 33 names is here: chat, completions, Responses (with its stored state),
Anthropic Messages and count_tokens, and tokenize/detokenize are compared live. Rerank,
score, pooling, classify and audio are not served by a real vLLM whose model is the
testbed's tiny Llama (vLLM registers them only for a pooling or a speech model, and none
can be had offline): it answers each 404, which the tests assert, and the fake's answers
on those routes are held to vLLM's own pydantic models instead (support/vllm_schemas.py)."""

from __future__ import annotations

import json
import os
import struct
import time
import urllib.error
import urllib.request
import uuid

import pytest
from gpuroute.agent.engine_metrics import ENGINE_METRIC_NAMES
from gpuroute.testbed.fake_engine.responses import STORE_ENV
from gpuroute.testbed.real_vllm import engine_samples
from prometheus_client.parser import text_string_to_metric_families
from support.fake_engine_app import sse_events
from support.live import MODEL, FakeEngineProcess
from support.real_engine import SERVED
from support.vllm_schemas import check_with_vllm

pytestmark = pytest.mark.real_engine
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module", autouse=True)
def responses_store():
    """Both engines keep responses: vLLM only when started with this variable set, and
    the fake reads the same one (both inherit it from this process)."""
    before = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = "1"
    yield
    if before is None:
        os.environ.pop(STORE_ENV, None)
    else:
        os.environ[STORE_ENV] = before


@pytest.fixture(scope="module")
def engines(responses_store, vllm):
    fake = FakeEngineProcess("L4")
    try:
        yield {"fake": (fake.url, MODEL), "vllm": (vllm.url, SERVED)}
    finally:
        fake.stop()


def call(
    url: str,
    path: str,
    body: dict | bytes | None = None,
    content_type: str = "application/json",
    timeout: float = 30,
) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, or of a POST when `body` is given."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
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


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_streamed_token_ids_come_where_vllm_puts_them(engines, route) -> None:
    """`return_token_ids` (what a continuation is made from): the prompt's ids once, in the
    first event (chat: on the chunk; completions: on its choice), as many as its prompt
    tokens; every token's id on its choice (chat: a chunk even for a token without text).
    `return_prompt_text`: chat's first chunk only."""

    def body(model: str) -> dict:
        b = {"model": model, "max_tokens": 6, "stream": True, "ignore_eos": True,
             "return_token_ids": True, "return_prompt_text": True,
             "stream_options": {"include_usage": True}}  # fmt: skip
        chat = {"messages": [{"role": "user", "content": "hi there"}]}
        return b | (chat if route == "/v1/chat/completions" else {"prompt": "hi there"})

    for name, (status, _, raw) in both(engines, route, body).items():
        chunks = [d for _, d in sse_events(raw.decode()) if isinstance(d, dict)]
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        holders = chunks if route == "/v1/chat/completions" else choices
        prompt_ids = [h.get("prompt_token_ids") for h in holders]
        assert status == 200 and isinstance(prompt_ids[0], list), name
        assert not any(prompt_ids[1:]), name  # once
        assert len(prompt_ids[0]) == chunks[-1]["usage"]["prompt_tokens"], name
        ids = [t for c in choices for t in c.get("token_ids") or []]
        assert len(ids) == 6 and all(isinstance(t, int) for t in ids), name
        texts = [c.get("prompt_text") for c in chunks]  # chat's rendered prompt, once
        chat = route == "/v1/chat/completions"
        assert isinstance(texts[0], str) == chat and not any(texts[1:]), (name, texts)


def shown(document: dict) -> list[str]:
    """A document's keys with a value, in the order it sent them."""
    return [k for k, v in document.items() if v is not None]


def in_common(order: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each engine's order of the keys both sent."""
    common = set(order["fake"]) & set(order["vllm"])
    return {name: [k for k in keys if k in common] for name, keys in order.items()}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_whole_answers_carry_vllms_extras_in_its_order(engines, route) -> None:
    """`return_token_ids`, `prompt_logprobs` and `return_prompt_text` on a whole answer (issue
    42): the same fields as vLLM's, in its order around `usage` (a chat answer's prompt
    extras come after it, which is why usage is read from the whole answer), as many prompt
    ids and logprobs as prompt tokens, the answer's ids on its choice."""
    chat = route == "/v1/chat/completions"

    def body(model: str) -> dict:
        prompt = {"messages": [{"role": "user", "content": "hi there " * 40}]} if chat else {
            "prompt": "hi there " * 40}  # fmt: skip
        return {"model": model, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True,
                "prompt_logprobs": 1, "return_prompt_text": True, **prompt}  # fmt: skip

    url, model = engines["vllm"]
    call(url, route, body(model), timeout=300)  # vLLM's first prompt_logprobs: ~20 s on a CPU
    order, choice_order, answers = {}, {}, {}
    for name, (status, _, raw) in both(engines, route, body).items():
        assert status == 200, (name, raw[:300])
        answer = answers[name] = json.loads(raw)
        order[name], choice_order[name] = shown(answer), shown(answer["choices"][0])
        holder = answer if chat else answer["choices"][0]
        prompt = answer["usage"]["prompt_tokens"]
        assert len(holder["prompt_token_ids"]) == prompt, name
        assert len(holder["prompt_logprobs"]) == prompt and holder["prompt_logprobs"][0] is None
        assert len(answer["choices"][0]["token_ids"]) == 4, name
    assert missing(skeleton(answers["fake"]), skeleton(answers["vllm"])) == []
    assert set(order["vllm"]) <= set(order["fake"]) | {"service_tier", "kv_transfer_params"}
    assert in_common(order)["fake"] == in_common(order)["vllm"], order
    assert in_common(choice_order)["fake"] == in_common(choice_order)["vllm"], choice_order
    if chat:  # the fields that hid usage from a 1 KB tail: after it, in vLLM's answer
        assert order["vllm"].index("prompt_token_ids") > order["vllm"].index("usage")


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


# -- the Responses API, with its stored state ---------------------------------------------
RESPONSE_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.content_part.added", "response.output_text.delta", "response.output_text.done",
    "response.content_part.done", "response.output_item.done", "response.completed",
]  # fmt: skip
HI = [{"role": "user", "content": "hi"}]
MESSAGE_EVENTS = ["message_start", "content_block_start", "content_block_delta",
                  "content_block_stop", "message_delta", "message_stop"]  # fmt: skip


def response_body(model: str, **extra) -> dict:
    return {"model": model, "input": "hi", "max_output_tokens": 5, "ignore_eos": True} | extra


def message_body(model: str, **extra) -> dict:
    return {
        "model": model,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    } | extra


def answers(engines, path: str, make_body) -> dict[str, dict]:
    """Each engine's JSON answer to the same request, which must succeed."""
    out = {}
    for name, (status, _, raw) in both(engines, path, make_body).items():
        assert status == 200, (name, path, raw[:300])
        out[name] = json.loads(raw)
    return out


def collapsed(names: list) -> list:
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def streamed(engines, path: str, make_body) -> dict[str, list[tuple[str, dict]]]:
    """Each engine's SSE events (`event:` name, data) for the same streamed request."""
    out = {}
    for name, (status, content_type, raw) in both(engines, path, make_body).items():
        assert status == 200 and content_type.startswith("text/event-stream"), (name, raw[:300])
        events = sse_events(raw.decode())
        assert all(n == data["type"] for n, data in events), name  # event: names its data
        out[name] = events
    return out


def same_event_shapes(events: dict[str, list[tuple[str, dict]]]) -> None:
    """The first event of each kind has vLLM's keys in the fake's stream."""
    firsts = {name: {} for name in events}
    for name, stream in events.items():
        for kind, data in stream:
            firsts[name].setdefault(kind, data)
    for kind, real in firsts["vllm"].items():
        assert missing(skeleton(firsts["fake"][kind]), skeleton(real)) == [], kind


def test_responses_have_vllms_shape_status_and_usage(engines) -> None:
    first = answers(engines, "/v1/responses", response_body)
    assert missing(skeleton(first["fake"]), skeleton(first["vllm"])) == []
    for answer in first.values():
        assert answer["object"] == "response" and answer["id"].startswith("resp_")
        assert answer["status"] == "incomplete"  # max_output_tokens reached
        assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
        usage = answer["usage"]
        assert usage["output_tokens"] == 5
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_stored_responses_are_read_continued_and_refused_alike(engines) -> None:
    for name, (url, model) in engines.items():
        first = json.loads(call(url, "/v1/responses", response_body(model))[2])
        status, _, raw = call(url, f"/v1/responses/{first['id']}")
        assert status == 200 and json.loads(raw) == first, name
        body = response_body(model, input="again", previous_response_id=first["id"])
        status, _, raw = call(url, "/v1/responses", body)
        assert status == 200, (name, raw[:300])
        second = json.loads(raw)
        assert second["previous_response_id"] == first["id"], name
        assert second["usage"]["input_tokens"] > first["usage"]["total_tokens"], name
        for path, request, code in [
            (f"/v1/responses/{first['id']}/cancel", b"", 400),  # done: not a background one
            ("/v1/responses/resp_nope", None, 404),
            ("/v1/responses/resp_nope/cancel", b"", 404),
            ("/v1/responses", response_body(model, previous_response_id="resp_nope"), 404),
        ]:
            status, _, raw = call(url, path, request)
            error = json.loads(raw)["error"]
            assert status == code and set(error) == ERROR_KEYS, (name, path, raw[:300])
            assert error["param"] == "response_id", (name, path, error)
        unkept = json.loads(call(url, "/v1/responses", response_body(model, store=False))[2])
        assert call(url, f"/v1/responses/{unkept['id']}")[0] == 404, name


def test_responses_streams_send_vllms_events(engines) -> None:
    events = streamed(engines, "/v1/responses", lambda m: response_body(m, stream=True))
    for name, stream in events.items():
        assert collapsed([n for n, _ in stream]) == RESPONSE_EVENTS, name
        numbers = [data["sequence_number"] for _, data in stream]
        assert numbers == list(range(len(stream))), name
        done = stream[-1][1]["response"]
        assert done["usage"]["output_tokens"] == 5 and done["status"] == "incomplete", name
    same_event_shapes(events)


# -- Anthropic's Messages API --------------------------------------------------------------
def test_messages_and_count_tokens_have_vllms_shape(engines) -> None:
    messages = answers(engines, "/v1/messages", message_body)
    assert missing(skeleton(messages["fake"]), skeleton(messages["vllm"])) == []
    for answer in messages.values():
        assert answer["type"] == "message" and answer["role"] == "assistant"
        assert answer["content"][0]["type"] == "text"
        # no ignore_eos in Anthropic's API: random weights may end the answer early
        assert answer["stop_reason"] in ("max_tokens", "end_turn")
        assert 1 <= answer["usage"]["output_tokens"] <= 5
    counted = answers(
        engines, "/v1/messages/count_tokens", lambda m: {k: v for k, v in message_body(m).items()
                                                         if k != "max_tokens"}
    )  # fmt: skip
    assert missing(skeleton(counted["fake"]), skeleton(counted["vllm"])) == []
    for answer in counted.values():
        original = answer["context_management"]["original_input_tokens"]
        assert answer["input_tokens"] == original > 0


def test_message_streams_send_vllms_events(engines) -> None:
    events = streamed(engines, "/v1/messages", lambda m: message_body(m, stream=True))
    for name, stream in events.items():
        assert collapsed([n for n, _ in stream]) == MESSAGE_EVENTS, name
    same_event_shapes(events)


# -- errors on the new routes: status and format -------------------------------------------
API_ERRORS = {  # path, body, status, format, param (checked where not None)
    "responses without input": ("/v1/responses", lambda m: {"model": m}, 400, "openai", None),
    "responses input a number": ("/v1/responses", lambda m: {"model": m, "input": 5}, 400,
                                 "openai", None),
    "responses body not JSON": ("/v1/responses", lambda m: b"{not json", 400, "openai", None),
    "responses unknown model": ("/v1/responses", lambda m: {"model": "no-such-model",
                                "input": "x"}, 404, "openai", "model"),
    "responses max_output_tokens beyond the context": (
        "/v1/responses", lambda m: {"model": m, "input": "x", "max_output_tokens": 10_000_000},
        400, "openai", "max_output_tokens"),
    # vLLM's schema refusals come in OpenAI's format even here; its handler's in Anthropic's
    "messages without max_tokens": ("/v1/messages", lambda m: {"model": m, "messages": HI},
                                    400, "openai", None),
    "messages not a list": ("/v1/messages", lambda m: {"model": m, "max_tokens": 5,
                            "messages": "hi"}, 400, "openai", None),
    "messages body not JSON": ("/v1/messages", lambda m: b"{not json", 400, "openai", None),
    "messages unknown model": ("/v1/messages", lambda m: {"model": "no-such-model",
                               "max_tokens": 5, "messages": HI}, 404, "anthropic", None),
    "messages max_tokens beyond the context": (
        "/v1/messages", lambda m: {"model": m, "max_tokens": 10_000_000, "messages": HI},
        400, "anthropic", None),
    "count_tokens without messages": ("/v1/messages/count_tokens", lambda m: {"model": m},
                                      400, "openai", None),
    "count_tokens unknown model": ("/v1/messages/count_tokens",
                                   lambda m: {"model": "no-such-model", "messages": HI},
                                   404, "anthropic", None),
    "tokenize without a prompt": ("/tokenize", lambda m: {"model": m}, 400, "openai", None),
    "tokenize unknown model": ("/tokenize", lambda m: {"model": "no-such-model",
                               "prompt": "x"}, 404, "openai", "model"),
    "detokenize tokens a string": ("/detokenize", lambda m: {"model": m, "tokens": "abc"},
                                   400, "openai", None),
    "detokenize a negative id": ("/detokenize", lambda m: {"model": m, "tokens": [-1]}, 400,
                                 "openai", None),
    "detokenize unknown model": ("/detokenize", lambda m: {"model": "no-such-model",
                                 "tokens": [1]}, 404, "openai", "model"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(API_ERRORS))
def test_new_routes_refuse_alike(engines, case) -> None:
    path, make, status, shape, param = API_ERRORS[case]
    for name, (code, content_type, raw) in both(engines, path, make).items():
        assert code == status, (name, raw[:300])
        assert content_type.startswith("application/json"), name
        body = json.loads(raw)
        if shape == "anthropic":
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, name
            continue
        error = body["error"]
        assert set(error) == ERROR_KEYS and error["message"], (name, error)
        if param is not None:
            assert error["param"] == param, (name, error)


# -- tokenize and detokenize ----------------------------------------------------------------
def test_tokenize_and_detokenize_alike(engines) -> None:
    requests = [
        lambda m: {"model": m, "prompt": "hello there"},
        lambda m: {"prompt": "hello there"},  # model is optional here
        lambda m: {"model": m, "messages": HI},
        lambda m: {"model": m, "prompt": "hi", "return_token_strs": True},
    ]
    for make in requests:
        tokenized = answers(engines, "/tokenize", make)
        assert missing(skeleton(tokenized["fake"]), skeleton(tokenized["vllm"])) == []
        for answer in tokenized.values():
            assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] > 0
    for name, (url, model) in engines.items():
        ids = json.loads(call(url, "/tokenize", {"model": model, "prompt": "hello there"})[2])
        status, _, raw = call(url, "/detokenize", {"model": model, "tokens": ids["tokens"]})
        assert status == 200 and json.loads(raw) == {"prompt": "hello there"}, name


def test_responses_and_messages_count_in_vllms_token_metrics(engines) -> None:
    for name, (url, model) in engines.items():
        before = engine_samples(url)
        used = [json.loads(call(url, "/v1/responses", response_body(model))[2])["usage"],
                json.loads(call(url, "/v1/messages", message_body(model))[2])["usage"]]  # fmt: skip
        prompt = sum(u["input_tokens"] for u in used)
        output = sum(u["output_tokens"] for u in used)
        deadline = time.monotonic() + 10
        while True:  # vLLM records an engine step's stats just after it answers
            after = engine_samples(url)
            grew = [after[k] - before[k] for k in ("vllm:prompt_tokens_total",
                                                   "vllm:generation_tokens_total")]  # fmt: skip
            if grew == [prompt, output] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert grew == [prompt, output], name


# -- what the tiny model cannot serve: vLLM's 404, the fake held to vLLM's models ----------
UNSERVED = {  # path: (vllm_schemas kind, a valid body)
    "/rerank": ("rerank", lambda m: {"model": m, "query": "red fox", "documents": ["a", "b"]}),
    "/v1/rerank": ("rerank", lambda m: {"model": m, "query": "q", "documents": ["a"],
                                        "top_n": 1}),
    "/v2/rerank": ("rerank", lambda m: {"model": m, "query": "q", "documents": "a"}),
    "/score": ("score", lambda m: {"model": m, "text_1": "q", "text_2": ["a", "b"]}),
    "/v1/score": ("score", lambda m: {"model": m, "queries": ["q"], "documents": ["a"]}),
    "/pooling": ("pooling", lambda m: {"model": m, "input": ["a", "b"]}),
    "/classify": ("classify", lambda m: {"model": m, "input": "a"}),
}  # fmt: skip
AUDIO = {  # (path, form fields): vllm_schemas kind of the answer
    ("/v1/audio/transcriptions", ()): "transcription",
    ("/v1/audio/transcriptions", (("response_format", "verbose_json"),)): "transcription verbose",
    ("/v1/audio/translations", ()): "translation",
    ("/v1/audio/transcriptions", (("stream", "true"), ("stream_include_usage", "true"))):
        "transcription chunk",
    ("/v1/audio/translations", (("stream", "true"),)): "translation chunk",
}  # fmt: skip


def multipart(fields: dict[str, str], audio: bytes) -> tuple[bytes, str]:
    boundary = "gpuroute" + uuid.uuid4().hex
    out = b""
    for key, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'.encode()
        out += value.encode() + b"\r\n"
    out += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="speech.wav"\r\nContent-Type: audio/wav\r\n\r\n').encode()  # fmt: skip
    out += audio + f"\r\n--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def wav_file(seconds: float, rate: int = 16000) -> bytes:
    data = b"\0\0" * int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def test_routes_the_tiny_model_cannot_serve(engines) -> None:
    """A real vLLM registers the pooling routes only for a pooling model and the audio
    routes only for a speech model (launchers/api_server/routers.py): serving the tiny
    Llama, it answers each with FastAPI's bare 404. The fake serves them for any model;
    its answers must validate against vLLM's own models of them, with no key vLLM does not
    declare and none it would send missing."""
    real_url, real_model = engines["vllm"]
    fake_url, fake_model = engines["fake"]
    cases = []
    for path, (kind, make) in UNSERVED.items():
        status, _, raw = call(real_url, path, make(real_model))
        assert status == 404 and json.loads(raw) == {"detail": "Not Found"}, (path, raw[:300])
        status, _, raw = call(fake_url, path, make(fake_model))
        assert status == 200, (path, raw[:300])
        cases.append((path, kind, json.loads(raw)))
    for (path, fields), kind in AUDIO.items():
        body, content_type = multipart({"model": real_model, **dict(fields)}, wav_file(1.5))
        status, _, raw = call(real_url, path, body, content_type)
        assert status == 404 and json.loads(raw) == {"detail": "Not Found"}, (path, raw[:300])
        body, content_type = multipart({"model": fake_model, **dict(fields)}, wav_file(1.5))
        status, _, raw = call(fake_url, path, body, content_type)
        assert status == 200, (path, raw[:300])
        if kind.endswith("chunk"):
            events = [data for _, data in sse_events(raw.decode())]
            assert events[-1] == "[DONE]", path
            cases += [(f"{path} {fields} #{i}", kind, e) for i, e in enumerate(events[:-1])]
        else:
            cases.append((f"{path} {fields}", kind, json.loads(raw)))
    report = check_with_vllm(cases)
    assert report == {name: [] for name, _, _ in cases}, report
