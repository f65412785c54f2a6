"""The demo explains its lopsided shares (issue 31): beside each backend's share, the
latency the router predicted for a typical request there and the latency measured."""

from __future__ import annotations

from gpuroute.demo.placement import TYPICAL_OUTPUT, TYPICAL_WORDS, Placement, chat
from rich.console import Console


def rendered(renderable) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def placement() -> Placement:
    body = {
        "predicted_for": {"prompt_tokens": 250, "output_tokens": 64, "slo_class": "standard",
                          "slo_ttft_s": 2.0, "slo_tpot_s": 0.1},
        "backends": [{"id": "h100", "gpu": "H100"}, {"id": "l4", "gpu": "L4"}],
    }  # fmt: skip
    return Placement(
        body=body,
        predicted={"h100": [(0.012, 0.40), (0.014, 0.44)], "l4": [(0.062, 2.42)]},
        measured={"h100": [(0.011, 0.39)] * 3, "l4": [(0.065, 2.43)]},
        probed={"l4"},
    )


def test_only_requests_of_the_typical_size_count_as_measured() -> None:
    p = Placement()
    p.record("h100", chat(TYPICAL_WORDS, TYPICAL_OUTPUT), 0.01, 0.4)
    p.record("h100", chat(20, TYPICAL_OUTPUT), 0.01, 0.4)
    p.record("h100", chat(TYPICAL_WORDS, 16), 0.01, 0.4)
    assert p.measured == {"h100": [(0.01, 0.4)]}
    assert Placement.query() == "/admin/backends?prompt_tokens=250&output_tokens=64"


def test_each_share_stands_beside_its_predicted_and_measured_latency() -> None:
    text = rendered(placement().table({"h100": 98, "l4": 2}))
    assert "250 prompt tokens, 64 output; SLO standard: TTFT <= 2 s, TPOT <= 0.1 s" in text
    rows = {line.split()[1]: line.split("│")[3:] for line in text.splitlines() if "│ " in line}
    cells = [c.strip() for c in rows["h100"][:6]]
    assert cells == ["98", "98%", "13 ms", "11 ms", "420 ms", "390 ms"]
    cells = [c.strip() for c in rows["l4"][:6]]
    assert cells == ["2", "2%", "62 ms", "65 ms *", "2.42 s", "2.43 s *"]
    assert "sent straight to the engine" in text


def test_the_sentence_says_why_the_fastest_took_nearly_everything() -> None:
    p = placement()
    assert p.why({"h100": 98, "l4": 2}) == (
        "At light load the fastest GPU meets the SLO best, so the router sends nearly "
        "everything to h100 (H100, the lowest predicted TTFT); the others take work as load "
        "grows and its queue lengthens its predictions past theirs."
    )
    assert p.why({"h100": 2, "l4": 98}).startswith("l4 took the most requests: ")
    assert Placement().why({}) == ""
