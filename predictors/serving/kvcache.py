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
    """

    def __init__(self, capacity_tokens: int | None = None, block_tokens: int = 16) -> None:
        if block_tokens < 1:
            raise WorkloadError(f"kv_block_tokens must be >= 1, got {block_tokens}")
        if capacity_tokens is not None and capacity_tokens < block_tokens:
            raise WorkloadError(f"KV capacity {capacity_tokens} tokens is less than one block ({block_tokens} tokens)")
        self.block_tokens = block_tokens
        self.total_blocks = None if capacity_tokens is None else capacity_tokens // block_tokens
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

    def can_grow(self, seq: int, extra: int) -> bool:
        if self.total_blocks is None:
            return True
        have = self.tokens.get(seq, 0)
        return self.used_blocks + self.blocks(have + extra) - self.blocks(have) <= self.total_blocks

    def grow(self, seq: int, extra: int) -> bool:
        """Reserve ``extra`` more tokens for ``seq``; False (and nothing changes) when they do not fit."""
        if not self.can_grow(seq, extra):
            return False
        have = self.tokens.get(seq, 0)
        self.used_blocks += self.blocks(have + extra) - self.blocks(have)
        self.tokens[seq] = have + extra
        return True

    def free(self, seq: int) -> None:
        self.used_blocks -= self.blocks(self.tokens.pop(seq, 0))
