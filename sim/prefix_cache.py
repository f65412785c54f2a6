"""An engine's prefix cache: LRU of 512-token KV blocks keyed by chained block hashes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(0, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.lookups = 0  # blocks asked for
        self.hits = 0  # blocks found

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """Number of leading blocks already cached (refreshing them), counted as hits."""
        cached = self._blocks
        depth = 0
        for block in blocks:
            if block not in cached:
                break
            cached.move_to_end(block)
            depth += 1
        self.lookups += len(blocks)
        self.hits += depth
        return depth

    def insert(self, blocks: Sequence[int]) -> None:
        if not self.capacity_blocks:
            return
        cached = self._blocks
        for block in blocks:
            cached[block] = None
            cached.move_to_end(block)
        while len(cached) > self.capacity_blocks:
            cached.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
