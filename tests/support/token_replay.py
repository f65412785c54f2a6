"""A mixed replay for token-count tests: chat or completions, streamed or not, a quarter
CJK, usage asked for by some streaming clients; and the router's token counters read back."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

CJK = "請把這份會議紀錄整理成重點，並列出所有待辦事項與負責人。"


def replay_bodies(n: int, model: str, *, max_output: int = 12, seed: int = 34) -> list:
    """(route, body) pairs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = (CJK if i % 4 == 0 else "route this request well please ") * rng.randint(1, 6)
        body: dict = {"model": model, "max_tokens": rng.randint(1, max_output)}
        if rng.random() < 0.5:
            body["stream"] = True
            if rng.random() < 0.3:
                body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": text}]
            out.append(("/v1/chat/completions", body | {"messages": messages}))
        else:
            out.append(("/v1/completions", body | {"prompt": text}))
    return out


def router_tokens(text: str) -> dict[str, float]:
    """gpuroute_tokens_total summed by direction."""
    totals = {"prompt": 0.0, "completion": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpuroute_tokens_total":
                totals[sample.labels["direction"]] += sample.value
    return totals
