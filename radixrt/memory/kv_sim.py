"""A simulated KV pool for CPU tests of the memory bookkeeping (no model, no torch).

Real KV at position p is a function of the whole prefix tokens[0..p]. The simulation stores, per slot,
a 61-bit rolling hash of exactly that prefix, written where a worker would write K/V (the slots
returned by reserve) and copied where it would copy pages (copy-on-write pairs). A check then proves
that a page table or a tree node really holds the KV of the tokens it claims: any page-sharing,
copy-on-write or use-after-free bug shows up as a content mismatch. Used by tests/memory and usable
by scheduler tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from radixrt.memory.page_allocator import PageAllocator

if TYPE_CHECKING:
    from radixrt.memory.host_tier import CopyOp
    from radixrt.memory.kv_manager import KVManager, ReqKV
    from radixrt.memory.radix_cache import RadixCache

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def prefix_hashes(token_ids: Sequence[int]) -> list[int]:
    """h[p] identifies token_ids[0..p] (rolling hash mod 2**61 - 1)."""
    out, h = [], 0
    for t in token_ids:
        h = (h * _BASE + t + 1) % _MOD
        out.append(h)
    return out


class SimKVPool:
    """slot -> prefix hash of the KV 'stored' there. Absent slot = garbage (never written or freed).

    `host` is the same for the host tier's pool (host slot = host page * page_size + offset), filled
    and read by `apply_copies` in the order the worker runs them.
    """

    __slots__ = ("page_size", "content", "host")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.content: dict[int, int] = {}
        self.host: dict[int, int] = {}

    def apply_copies(self, ops: Iterable[CopyOp]) -> None:
        """Run host-tier copies (KVManager.take_copy_ops) as the worker does: whole pages, loads
        host -> device, stores device -> host, in order."""
        from radixrt.memory.host_tier import LOAD

        for op in ops:
            src, dst = (self.host, self.content) if op.kind == LOAD else (self.content, self.host)
            pairs = zip(op.host_pages, op.device_pages, strict=True)
            _copy_slots(src, dst, [(h, d) if op.kind == LOAD else (d, h) for h, d in pairs], self.page_size)

    def write(self, slots: Sequence[int], token_ids: Sequence[int], start: int,
              allocator: PageAllocator | None = None) -> None:
        """Write the KV of positions [start, start + len(slots)) of token_ids into slots.

        With allocator: assert every written page has refcount 1 (a shared page is never written).
        """
        hashes = prefix_hashes(token_ids[: start + len(slots)])
        for i, slot in enumerate(slots):
            page = slot // self.page_size
            if allocator is not None:
                assert allocator.refcount(page) == 1, (
                    f"write of position {start + i} into page {page} with refcount {allocator.refcount(page)}"
                )
            self.content[slot] = hashes[start + i]

    def copy_pages(self, cow: Iterable[tuple[int, int]]) -> None:
        """Apply copy-on-write pairs (src page -> dst page), whole pages, as the worker does."""
        _copy_slots(self.content, self.content, cow, self.page_size)

    def poison_free(self, allocator: PageAllocator, host: PageAllocator | None = None) -> None:
        """Forget the content of every free page (and free host page), so that reading one later
        fails the checks."""
        ps = self.page_size
        for alloc, content in ((allocator, self.content), (host, self.host)):
            if alloc is None:
                continue
            for page in alloc.free_pages():
                for off in range(ps):
                    content.pop(page * ps + off, None)

    def check(self, pages: Sequence[int], token_ids: Sequence[int], length: int, what: str = "") -> None:
        """Assert positions [0, length) read through pages hold the KV of token_ids' prefixes."""
        ps = self.page_size
        hashes = prefix_hashes(token_ids[:length])
        assert len(hashes) == length, f"{what}: only {len(hashes)} tokens for {length} positions"
        for p in range(length):
            slot = pages[p // ps] * ps + p % ps
            got = self.content.get(slot)
            assert got == hashes[p], (
                f"{what}: position {p} (token {token_ids[p]}) read from slot {slot} of page {pages[p // ps]}"
                f" holds {'nothing' if got is None else 'the KV of another prefix'}"
            )

    def check_tree(self, cache: RadixCache) -> None:
        """Assert every tree node's pages (device, and host when it has a host copy) hold its
        path's KV, including, in its first page, the positions before node.start that
        match_prefix may read through it."""
        ps = self.page_size
        stack = [(child, ()) for child in cache.root.children.values()]
        while stack:
            node, parent_path = stack.pop()
            if node.start < 0:  # a namespace root: its subtree starts at position 0 again
                stack.extend((child, ()) for child in node.children.values())
                continue
            path = parent_path + node.key
            hashes = prefix_hashes(path)
            first = node.start // ps
            for pages, content, tier in ((node.pages, self.content, "device"),
                                         (node.host_pages, self.host, "host")):
                for p in range(first * ps, node.end) if pages else ():
                    page = pages[p // ps - first]
                    got = content.get(page * ps + p % ps)
                    assert got == hashes[p], (
                        f"tree node [{node.start}, {node.end}): {tier} page {page} position {p} holds "
                        f"{'nothing' if got is None else 'the KV of another prefix'}"
                    )
            stack.extend((child, path) for child in node.children.values())


def _copy_slots(src: dict[int, int], dst: dict[int, int], pairs: Iterable[tuple[int, int]],
                page_size: int) -> None:
    """Copy whole pages src page -> dst page between two slot maps (garbage copies as garbage)."""
    for s, d in pairs:
        for off in range(page_size):
            value = src.get(s * page_size + off)
            if value is None:
                dst.pop(d * page_size + off, None)
            else:
                dst[d * page_size + off] = value


def check_world(manager: KVManager, pool: SimKVPool,
                requests: Iterable[tuple[ReqKV, Sequence[int]]]) -> None:
    """Full check: invariants with the requests' refs, tree content, each request's content.

    requests: (kv, tokens) of every live request, tokens covering at least kv.kv_len positions.
    """
    reqs = list(requests)
    manager.check_invariants(kv for kv, _ in reqs)
    pool.check_tree(manager._cache)  # a check from inside the memory package: sees the tree
    for i, (kv, tokens) in enumerate(reqs):
        pool.check(kv.pages, tokens, kv.kv_len, what=f"request {i}")
