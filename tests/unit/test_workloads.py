from __future__ import annotations

import numpy as np
import pytest
from gpuroute.sim.traces import TraceError, read_azure, read_lengths, read_mooncake, read_trace
from gpuroute.sim.workloads import PROFILES, synthetic
from support.paths import shared_file


@pytest.mark.parametrize(
    ("profile", "prompt_median", "output_median"),
    [("chat", 1020, 129), ("code", 1469, 13), ("long-context", 6909, 343)],
)
def test_synthetic_profiles_match_the_source_medians(profile, prompt_median, output_median) -> None:
    w = synthetic(profile, 40_000, rate=10.0, seed=1)
    assert np.median(w.prompts) == pytest.approx(prompt_median, rel=0.05)
    assert np.median(w.outputs) == pytest.approx(output_median, rel=0.08)
    assert np.all(np.diff(w.arrivals) >= 0)
    assert (len(w) - 1) / w.span_s == pytest.approx(10.0, rel=0.05)


def test_bursty_arrivals_keep_the_mean_rate_but_vary_more() -> None:
    calm = synthetic("chat", 40_000, 10.0, seed=2)
    bursty = synthetic("code", 40_000, 10.0, seed=2)
    counts = lambda w: np.bincount(w.arrivals.astype(int))  # noqa: E731
    assert (len(bursty) - 1) / bursty.span_s == pytest.approx(10.0, rel=0.05)
    assert (
        counts(bursty).var() / counts(bursty).mean() > 2 * counts(calm).var() / counts(calm).mean()
    )


def test_shared_prefix_profile_builds_conversations() -> None:
    w = synthetic("shared-prefix", 5000, 5.0, seed=3)
    assert all(b[0] == 0 for b in w.blocks)  # the shared system prompt
    assert all(len(b) == int(np.ceil(p / 512)) for b, p in zip(w.blocks, w.prompts, strict=True))
    first_blocks = {b[1] for b in w.blocks if len(b) > 1}
    assert len(first_blocks) < 0.8 * len(w)  # turns share their conversation's blocks
    assert len(set(w.sessions)) < len(w)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: " + ", ".join(PROFILES)):
        synthetic("poetry", 10, 1.0, 0)


def test_bad_trace_rows_name_the_line(tmp_path) -> None:
    bad = tmp_path / "a.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12,x\n")
    with pytest.raises(TraceError, match=r"a.csv:2: bad row"):
        read_azure(bad)
    wrong = tmp_path / "b.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="missing columns"):
        read_trace(wrong, "azure", 0)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\nnot json\n')
    with pytest.raises(TraceError, match=r"c.jsonl:2: bad record"):
        read_mooncake(jsonl)


@pytest.mark.shared_data
def test_real_traces_load_with_their_documented_sizes() -> None:
    conv = read_azure(shared_file("azure-llm-2023/AzureLLMInferenceTrace_conv.csv"))
    assert len(conv) == 19_366 and conv.arrivals[0] == 0
    assert conv.span_s == pytest.approx(3502, abs=2)
    moon = read_mooncake(shared_file("mooncake-conversation/conversation_trace.jsonl"))
    assert len(moon) == 12_031
    assert all(
        len(b) == int(np.ceil(p / 512)) for b, p in zip(moon.blocks, moon.prompts, strict=True)
    )
    share = read_lengths(
        shared_file("sharegpt-lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"), 0
    )
    assert len(share) == 30_731 and int(np.median(share.prompts)) == 1730
