"""Prompt prefix blocks: the 512-token unit of KV caching, and a bounded LRU over them.

Both sides of prefix caching use it: an engine's cache (which blocks it holds) and the
router's index (which backend last received each block)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 512


class BlockLru:
    """Block hash → value, bounded; the least recently put or matched block goes first."""

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._entries: OrderedDict[int, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, block: int) -> object | None:
        """The block's value without refreshing it."""
        return self._entries.get(block)

    def match_leading(self, blocks: Sequence[int]) -> int:
        """How many leading blocks are present; those are refreshed."""
        entries = self._entries
        depth = 0
        for block in blocks:
            if block not in entries:
                break
            entries.move_to_end(block)
            depth += 1
        return depth

    def put(self, blocks: Sequence[int], value: object = None) -> None:
        """Insert or refresh `blocks` with `value`, evicting the oldest beyond capacity."""
        if not self.capacity:
            return
        entries = self._entries
        for block in blocks:
            entries[block] = value
            entries.move_to_end(block)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
