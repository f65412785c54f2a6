"""The fake engine's pooling routes, shaped as vLLM 0.32 answers them for a pooling model
(vLLM registers none of them for a generative model: a real vLLM serving the testbed's
tiny Llama answers each with 404):

- `/rerank`, `/v1/rerank`, `/v2/rerank` (Jina/Cohere style): `query`, `documents`, `top_n`
  -> `results` sorted by `relevance_score` (entrypoints/pooling/scoring/protocol.py
  RerankRequest/RerankResponse, serving.py _request_output_to_rerank_response);
- `/score`, `/v1/score`: `text_1`/`text_2` (or `queries`/`documents`, `queries`/`items`,
  `data_1`/`data_2`) -> one `score` per pair (ScoreResponse);
- `/pooling`: `input` -> one vector per input (pooling/pooling/protocol.py);
- `/classify`: `input` -> `label`, `probs`, `num_classes` (pooling/classify/protocol.py).

Each is prefill-only work: one engine-model request per sequence (a query-document pair,
or an input), paced by the model's prefill of its tokens, none generated. Scores are
deterministic: the share of the query's words found in the document, with a little
per-pair jitter so ties break the same way every time."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from aiohttp import web
from gpuroute.testbed.fake_engine.common import (
    ServingEngine,
    field_error,
    hex_id,
    is_int,
    pooling_usage,
    prefill_only,
    read_body,
)
from gpuroute.testbed.fake_engine.payloads import embedding

from gpuroute.openai_api import error_response
from gpuroute.prompt import estimate_tokens, prefix_blocks

LABELS = ("LABEL_0", "LABEL_1")  # a two-class head, as a default sequence classifier has
SCORE_FIELDS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                ("data_1", "data_2"))  # fmt: skip


def score_input_text(value: object) -> str | None:
    """A ScoreInput's text: a string, or {"content": [parts]} with text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return " ".join(p["text"] for p in value["content"] if isinstance(p, dict) and "text" in p)
    return None


def score_inputs(value: object) -> list[str] | None:
    items = value if isinstance(value, list) else [value]
    texts = [score_input_text(v) for v in items]
    return None if not texts or any(t is None for t in texts) else texts  # type: ignore[return-value]


def relevance(query: str, document: str) -> float:
    words = set(query.lower().split())
    found = set(document.lower().split())
    overlap = len(words & found) / len(words) if words else 0.0
    digest = hashlib.blake2b(f"{query}\0{document}".encode(), digest_size=2).digest()
    jitter = int.from_bytes(digest, "big") / 65535
    return round(0.05 + 0.9 * overlap + 0.05 * jitter, 6)


def pooled_inputs(value: object) -> list[tuple[str, int]] | None:
    """A pooling or classify `input` as (text, tokens) per sequence: a string, strings,
    token ids, or lists of token ids (CompletionRequestMixin)."""
    if isinstance(value, str):
        return [(value, estimate_tokens(value))]
    if not isinstance(value, list) or not value:
        return None
    if all(is_int(v) for v in value):
        return [(" ".join(map(str, value)), len(value))]
    if all(isinstance(v, str) for v in value):
        return [(v, estimate_tokens(v)) for v in value]
    if all(isinstance(v, list) and v and all(is_int(t) for t in v) for v in value):
        return [(" ".join(map(str, v)), len(v)) for v in value]
    return None


