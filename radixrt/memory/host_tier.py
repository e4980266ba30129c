"""A second KV tier in host memory under the radix tree (the scheduler's side of it).

Design: SGLang's HiCache (hierarchical radix cache): a radix node's KV may live in device pages,
in host pages, or in both. Device eviction of a node with a host copy frees only its device pages
(the node stays, host-only); a match that ends in host-only nodes gets fresh device pages and a load
is ordered; the host pool has its own LRU. This module holds the host page ids (a second
PageAllocator: the scheduler owns page ids, the worker owns the tensors) and the copies in flight.
The worker performs the copies (worker/host_pool.py) and reports their ids back (ForwardResult).

Node states (TreeNode.pages / host_pages / load_id / store_id):

    device only      pages          host_pages []
    both tiers       pages          host_pages        (store_id != 0: host copy still being written)
    host only        pages []       host_pages
    loading          pages          host_pages        load_id != 0: device pages not readable yet

The device-resident nodes form a subtree at the root (a node with device pages has a parent with
device pages), so "readable on the device" is a prefix of any match: `device_node`.

Copies and their ordering (the worker runs them on one in-order copy stream; see host_pool.py):

    load          host -> device, issued before the pass it rides with; the request waits in the
                  queue until its id comes back done. Holds a hard device ref on the destination
                  pages and a host ref on the source pages until done.
    store_after   device -> host of KV published for write-through: issued after the pass (whose
                  forward writes that KV). Holds a hard device ref on the source pages until done,
                  so a page being written to host is never freed (or reused) before the copy ends.
    store_before  device -> host on device eviction (write_back): issued before the pass, and the
                  pass waits for it on the device, so the evicted pages may be reused at once.

Write policies (SGLang's names): write_through stores every node when it is inserted;
write_through_selective stores a node once WRITE_THROUGH_THRESHOLD admissions have hit it;
write_back stores a node only when it is evicted from the device.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache, TreeNode

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
WRITE_THROUGH_THRESHOLD = 2  # admissions through a node before write_through_selective stores it
LOAD, STORE_BEFORE, STORE_AFTER = 0, 1, 2  # CopyOp.kind (also the wire value, protocol.ForwardBatch)


@dataclass(slots=True, eq=False)
class CopyOp:
    """One ordered copy of whole pages: host_pages[i] <-> device_pages[i] (direction by kind).

    nodes: the tree nodes whose load_id / store_id is this op's id (a split adds the new half).
    dev_refs / host_refs: pages this op holds a reference on until it completes.
    """

    copy_id: int
    kind: int
    host_pages: list[int]
    device_pages: list[int]
    nodes: list[TreeNode] = field(default_factory=list)
    dev_refs: list[int] = field(default_factory=list)
    host_refs: list[int] = field(default_factory=list)


class HostPageAllocator(PageAllocator):
    """A PageAllocator whose allocations are runs of consecutive host pages where the free pages
    allow: after pages were freed, the next allocation of more than one page first sorts the free
    list (a timsort of mostly sorted runs), so the stack hands out ascending ids. A run of host pages
    is one contiguous block of the worker's page-major host pool (worker/host_pool.py): one transfer."""

    __slots__ = ("_unsorted",)

    def __init__(self, num_pages: int) -> None:
        super().__init__(num_pages)
        self._unsorted = False

    def alloc(self, n: int) -> list[int] | None:
        if self._unsorted and 1 < n <= len(self._free):
            self._free.sort(reverse=True)
            self._unsorted = False
        return super().alloc(n)

    def dec_ref(self, pages: Iterable[int], *, reclaimable: bool = False) -> None:
        before = len(self._free)
        super().dec_ref(pages, reclaimable=reclaimable)
        self._unsorted |= len(self._free) != before


