"""The body fields only the router may set (issue 42 finding 6), refused from clients.

Engines read some request fields as the operator's, not the tenant's: a client who sets
them steers the engine past the router. Each is listed with why; a key may be allowed
some (`[[auth.keys]] allow_body_fields`, and `[auth.anonymous]`'s). Only the top level of a
JSON body is read: that is where vLLM and SGLang read them; and an audio upload's form
fields (vLLM's transcription request declares `vllm_xargs`).

Not listed, on purpose: fields a client may set to the same effect as the router does,
such as those a continuation writes into the body it sends on (`return_token_ids`,
`continue_final_message`, `add_generation_prompt`, `stream_options`, `prompt`,
`max_tokens`: gpuroute/continuation/text.py), and `return_tokens_as_token_ids`; they change
the client's own answer only."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

ROUTER_ONLY: Mapping[str, str] = {
    # vLLM (entrypoints/openai protocol): read by the engine's scheduler or connectors
    "priority": "vLLM's `--scheduling-policy priority` queue: the router's class decides",
    "request_id": "vLLM's id for the request (and its Responses id): the router names it",
    "kv_transfer_params": "disaggregated serving: names the host the KV cache moves from",
    "ec_transfer_params": "encoder-cache disaggregation: names where the cache moves from",
    "cache_salt": "partitions the prefix cache: the operator decides who shares it",
    "vllm_xargs": "free-form arguments to the engine's custom extensions",
    # SGLang (GenerateReqInput and its OpenAI requests): the same powers, other names
    "rid": "SGLang's request id",
    "bootstrap_host": "SGLang prefill/decode disaggregation: where the KV cache comes from",
    "bootstrap_port": "SGLang prefill/decode disaggregation",
    "bootstrap_room": "SGLang prefill/decode disaggregation",
    "data_parallel_rank": "picks the engine's data-parallel worker: placement is the router's",
    "routed_dp_rank": "picks the engine's data-parallel worker: placement is the router's",
    "disagg_prefill_dp_rank": "SGLang: which prefill worker holds the KV cache",
    "custom_logit_processor": "SGLang: serialized code the engine runs",
    "extra_key": "SGLang: partitions the prefix cache, as cache_salt",
    "lora_path": "SGLang: picks a LoRA adapter per request, past the key's model allow-list",
    "session_params": "SGLang: continues an engine-side session, named by its id",
    "input_ids": "SGLang: token ids that replace the prompt the router read and charged",
}

ROUTER_ONLY_NAMES = frozenset(ROUTER_ONLY)


class RouterOnlyField(Exception):
    """A body sets a field only the router may set (400, naming it)."""

    def __init__(self, field: str) -> None:
        super().__init__(
            f"'{field}' is set by the router only ({ROUTER_ONLY[field]}); this key may not "
            "send it (auth.keys allow_body_fields)"
        )
        self.field = field


def check_fields(
    body: Mapping[str, object] | None, allowed: AbstractSet[str] = frozenset()
) -> None:
    """RouterOnlyField for a router-only field `body` sets that `allowed` does not name (a
    field sent as null sets nothing; of several, the first by name). The body's own keys
    are looked up, once, in C: nearly every body sets none."""
    if not body:
        return
    for field in sorted(ROUTER_ONLY_NAMES.intersection(body)):
        if body[field] is not None and field not in allowed:
            raise RouterOnlyField(field)


def known_fields(fields: list[str]) -> list[str]:
    """A config's `allow_body_fields`: each must be a router-only field (a typo would allow
    nothing, silently)."""
    for field in fields:
        if field not in ROUTER_ONLY:
            raise ValueError(
                f"{field!r} is no router-only body field; known: {', '.join(ROUTER_ONLY)}"
            )
    return fields
