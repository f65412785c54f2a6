"""An engine's prefix cache: which 512-token KV blocks it holds, with hit counters."""

from __future__ import annotations

from collections.abc import Sequence

from gpuroute.prefix_blocks import BlockLru


class PrefixCache:
    def __init__(self, capacity_blocks: int) -> None:
        self._blocks = BlockLru(capacity_blocks)
        self.lookups = 0  # blocks asked for
        self.hits = 0  # blocks found

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def capacity_blocks(self) -> int:
        return self._blocks.capacity

    def match(self, blocks: Sequence[int]) -> int:
        """Number of leading blocks already cached (refreshing them), counted as hits."""
        depth = self._blocks.match_leading(blocks)
        self.lookups += len(blocks)
        self.hits += depth
        return depth

    def insert(self, blocks: Sequence[int]) -> None:
        self._blocks.put(blocks)

    def clear(self) -> None:
        self._blocks.clear()
