"""Helpers for the real-engine tests: a router config in front of real vLLM servers, the
exact prompt length of the tiny model's byte tokenizer, and vLLM's own metrics."""

from __future__ import annotations

import urllib.request

import pytest
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.real_vllm import HOW_TO_GET_VLLM, vllm_python
from prometheus_client.parser import text_string_to_metric_families

SERVED = "tiny-llama"
# the tiny model's chat template adds <|user|>, </s> and <|assistant|> around a message
TEMPLATE_TOKENS = 3


def vllm_or_skip() -> None:
    if vllm_python() is None:
        pytest.skip(HOW_TO_GET_VLLM)


def router_config(
    urls: list[str], policy: str | None = None, gpu: str = "L4", extra: str = ""
) -> str:
    """The router's default policy unless `policy`; `extra`: more sections."""
    top = ROUTER_ON_LOOPBACK + "tick_s = 0.05\n" + (f'policy = "{policy}"\n' if policy else "")
    lines = [top + "[listen]\nport = 0", extra]
    for i, url in enumerate(urls):
        lines.append(
            f'[[backends]]\nid = "vllm-{i}"\nurl = "{url}"\ngpu = "{gpu}"\nmodels = ["{SERVED}"]'
        )
    return "\n".join(x for x in lines if x) + "\n"


def chat_prompt_tokens(text: str) -> int:
    """One token per byte of the message, plus the template's three."""
    return len(text.encode()) + TEMPLATE_TOKENS


def vllm_metrics(url: str) -> dict[str, float]:
    """vLLM's samples by name, summed over label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def agent_config(engine_url: str, consul: str, agent_id: str) -> str:
    """A node agent for a real vLLM: its metrics, no GPU telemetry (a CPU engine)."""
    return (
        f'id = "{agent_id}"\ndrain_grace_s = 0.5\ndrain_timeout_s = 60\n'
        f'[engine]\nurl = "{engine_url}"\nkind = "vllm"\nmodels = ["{SERVED}"]\ngpu = "L4"\n'
        '[telemetry]\nsource = "none"\nhealth_interval_s = 0.2\ninterval_s = 0.1\n'
        f'[consul]\naddress = "{consul}"\nttl_s = 6\n'
        f"[load_stream]\nport = {free_port()}\n[admin]\nport = {free_port()}\n"
    )


def discovering_router_config(consul: str) -> str:
    """A router that finds its engines through Consul (and their agents' load streams)."""
    return (
        ROUTER_ON_LOOPBACK + "tick_s = 0.05\n[listen]\nport = 0\n"
        f'[membership]\nconsul = "{consul}"\nwait_s = 5\n'
    )