class FakePooling:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def routes(self) -> list[web.RouteDef]:
        rerank = [web.post(p, self.rerank) for p in ("/rerank", "/v1/rerank", "/v2/rerank")]
        score = [web.post(p, self.score) for p in ("/score", "/v1/score")]
        return [*rerank, *score, web.post("/pooling", self.pooling),
                web.post("/classify", self.classify)]  # fmt: skip

    async def _run(self, sequences: list[tuple[str, int]]) -> int | web.Response:
        """Prefill each (text, tokens) sequence; their total tokens, or a refusal."""
        longest = self.engine.max_model_len
        for _, size in sequences:
            if size > longest:
                return error_response(
                    400,
                    f"This model's maximum context length is {longest} tokens. However, "
                    f"you requested {size} tokens in the input.",
                    param="input_tokens",
                )
        refused = await prefill_only(self.engine, [(n, prefix_blocks(t)) for t, n in sequences])
        return refused if refused is not None else sum(n for _, n in sequences)

    async def rerank(self, request: web.Request) -> web.Response:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        query, documents = score_input_text(body.get("query")), score_inputs(body.get("documents"))
        top_n = body.get("top_n", 0)
        if query is None:
            return field_error("query", "a string or {'content': [...]}")
        if documents is None:
            return field_error("documents", "a string or a list of strings")
        if not is_int(top_n) or top_n < 0:
            return field_error("top_n", "an integer >= 0")
        asked = estimate_tokens(query)
        used = await self._run([(query + d, asked + estimate_tokens(d)) for d in documents])
        if isinstance(used, web.Response):
            return used
        results = [
            {"index": i, "document": {"text": d, "multi_modal": None},
             "relevance_score": relevance(query, d)}
            for i, d in enumerate(documents)
        ]  # fmt: skip
        results.sort(key=lambda r: r["relevance_score"], reverse=True)
        if 0 < top_n < len(results):
            results = results[:top_n]
        usage = {"prompt_tokens": used, "total_tokens": used}
        return web.json_response(
            {"id": hex_id("score-"), "model": self.engine.name, "usage": usage,
             "results": results}
        )  # fmt: skip

    async def score(self, request: web.Request) -> web.Response:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        names = next((pair for pair in SCORE_FIELDS if all(k in body for k in pair)), None)
        if names is None:
            return field_error("text_1", "given, with 'text_2'")
        left, right = score_inputs(body[names[0]]), score_inputs(body[names[1]])
        if left is None or right is None:
            return field_error(names[0] if left is None else names[1], "a string or strings")
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right):
            return error_response(400, "Input lengths must be either 1:1, 1:N or N:N",
                                  param=names[0])  # fmt: skip
        pairs = list(zip(left, right, strict=True))
        used = await self._run([(a + b, estimate_tokens(a) + estimate_tokens(b)) for a, b in pairs])
        if isinstance(used, web.Response):
            return used
        data = [{"index": i, "object": "score", "score": relevance(a, b)}
                for i, (a, b) in enumerate(pairs)]  # fmt: skip
        return web.json_response(self._listing("score-", data, used))

    async def pooling(self, request: web.Request) -> web.Response:
        return await self._pooled(request, "pool-", self._vector)

    async def classify(self, request: web.Request) -> web.Response:
        return await self._pooled(request, "classify-", self._classes)

    async def _pooled(self, request: web.Request, prefix: str, item) -> web.Response:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        inputs = pooled_inputs(body.get("input"))
        if inputs is None:
            return field_error("input", "a string, strings, token ids or lists of token ids")
        used = await self._run(inputs)
        if isinstance(used, web.Response):
            return used
        data = [item(i, text) for i, (text, _) in enumerate(inputs)]
        return web.json_response(self._listing(prefix, data, used))

    @staticmethod
    def _vector(index: int, text: str) -> dict[str, Any]:
        return {"index": index, "object": "pooling", "data": embedding(text)}

    @staticmethod
    def _classes(index: int, text: str) -> dict[str, Any]:
        first = relevance("positive", text)
        probs = [round(1 - first, 6), first]
        label = LABELS[probs.index(max(probs))]
        return {"index": index, "label": label, "probs": probs, "num_classes": len(LABELS)}

    def _listing(self, prefix: str, data: list[dict[str, Any]], used: int) -> dict[str, Any]:
        return {"id": hex_id(prefix), "object": "list", "created": int(time.time()),
                "model": self.engine.name, "data": data, "usage": pooling_usage(used)}  # fmt: skip