class HostTier:
    """Host page ids, write policy and copies in flight for one RadixCache. Scheduler-owned.

    Attaches itself to `cache.tier`; from then on the cache calls back into it (match, insert, split,
    evict, reset). Not thread-safe. Errors: ValueError for an unknown write policy or a bad size.
    """

    def __init__(self, cache: RadixCache, num_host_pages: int, write_policy: str = "write_through") -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"--hicache-write-policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        if num_host_pages < 2:
            raise ValueError("the host tier needs at least 2 pages (page 0 is reserved)")
        self.cache = cache
        self.device = cache.allocator
        self.host = HostPageAllocator(num_host_pages)  # host page ids; every reference is hard
        self.page_size = cache.page_size
        self.write_policy = write_policy
        self._ids = itertools.count(1)
        self.to_send: list[CopyOp] = []  # ordered, not yet handed to a ForwardBatch
        self.in_flight: dict[int, CopyOp] = {}  # copy id -> op, until the worker reports it done
        self.num_host_hit_tokens = 0  # tokens whose KV came back from the host (loads ordered)
        self.num_loaded_pages = self.num_stored_pages = 0
        self.num_host_evicted_tokens = 0
        cache.tier = self

    # ---------------------------------------------------------------- cache callbacks
    def device_node(self, node: TreeNode) -> TreeNode:
        """The deepest node of root..node whose whole path is readable on the device now (no
        host-only or loading node on it)."""
        path = []
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None:
            path.append(cur)
            cur = cur.parent
        best = self.cache.root
        for cur in reversed(path):
            if not cur.pages or cur.load_id:
                break
            best = cur
        return best

    def on_insert(self, node: TreeNode, tokens: Sequence[int], pages: Sequence[int]) -> None:
        """After insert reached `node` with the caller's pages of positions [0, node.end): host-only
        nodes on the path take device pages from the caller (their KV is there), then write_through
        stores a node that has no host copy yet."""
        ps = self.page_size
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None:
            if not cur.pages:
                cur.pages = list(pages[cur.start // ps : (cur.end - 1) // ps + 1])
                self.device.inc_ref(cur.pages, reclaimable=cur.lock_ref == 0)
            cur = cur.parent
        if self.write_policy == "write_through" and not node.host_pages:
            self.store(node, STORE_AFTER)

    def on_hit(self, node: TreeNode) -> None:
        """An admission matched root..node on the device: count the hit; the write-through
        policies store the nodes that reached their threshold and have no host copy."""
        if self.write_policy == "write_back":
            return
        threshold = 1 if self.write_policy == "write_through" else WRITE_THROUGH_THRESHOLD
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None:
            cur.hit_count += 1
            if cur.hit_count >= threshold and not cur.host_pages and cur.pages:
                self.store(cur, STORE_AFTER)
            cur = cur.parent

    def on_split(self, upper: TreeNode, lower: TreeNode, num_upper: int, lower_from: int) -> None:
        """RadixCache._split cut a node: split its host pages the same way (num_upper entries go
        up, the lower half keeps entries lower_from..; the cut page is then held twice) and let
        both halves follow a copy in flight."""
        upper.load_id, upper.store_id, upper.hit_count = lower.load_id, lower.store_id, lower.hit_count
        for copy_id in (lower.load_id, lower.store_id):
            if copy_id:
                self._op(copy_id).nodes.append(upper)
        if not lower.host_pages:
            return
        upper.host_pages = lower.host_pages[:num_upper]
        lower.host_pages = lower.host_pages[lower_from:]
        if lower_from < num_upper:
            self.host.inc_ref(lower.host_pages[:1])

    def drop_host_copy(self, node: TreeNode) -> None:
        """Give back the node's host pages (reset, host eviction)."""
        if node.host_pages:
            self.host.dec_ref(node.host_pages)
            node.host_pages = []

    # ---------------------------------------------------------------- copies
    def store(self, node: TreeNode, kind: int) -> bool:
        """Order a device -> host copy of node's pages into fresh host pages (evicting host LRU
        nodes for room). False, ordering nothing, when the host pool cannot make room."""
        n = len(node.pages)
        pages = self._alloc_host(n, keep=node)
        if pages is None:
            return False
        op = self._new_op(kind, pages, list(node.pages), [node])
        if kind == STORE_AFTER:  # runs beside later passes: the source pages must stay allocated
            op.dev_refs = list(node.pages)
            self.device.inc_ref(op.dev_refs)
        node.host_pages, node.store_id = pages, op.copy_id
        self.num_stored_pages += n
        return True

    def load(self, nodes: Sequence[TreeNode]) -> int | None:
        """Order host -> device copies of host-only nodes (a chain below the device subtree, parents
        first, all locked by the caller) into fresh device pages. Returns the copy id, or None,
        ordering nothing, when the device cannot make room even after evicting."""
        num = sum(len(n.host_pages) for n in nodes)
        if num > self.device.num_free_pages() + self.device.num_reclaimable_pages():
            return None
        if self.device.num_free_pages() < num:
            self.evict_device(num - self.device.num_free_pages())
        dev = self.device.alloc(num)
        if dev is None:
            return None
        host = [p for n in nodes for p in n.host_pages]
        op = self._new_op(LOAD, host, dev, list(nodes))
        op.dev_refs, op.host_refs = list(dev), list(host)  # alloc's refs are the op's
        self.host.inc_ref(host)
        i = 0
        for n in nodes:
            n.pages = dev[i : i + len(n.host_pages)]
            i += len(n.pages)
            self.device.inc_ref(n.pages, reclaimable=n.lock_ref == 0)
            n.load_id = op.copy_id
        self.num_loaded_pages += num
        return op.copy_id

    def take_ops(self) -> list[CopyOp]:
        """The copies ordered since the last call, in order; they are in flight from now on."""
        ops, self.to_send = self.to_send, []
        for op in ops:
            self.in_flight[op.copy_id] = op
        return ops

    def complete(self, copy_ids: Iterable[int]) -> None:
        """The worker finished these copies: their KV is readable, their references go."""
        for copy_id in copy_ids:
            op = self.in_flight.pop(int(copy_id))
            for n in op.nodes:
                if op.kind == LOAD and n.load_id == op.copy_id:
                    n.load_id = 0
                elif op.kind != LOAD and n.store_id == op.copy_id:
                    n.store_id = 0
            self.device.dec_ref(op.dev_refs)
            self.host.dec_ref(op.host_refs)

    def is_pending(self, copy_id: int) -> bool:
        return copy_id in self.in_flight or any(op.copy_id == copy_id for op in self.to_send)

    @property
    def has_copies(self) -> bool:
        """Copies ordered or in flight (the scheduler keeps passes going until they are done)."""
        return bool(self.to_send or self.in_flight)

    def op_refs(self) -> tuple[dict[int, int], dict[int, int]]:
        """(device page -> refs, host page -> refs) held by copies in flight (for the invariant)."""
        dev: dict[int, int] = {}
        host: dict[int, int] = {}
        for op in itertools.chain(self.to_send, self.in_flight.values()):
            for p in op.dev_refs:
                dev[p] = dev.get(p, 0) + 1
            for p in op.host_refs:
                host[p] = host.get(p, 0) + 1
        return dev, host

    def _new_op(self, kind: int, host: list[int], dev: list[int], nodes: list[TreeNode]) -> CopyOp:
        op = CopyOp(next(self._ids), kind, host, dev, nodes)
        self.to_send.append(op)
        return op

    def _op(self, copy_id: int) -> CopyOp:
        op = self.in_flight.get(copy_id)
        return op if op is not None else next(o for o in self.to_send if o.copy_id == copy_id)

    # ---------------------------------------------------------------- eviction
    def evict_device(self, num_pages: int) -> int:
        """Free device pages, LRU first, until num_pages became free (RadixCache.evict's contract).

        Candidates: unlocked, not loading nodes with device pages none of whose children has any.
        A node with a host copy keeps it and stays (host-only); without one, write_back stores it
        first (store_before), else it leaves the tree with its host-only descendants.
        """
        alloc, cache = self.device, self.cache
        free_before = alloc.num_free_pages()
        heap = [(n.last_access_time, id(n), n) for n in cache.iter_nodes() if self._device_leaf(n)]
        heapq.heapify(heap)
        while heap and alloc.num_free_pages() - free_before < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            if not node.host_pages and self.write_policy == "write_back":
                self.store(node, STORE_BEFORE)
            alloc.dec_ref(node.pages, reclaimable=True)
            node.pages = []
            cache.num_evicted_tokens += len(node.key)
            if not node.host_pages:
                self._remove_subtree(node)
            if parent is not cache.root and self._device_leaf(parent):
                heapq.heappush(heap, (parent.last_access_time, id(parent), parent))
        return alloc.num_free_pages() - free_before

    def evict_host(self, num_pages: int, keep: TreeNode | None = None) -> int:
        """Free host pages, LRU first: host-only unlocked leaves (they leave the tree), then the host
        copies of device-resident nodes (they stay, device only). Nodes with a copy in flight and
        `keep` are spared. Returns the host pages freed."""
        host, cache = self.host, self.cache
        free_before = host.num_free_pages()
        heap = [(n.last_access_time, id(n), n) for n in cache.iter_nodes() if self._host_leaf(n, keep)]
        heapq.heapify(heap)
        while heap and host.num_free_pages() - free_before < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            self._remove_subtree(node)
            if parent is not cache.root and self._host_leaf(parent, keep):
                heapq.heappush(heap, (parent.last_access_time, id(parent), parent))
        if host.num_free_pages() - free_before < num_pages:
            both = sorted((n for n in cache.iter_nodes() if n.pages and n.host_pages and n is not keep
                           and not n.store_id and not n.load_id), key=lambda n: n.last_access_time)
            for node in both:
                if host.num_free_pages() - free_before >= num_pages:
                    break
                self.drop_host_copy(node)
        return host.num_free_pages() - free_before

    def _device_leaf(self, n: TreeNode) -> bool:
        return (bool(n.pages) and n.lock_ref == 0 and not n.load_id
                and not any(c.pages for c in n.children.values()))

    @staticmethod
    def _host_leaf(n: TreeNode, keep: TreeNode | None) -> bool:
        return (not n.pages and not n.children and n.lock_ref == 0 and not n.store_id
                and n is not keep and bool(n.host_pages))

    def _alloc_host(self, n: int, keep: TreeNode | None) -> list[int] | None:
        if n > self.host.num_total_pages:
            return None
        short = n - self.host.num_free_pages()
        if short > 0:
            self.evict_host(short, keep)
        return self.host.alloc(n)

    def _remove_subtree(self, node: TreeNode) -> None:
        """Take node (no device pages left under it) and its descendants out of the tree."""
        parent = node.parent
        assert parent is not None and not node.pages
        del parent.children[node.key[0]]
        for n in _subtree(node):
            assert not n.pages, "a device-resident node below a node without device pages"
            self.num_host_evicted_tokens += len(n.key) if n.host_pages else 0
            self.cache.num_evicted_tokens += len(n.key)
            self.drop_host_copy(n)
            n.parent = None

    # ---------------------------------------------------------------- figures
    def stats(self) -> dict[str, float]:
        host = self.host
        return {
            "hicache_host_pages_total": host.num_total_pages,
            "hicache_host_pages_used": host.num_total_pages - host.num_free_pages(),
            "hicache_host_hit_tokens": self.num_host_hit_tokens,
            "hicache_loaded_pages": self.num_loaded_pages,
            "hicache_stored_pages": self.num_stored_pages,
            "hicache_copies_in_flight": len(self.in_flight) + len(self.to_send),
        }


def _subtree(node: TreeNode) -> Iterator[TreeNode]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())
