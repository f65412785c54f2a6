"""Helpers for the real-engine tests: the skip (a failure under `make test`) when vLLM is
absent, the exact prompt length of the tiny model's byte tokenizer, and a node agent for a
real vLLM."""

from __future__ import annotations

from gpuroute.testbed.real_vllm import SERVED_NAME

from support import components
from support.live import agent_toml

SERVED = SERVED_NAME
# the tiny model's chat template adds <|user|>, </s> and <|assistant|> around a message
TEMPLATE_TOKENS = 3


def need_vllm() -> None:
    components.vllm()


def chat_prompt_tokens(text: str) -> int:
    """One token per byte of the message, plus the template's three."""
    return len(text.encode()) + TEMPLATE_TOKENS


def vllm_agent_toml(engine, consul: str, agent_id: str) -> str:
    """A node agent for a real vLLM: its metrics, no GPU telemetry (a CPU engine), time
    for long streams to drain."""
    return agent_toml(
        engine, consul, agent_id, model=SERVED, gpu="L4", telemetry="none", drain_timeout_s="60"
    )
