"""KV-cache capacity in blocks of tokens (vLLM's paged cache, without the page tables)."""
from __future__ import annotations

import math

from .arrivals import WorkloadError


class KVCache:
    """``capacity_tokens`` tokens in blocks of ``block_tokens``; ``None`` capacity = unlimited.

    A sequence holding ``n`` tokens uses ``ceil(n / block_tokens)`` blocks.

    >>> kv = KVCache(64, 16)               # 4 blocks
    >>> kv.grow(1, 20), kv.used_blocks     # 20 tokens -> 2 blocks
    (True, 2)
    >>> kv.grow(2, 40), kv.grow(2, 30), kv.used_blocks
    (False, True, 4)
    >>> kv.grow(1, 20)                     # 40 tokens would need a third block
    False
    >>> kv.free(2); kv.used_blocks
    2

    ``watermark``: the fraction of the blocks a new admission must leave free (vLLM V0's
    ``watermark``, Vidur's ``watermark_blocks_fraction``), so running sequences can grow before one
    has to be preempted; growing an admitted sequence may use them.

    >>> kv = KVCache(160, 16, watermark=0.2)  # 10 blocks, 2 kept free at admission
    >>> kv.can_admit(1, 128), kv.can_admit(1, 129), kv.can_grow(1, 160)
    (True, False, True)
    """

    def __init__(self, capacity_tokens: int | None = None, block_tokens: int = 16, watermark: float = 0.0) -> None:
        if block_tokens < 1:
            raise WorkloadError(f"kv_block_tokens must be >= 1, got {block_tokens}")
        if capacity_tokens is not None and capacity_tokens < block_tokens:
            raise WorkloadError(f"KV capacity {capacity_tokens} tokens is less than one block ({block_tokens} tokens)")
        self.block_tokens = block_tokens
        self.total_blocks = None if capacity_tokens is None else capacity_tokens // block_tokens
        self.watermark_blocks = 0 if self.total_blocks is None else int(watermark * self.total_blocks)
        self.tokens: dict[int, int] = {}
        self.used_blocks = 0

    def blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_tokens)

    def fits_ever(self, tokens: int) -> bool:
        """Whether one sequence of ``tokens`` fits in an empty cache."""
        return self.total_blocks is None or self.blocks(tokens) <= self.total_blocks

    def free_tokens(self) -> int | None:
        """Tokens the free blocks hold (None: unlimited)."""
        return None if self.total_blocks is None else (self.total_blocks - self.used_blocks) * self.block_tokens

    def _more_blocks(self, seq: int, extra: int) -> int:
        have = self.tokens.get(seq, 0)
        return self.blocks(have + extra) - self.blocks(have)

    def can_grow(self, seq: int, extra: int) -> bool:
        return self.total_blocks is None or self.used_blocks + self._more_blocks(seq, extra) <= self.total_blocks

    def can_admit(self, seq: int, extra: int) -> bool:
        """:meth:`can_grow`, leaving at least ``watermark_blocks`` free: the test for a new admission."""
        return self.total_blocks is None or (self.used_blocks + self._more_blocks(seq, extra)
                                             <= self.total_blocks - self.watermark_blocks)

    def grow(self, seq: int, extra: int) -> bool:
        """Reserve ``extra`` more tokens for ``seq``; False (and nothing changes) when they do not fit."""
        if not self.can_grow(seq, extra):
            return False
        self.used_blocks += self._more_blocks(seq, extra)
        self.tokens[seq] = self.tokens.get(seq, 0) + extra
        return True

    def free(self, seq: int) -> None:
        self.used_blocks -= self.blocks(self.tokens.pop(seq, 0))
