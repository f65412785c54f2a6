"""The one candidate sampler: every candidate of a small pool, a random few of a large one.

A pick over thousands of backends cannot score them all (each SLO-aware score is a latency
prediction). Pools up to `full_scan_max` are taken whole; larger ones are sampled:
- `uniform` (least outstanding work, prefix affinity): `draws` distinct candidates, the
  power of d choices;
- `per_type` (SLO-aware): `draws` of each GPU type with replacement, keeping the `keep`
  least loaded of each, so a sampled pool still sees every kind of GPU.
A policy that adds backends beyond the sample (prefix holders) does so itself."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext

# the routable list it was made from, its backends by GPU type, and by id
_Grouping = tuple[Sequence[Backend] | None, list[list[Backend]], dict[str, Backend]]


class CandidateSampler:
    def __init__(self, full_scan_max: int, draws: int, *, per_type_keep: int | None = None) -> None:
        if full_scan_max < 1 or draws < 1 or (per_type_keep is not None and per_type_keep < 1):
            raise ValueError("full_scan_max, draws and per_type_keep must be >= 1")
        if per_type_keep is not None and draws < per_type_keep:
            raise ValueError("draws per type must be >= the number kept per type")
        self.full_scan_max = full_scan_max
        self.draws = draws
        self.per_type_keep = per_type_keep
        self._groups: _Grouping = (None, [], {})

    def sample(
        self,
        ctx: PickContext,
        candidates: Sequence[Backend],
        load: Callable[[Backend], float] | None = None,
    ) -> Sequence[Backend]:
        """The candidates to compare (`load` ranks a GPU type's draws when sampling per
        type). The trace notes how many a sampled pool kept."""
        n = len(candidates)
        if n <= self.full_scan_max:
            return candidates
        if self.per_type_keep is None:
            chosen = [candidates[i] for i in distinct_indices(ctx.rng, n, self.draws)]
        else:
            assert load is not None, "a per-type sample ranks each type's draws by load"
            chosen = self._per_type(ctx, candidates, load)
        if ctx.trace is not None:
            ctx.trace.sampled = len(chosen)
        return chosen

    def _per_type(
        self, ctx: PickContext, candidates: Sequence[Backend], load: Callable[[Backend], float]
    ) -> list[Backend]:
        groups, _ = self.by_type(candidates)
        chosen: list[Backend] = []
        draw, k, keep = ctx.rng.random, self.draws, self.per_type_keep
        for group in groups:
            n = len(group)
            # with replacement: k cheap draws, not random.sample's bookkeeping
            drawn = [group[int(draw() * n)] for _ in range(k)] if n > k else group
            if keep == 1:
                chosen.append(min(drawn, key=load))
            else:
                chosen.extend(heapq.nsmallest(keep, dict.fromkeys(drawn), key=load))
        return chosen

    def by_type(
        self, candidates: Sequence[Backend]
    ) -> tuple[list[list[Backend]], dict[str, Backend]]:
        """The candidates grouped by GPU type, and by id. The routable list is cached by
        BackendSet until the fleet changes, so its grouping is kept while the very same list
        object comes back (held here, so its identity cannot pass to another list)."""
        held, groups, by_id = self._groups
        if candidates is not held:
            by_type: dict[str, list[Backend]] = {}
            for b in candidates:
                by_type.setdefault(b.gpu_type, []).append(b)
            groups, by_id = list(by_type.values()), {b.backend_id: b for b in candidates}
            self._groups = (candidates, groups, by_id)
        return groups, by_id


def distinct_indices(rng: random.Random, n: int, k: int) -> list[int]:
    """`rng.sample(range(n), k)`: the same indices from the same generator, drawn as
    random.sample draws them from a population much larger than `k` (each a rejection
    draw of `getrandbits`, redrawn while taken), without its per-call checks, which cost
    a pick over 1,000 backends more than the rest of its sampling. Small populations and
    generators of another kind go to `rng.sample` itself."""
    setsize = 21  # random.sample's own threshold between its two methods
    if k > 5:
        setsize += 4 ** math.ceil(math.log(k * 3, 4))
    if n <= setsize or type(rng) is not random.Random:
        return rng.sample(range(n), k)
    getrandbits, bits = rng.getrandbits, n.bit_length()
    taken: set[int] = set()
    chosen: list[int] = []
    for _ in range(k):
        j = getrandbits(bits)
        while j >= n or j in taken:
            j = getrandbits(bits)
        taken.add(j)
        chosen.append(j)
    return chosen
