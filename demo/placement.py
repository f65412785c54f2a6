"""Why the demo's requests went where they did: each backend's share beside the latency
the router predicted for a typical request there and the latency the demo measured.

At the demo's light load nearly every request goes to the H100, and a user reads that as
the imbalance a router should fix. It is the SLO-aware policy working: the fastest GPU
meets the SLO best until its queue makes another one better. The table shows the numbers
that decide it: the latency model's predictions, polled while the traffic runs from the
router's admin listener (`/admin/backends?prompt_tokens=&output_tokens=`), next to what
requests of that size took."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import aiohttp
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuroute.prompt import prompt_tokens

MODEL = "llama-3.1-8b"
TYPICAL_WORDS, TYPICAL_OUTPUT = 200, 64  # the middle of the demo's request sizes
POLL_S = 0.5  # how often the router's predictions are read while the traffic runs
MIN_ROUTED = 3  # typical requests routed to a backend to take their median as measured
PROBES = 2  # else, typical requests sent straight to its engine after the traffic


def chat(words: int, max_tokens: int) -> dict:
    """A streamed chat request of `words` words asking for `max_tokens` tokens."""
    return {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "word " * words}]}  # fmt: skip


async def timed_stream(
    session: aiohttp.ClientSession, url: str, body: dict
) -> tuple[bool, float, float, str]:
    """Send one streamed request: (ok, TTFT, end to end, the answering backend)."""
    start = time.monotonic()
    first = None
    text = b""
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        async for chunk in r.content.iter_any():
            first = first if first is not None else time.monotonic()
            text += chunk
        end = time.monotonic()
        ok = r.status == 200 and b"data: [DONE]" in text and b'"error"' not in text
        backend = r.headers.get("x-gpuroute-backend", "-")
    return ok, (first if first is not None else end) - start, end - start, backend


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _medians(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    if not pairs:
        return None
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


@dataclass
class Placement:
    """What the demo gathers to explain where requests went: the router's predictions for
    a typical request on each backend, and the TTFT and end to end it measured there."""

    body: dict = field(default_factory=dict)  # the router's last /admin/backends answer
    predicted: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    measured: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    probed: set[str] = field(default_factory=set)  # measured straight at the engine

    @staticmethod
    def query() -> str:
        """The query that asks `/admin/backends` for predictions of the typical request."""
        tokens = prompt_tokens(chat(TYPICAL_WORDS, TYPICAL_OUTPUT))
        return f"/admin/backends?prompt_tokens={tokens}&output_tokens={TYPICAL_OUTPUT}"

    def record(self, backend: str, body: dict, ttft: float, e2e: float) -> None:
        """One of the demo's requests came back: kept when it is of the typical size."""
        typical = body["max_tokens"] == TYPICAL_OUTPUT
        if typical and body["messages"][0]["content"].count("word") == TYPICAL_WORDS:
            self.measured.setdefault(backend, []).append((ttft, e2e))

    async def poll(self, router_url: str, traffic: asyncio.Task) -> None:
        """Read the router's predictions every POLL_S until the traffic is done."""
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(router_url + self.query()) as r:
                    self.body = await r.json()
                for b in self.body["backends"]:
                    if p := b.get("predicted"):
                        self.predicted.setdefault(b["id"], []).append((p["ttft_s"], p["e2e_s"]))
                if traffic.done():
                    return
                await asyncio.wait([traffic], timeout=POLL_S)

    async def probe(self, engines: dict[str, str]) -> None:
        """Measure the backends that got too few typical requests straight at their engine
        (all at once; one request at a time on each)."""
        ids = [i for i in engines if len(self.measured.get(i, ())) < MIN_ROUTED]
        timeout = aiohttp.ClientTimeout(total=60)
        body = chat(TYPICAL_WORDS, TYPICAL_OUTPUT)

        async def one(session: aiohttp.ClientSession, backend: str) -> None:
            runs = []
            for _ in range(PROBES):
                _ok, ttft, e2e, _ = await timed_stream(session, engines[backend], body)
                runs.append((ttft, e2e))
            self.measured[backend], self.probed = runs, self.probed | {backend}

        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(one(session, i) for i in ids))

    def table(self, routed: dict) -> Group:
        """Each backend's share, with predicted and measured latency of the typical request."""
        asked = self.body["predicted_for"]
        heading = (
            f"where the requests went, and why (a typical request: {asked['prompt_tokens']} "
            f"prompt tokens, {asked['output_tokens']} output; SLO {asked['slo_class']}: "
            f"TTFT <= {asked['slo_ttft_s']:g} s, TPOT <= {asked['slo_tpot_s']:g} s)"
        )
        note = (
            "predicted: by the router while the traffic ran; measured: the demo's requests of "
            "that size (* too few went there: sent straight to the engine after); medians"
        )
        table = Table()
        for col in ("backend", "GPU", "routed", "share", "TTFT predicted", "TTFT measured",
                    "end-to-end predicted", "end-to-end measured"):  # fmt: skip
            table.add_column(col, justify="left" if col == "backend" else "right")
        total = sum(routed.values()) or 1
        for b in self.body["backends"]:
            predicted = _medians(self.predicted.get(b["id"], [])) or (None, None)
            measured = _medians(self.measured.get(b["id"], [])) or (None, None)
            mark = " *" if b["id"] in self.probed else ""
            n = routed.get(b["id"], 0)
            table.add_row(
                b["id"], b["gpu"], str(n), f"{n / total:.0%}",
                seconds(predicted[0]), seconds(measured[0]) + mark,
                seconds(predicted[1]), seconds(measured[1]) + mark,
            )  # fmt: skip
        return Group(Text(heading, style="italic"), table, Text(note))

    def why(self, routed: dict) -> str:
        """One sentence: why the busiest backend took what it took."""
        asked = self.body.get("predicted_for")
        medians = {i: _medians(p) for i, p in self.predicted.items() if p}
        if not asked or not medians or not routed:
            return ""
        busiest = max(medians, key=lambda i: routed.get(i, 0))
        fastest = min(medians, key=lambda i: medians[i][0])
        if busiest != fastest:
            return (
                f"{busiest} took the most requests: the router placed each where it "
                "predicted the SLO met best at that moment, and these medians smooth that over."
            )
        gpu = next(b["gpu"] for b in self.body["backends"] if b["id"] == fastest)
        return (
            f"At light load the fastest GPU meets the SLO best, so the router sends nearly "
            f"everything to {fastest} ({gpu}, the lowest predicted TTFT); the others take "
            "work as load grows and its queue lengthens its predictions past theirs."
        )
