"""A real vLLM (CPU build, tiny model with random weights) on loopback, shared by a module's
tests: it takes 20-60 s to start. Skipped, saying how to install it, where it is absent
(a failure under `make test`, which installs it)."""

from __future__ import annotations

import pytest
from gpuroute.testbed.real_vllm import VllmOptions, start_vllm
from support.real_engine import need_vllm


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """One real vLLM of the small shape (~65 tokens/s for one stream here, so a request
    lasts long enough to be watched and aborted): 8 sequences at once, prefix caching on."""
    need_vllm()
    options = VllmOptions(shape="small", max_num_seqs=8)
    child = start_vllm(tmp_path_factory.mktemp("vllm"), options)
    yield child
    child.stop()
