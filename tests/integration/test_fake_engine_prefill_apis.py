"""The fake engine's prefill-only and lookup APIs on loopback: rerank, score, pooling and
classify (paced by the engine model's prefill, counted in vLLM's metrics, nothing
generated), speech to text (paced by the audio's duration read from its WAV header), and
tokenize/detokenize; each in vLLM's shape, malformed bodies refused with 4xx."""

from __future__ import annotations

import math
import time

import pytest
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from support.fake_engine_app import audio_form, fake_engine_app, sse_events, wav

from gpuroute.prompt import estimate_tokens

pytestmark = pytest.mark.asyncio
MODEL = "llama-3.1-8b"
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


@pytest.mark.parametrize("path", RERANK_PATHS)
async def test_rerank_sorts_by_relevance_and_counts_every_pair(path) -> None:
    async with fake_engine_app() as fake:
        documents = ["the red fox jumps", "blue sky", "a fox"]
        body = {"model": MODEL, "query": "red fox", "documents": documents, "top_n": 2}
        status, answer = await fake.post(path, body)
        assert status == 200 and answer["id"].startswith("score-") and answer["model"] == MODEL
        ranked = [r["index"] for r in answer["results"]]
        assert ranked == [0, 2]  # every query word, then one of two; top_n cuts the third
        scores = [r["relevance_score"] for r in answer["results"]]
        assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
        assert answer["results"][0]["document"] == {"text": documents[0], "multi_modal": None}
        tokens = sum(estimate_tokens("red fox") + estimate_tokens(d) for d in documents)
        assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        metrics = await fake.metrics()
        assert metrics["vllm:prompt_tokens_total"] == tokens
        assert metrics["vllm:generation_tokens_total"] == 0  # prefill only
        assert metrics["vllm:request_success_total"] == 3  # one engine request a pair


def engine_model_seconds(params, sizes: list[int], slowdown: float) -> float:
    """When the simulator's engine model finishes these prefill-only requests, all sent
    at once: the pace the fake engine keeps."""
    model = EngineModel(params)
    model.set_slowdown(slowdown, 0.0)
    for i, size in enumerate(sizes):
        model.submit(EngineRequest(i, size, 1, 0.0, ()), 0.0)
    done, now = 0, 0.0
    while done < len(sizes):
        now = model.next_event_time()
        done += len(model.on_event(now))
    return now


async def test_a_long_rerank_takes_the_engine_models_prefill_time() -> None:
    async with fake_engine_app(time_scale=4.0) as fake:
        documents = [f"document {i} " + "x" * 4000 for i in range(10)]
        sizes = [estimate_tokens("query") + estimate_tokens(d) for d in documents]
        expected = engine_model_seconds(fake.engine.params, sizes, 4.0)
        began = time.monotonic()
        status, _ = await fake.post("/rerank", {"query": "query", "documents": documents})
        elapsed = time.monotonic() - began
        assert status == 200
        assert expected * 0.95 <= elapsed <= expected * 2 + 0.5, (elapsed, expected)


async def test_score_pairs_one_to_many_and_many_to_many() -> None:
    async with fake_engine_app() as fake:
        status, answer = await fake.post("/score", {"text_1": "red fox", "text_2": ["red", "x"]})
        assert status == 200 and answer["object"] == "list"
        assert [d["index"] for d in answer["data"]] == [0, 1]
        assert all(d["object"] == "score" for d in answer["data"])
        assert answer["data"][0]["score"] > answer["data"][1]["score"]
        assert answer["usage"]["prompt_tokens"] == 2 * estimate_tokens("red fox") + 2
        body = {"queries": ["a", "b"], "documents": ["a", "b"]}
        status, answer = await fake.post("/v1/score", body)
        assert status == 200 and len(answer["data"]) == 2
        status, error = await fake.post("/score", {"text_1": ["a", "b"], "text_2": ["a"] * 3})
        assert status == 400 and error["error"]["param"] == "text_1"


async def test_pooling_and_classify_answer_each_input() -> None:
    async with fake_engine_app() as fake:
        status, pooled = await fake.post("/pooling", {"input": ["one", "two"]})
        assert status == 200 and pooled["id"].startswith("pool-")
        assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
        assert all(len(d["data"]) == 16 for d in pooled["data"])
        assert pooled["usage"]["prompt_tokens"] == 2 and pooled["usage"]["completion_tokens"] == 0
        status, classes = await fake.post("/classify", {"model": MODEL, "input": [[5, 6, 7]]})
        assert status == 200 and classes["id"].startswith("classify-")
        (item,) = classes["data"]
        assert item["num_classes"] == 2 and len(item["probs"]) == 2
        assert math.isclose(sum(item["probs"]), 1.0) and item["label"] in ("LABEL_0", "LABEL_1")
        assert classes["usage"]["prompt_tokens"] == 3  # token ids count as ids


POOLING_ERRORS = {
    "rerank without a query": ("/rerank", {"documents": ["a"]}, 400, "query"),
    "rerank documents a number": ("/v1/rerank", {"query": "q", "documents": 5}, 400,
                                  "documents"),
    "rerank a document as {'text'}": ("/v2/rerank", {"query": "q", "documents": [{"text": "a"}]},
                                      400, "documents"),
    "rerank top_n negative": ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 400,
                              "top_n"),
    "score without text_2": ("/score", {"text_1": "a"}, 400, "text_1"),
    "pooling without input": ("/pooling", {}, 400, "input"),
    "classify input a number": ("/classify", {"input": 5}, 400, "input"),
    "an unknown model": ("/rerank", {"model": "nope", "query": "q", "documents": ["a"]}, 404,
                         "model"),
    "a body not JSON": ("/score", b"[1, 2", 400, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(POOLING_ERRORS))
async def test_malformed_pooling_bodies_get_openai_errors(case) -> None:
    path, body, want, param = POOLING_ERRORS[case]
    async with fake_engine_app() as fake:
        status, answer = await fake.post(path, body)
        assert status == want, answer
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["param"] == param


async def test_transcriptions_answer_in_each_format_and_are_paced_by_duration() -> None:
    async with fake_engine_app() as fake:
        audio = wav(61.0)  # three of Whisper's 30-s windows
        status, answer = await fake.post("/v1/audio/transcriptions", data=audio_form(audio))
        assert status == 200 and answer["usage"] == {"type": "duration", "seconds": 61}
        assert answer["text"].split() == ["tok"] * (90 + 90 + 3)
        metrics = await fake.metrics()
        assert metrics["vllm:prompt_tokens_total"] == 1500 + 1500 + 50
        assert metrics["vllm:generation_tokens_total"] == 183
        form = audio_form(audio, response_format="text", model=MODEL)
        assert (await fake.post("/v1/audio/transcriptions", data=form))[1]["usage"]["seconds"] == 61
        form = audio_form(wav(1.0), response_format="verbose_json", language="de")
        status, verbose = await fake.post("/v1/audio/transcriptions", data=form)
        assert status == 200 and verbose["duration"] == 1.0 and verbose["language"] == "de"
        assert verbose["segments"][0]["end"] == 1.0 and verbose["text"] == "tok tok tok"
        status, translated = await fake.post("/v1/audio/translations", data=audio_form(wav(1.0)))
        assert status == 200 and translated == {"text": "tok tok tok"}  # no usage: vLLM's


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
async def test_an_audio_stream_ends_with_finish_usage_and_done(path) -> None:
    async with fake_engine_app() as fake:
        form = audio_form(wav(2.0), stream="true", stream_include_usage="true")
        status, content_type, text = await fake.raw(path, data=form)
        assert status == 200 and content_type == "text/event-stream"
        events = [data for _, data in sse_events(text)]
        assert events[-1] == "[DONE]"
        usage, chunks = events[-2], events[:-2]
        kind = "transcription.chunk" if "transcriptions" in path else "translation.chunk"
        assert {c["object"] for c in chunks} == {kind} and usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": 100, "completion_tokens": 6,
                                  "total_tokens": 106}  # fmt: skip
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
        assert text == " tok" * 6


AUDIO_ERRORS = {
    "no file": (None, {}, 400),
    "not a WAV file": (b"ID3\x04 an mp3", {}, 400),
    "srt": (b"wav", {"response_format": "srt"}, 400),
    "an unknown format": (b"wav", {"response_format": "xml"}, 400),
    "verbose_json streamed": (b"wav", {"response_format": "verbose_json", "stream": "true"}, 400),
    "an unknown model": (b"wav", {"model": "nope"}, 404),
}


@pytest.mark.parametrize("case", list(AUDIO_ERRORS))
async def test_malformed_audio_requests_get_openai_errors(case) -> None:
    file, fields, want = AUDIO_ERRORS[case]
    async with fake_engine_app() as fake:
        upload = wav(1.0) if file == b"wav" else file
        status, answer = await fake.post(
            "/v1/audio/transcriptions", data=audio_form(upload, **fields)
        )
        assert status == want, answer
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        status, answer = await fake.post("/v1/audio/translations", {"model": MODEL})  # JSON
        assert status == 400 and answer["error"]["param"] == "file"


async def test_tokenize_and_detokenize() -> None:
    async with fake_engine_app() as fake:
        status, answer = await fake.post("/tokenize", {"model": MODEL, "prompt": "hello there"})
        assert status == 200
        assert answer == {"count": 3, "max_model_len": fake.engine.max_model_len,
                          "tokens": answer["tokens"], "token_strs": None}  # fmt: skip
        status, back = await fake.post("/detokenize", {"tokens": answer["tokens"]})
        assert status == 200 and back == {"prompt": "hello there"}
        body = {"messages": [{"role": "user", "content": "hello"}], "return_token_strs": True}
        status, chat = await fake.post("/tokenize", body)
        assert status == 200 and chat["token_strs"] == ["hell", "o"] and chat["count"] == 2
        for path, body, param in [
            ("/tokenize", {"model": MODEL}, "prompt"),
            ("/tokenize", {"messages": "hi"}, "prompt"),
            ("/detokenize", {"tokens": "abc"}, "tokens"),
            ("/detokenize", {"tokens": [-1]}, "tokens"),
            ("/detokenize", {"model": "nope", "tokens": [1]}, "model"),
        ]:
            status, error = await fake.post(path, body)
            assert status == (404 if param == "model" else 400) and error["error"]["param"] == param


async def test_faults_hold_the_new_routes_too() -> None:
    async with fake_engine_app() as fake:
        assert (await fake.post("/_fault", {"error_rate": 1.0}))[0] == 200
        message = {"model": MODEL, "max_tokens": 1, "messages": []}
        for path, body in [("/rerank", {"query": "q", "documents": ["a"]}),
                           ("/tokenize", {"prompt": "x"}), ("/v1/responses", {"input": "x"}),
                           ("/v1/messages", message)]:  # fmt: skip
            status, answer = await fake.post(path, body)
            assert status == 500 and answer["error"]["code"] == "fault_error_rate", path
        form = audio_form(wav(1.0))
        assert (await fake.post("/v1/audio/transcriptions", data=form))[0] == 500
