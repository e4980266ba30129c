"""The memory invariant, checked from scratch (tests after every operation; scheduler debug ticks).

For a RadixCache over a PageAllocator, with external_refs = page -> references held by running
requests:

  1. allocator: a page is free xor referenced; reclaimable refs <= refs (PageAllocator.check_invariants);
  2. tree shape: children keyed by their first token, child.start == parent.end, non-empty keys,
     len(node.pages) == number of page indices the node's span touches, no page 0, no page twice in a
     node, parent.last_access_time >= child.last_access_time (so leaves are the LRU candidates),
     key_bytes (when built) == the key as int64 bytes; a namespace root (start -1, negative key, below the
     root, start -1, no pages) is exempt from the span rules;
  3. locks: node.lock_ref == node.own_lock_ref + sum(child.lock_ref), all >= 0;
  4. references: for every page, refcount == tree holders + external holders (exactly, when
     external_refs is given; >= tree holders otherwise), and the allocator's reclaimable refs ==
     holders that are unlocked tree nodes;
  5. accounting: evictable == #pages whose holders are all unlocked tree nodes, and
     free + evictable + protected == total with protected >= 0.

With a host tier (host_tier.py), `check_host_invariants` adds, and the device checks above allow
for, the second tier:

  6. a node holds device pages, host pages or both (pages == [] only for a host-only node), and a
     node with device pages has a parent with device pages (the device-resident nodes form a
     subtree at the root); host_pages, when present, has one entry per page index of the span;
  7. host references: for every host page, refcount == tree nodes holding it + copies in flight
     holding it (a page being loaded from cannot be freed), and no reclaimable host refs;
  8. a node's load_id / store_id names a copy still ordered or in flight; a loading node has both
     device and host pages; a node being stored has host pages.
  (Device refs held by copies in flight are passed in external_refs by KVManager, so rule 4 also
  says that a page being written to host is still allocated.)

Cost: O(number of pages + tree tokens / page_size + nodes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from radixrt.memory.host_tier import HostTier
    from radixrt.memory.radix_cache import RadixCache, TreeNode


def check_cache_invariants(cache: RadixCache, external_refs: Mapping[int, int] | None = None) -> None:
    """Raise AssertionError naming the first broken invariant (see module docstring)."""
    alloc = cache.allocator
    alloc.check_invariants()
    tree_refs: Counter[int] = Counter()
    unlocked_refs: Counter[int] = Counter()
    root = cache.root
    assert root.key == () and root.pages == [] and root.start == 0 and root.parent is None, "bad root"
    assert not (cache.disable and root.children), "disabled cache has nodes"
    _check_node_locks(root)
    for node in cache.iter_nodes():
        _check_node_shape(node, cache.page_size)
        _check_node_locks(node)
        tree_refs.update(node.pages)
        if node.lock_ref == 0:
            unlocked_refs.update(node.pages)
    if external_refs is not None:
        bad = [p for p, c in external_refs.items() if not 0 < p < alloc.num_pages or c <= 0]
        assert not bad, f"external refs name invalid pages or counts: {bad}"
    num_evictable = 0
    for page in range(1, alloc.num_pages):
        refs, tree, soft = alloc.refcount(page), tree_refs[page], unlocked_refs[page]
        if external_refs is not None:
            ext = external_refs.get(page, 0)
            assert refs == tree + ext, (
                f"page {page}: refcount {refs} != tree holders {tree} + request holders {ext}"
            )
        else:
            assert refs >= tree, f"page {page}: refcount {refs} < tree holders {tree}"
        assert alloc.reclaimable_refs(page) == soft, (
            f"page {page}: allocator counts {alloc.reclaimable_refs(page)} reclaimable refs, "
            f"but {soft} unlocked tree nodes hold it"
        )
        num_evictable += refs > 0 and refs == soft
    free, evictable, protected = alloc.num_free_pages(), cache.evictable_size(), cache.protected_size()
    assert evictable == num_evictable, f"evictable_size {evictable} != recount {num_evictable}"
    assert protected >= 0, f"protected_size {protected} < 0"
    assert free + evictable + protected == alloc.num_total_pages, (
        f"free {free} + evictable {evictable} + protected {protected} != total {alloc.num_total_pages}"
    )


def _check_node_shape(node: TreeNode, page_size: int) -> None:
    parent = node.parent
    where = f"node at [{node.start}, {node.end})"
    assert parent is not None, f"{where}: reachable but detached"
    if node.start < 0:  # a namespace root (RadixCache.namespace_root)
        assert parent.parent is None and node.start == -1 and not node.pages, f"{where}: bad namespace root"
        assert parent.children.get(node.key[0]) is node, f"{where}: not keyed by its namespace"
        return
    assert node.key, f"{where}: empty key"
    assert parent.children.get(node.key[0]) is node, f"{where}: not keyed by its first token"
    assert node.start == parent.end, f"{where}: parent ends at {parent.end}"
    num_pages = (node.end - 1) // page_size - node.start // page_size + 1
    if node.pages or not node.host_pages:  # [] device pages: a host-only node (rule 6)
        assert len(node.pages) == num_pages, f"{where}: {len(node.pages)} pages, span needs {num_pages}"
    if node.pages and parent.parent is not None and parent.start >= 0:  # not under a root
        assert parent.pages, f"{where}: on the device below a node that is not"
    assert 0 not in node.pages, f"{where}: holds reserved page 0"
    assert len(set(node.pages)) == len(node.pages), f"{where}: a page twice in {node.pages}"
    assert parent.last_access_time >= node.last_access_time, f"{where}: accessed after its parent"
    assert node.key_bytes is None or node.key_bytes == np.array(node.key, np.int64).tobytes(), (
        f"{where}: key_bytes do not match the key")


def _check_node_locks(node: TreeNode) -> None:
    expected = node.own_lock_ref + sum(c.lock_ref for c in node.children.values())
    assert node.own_lock_ref >= 0, f"node at {node.start}: own_lock_ref {node.own_lock_ref} < 0"
    assert node.lock_ref == expected, (
        f"node at [{node.start}, {node.end}): lock_ref {node.lock_ref} != own {node.own_lock_ref} "
        f"+ children {expected - node.own_lock_ref}"
    )


def check_host_invariants(tier: HostTier, op_refs: Mapping[int, int]) -> None:
    """Rules 6-8 of the module docstring for a HostTier; op_refs: host page -> references held by
    copies ordered or in flight. Raises AssertionError naming the first broken rule."""
    host, cache = tier.host, tier.cache
    host.check_invariants()
    tree_refs: Counter[int] = Counter()
    for node in cache.iter_nodes():
        where = f"node at [{node.start}, {node.end})"
        hp = node.host_pages
        if hp:
            num_pages = (node.end - 1) // cache.page_size - node.start // cache.page_size + 1
            assert len(hp) == num_pages, f"{where}: {len(hp)} host pages, span needs {num_pages}"
            assert 0 not in hp and len(set(hp)) == len(hp), f"{where}: bad host pages {hp}"
            tree_refs.update(hp)
        if node.load_id:
            assert tier.is_pending(node.load_id), f"{where}: load {node.load_id} is not in flight"
            assert node.pages and hp, f"{where}: loading without device and host pages"
        if node.store_id:
            assert tier.is_pending(node.store_id), f"{where}: store {node.store_id} is not in flight"
            assert hp, f"{where}: being stored without host pages"
    for page in range(1, host.num_pages):
        refs, want = host.refcount(page), tree_refs[page] + op_refs.get(page, 0)
        assert refs == want, (f"host page {page}: refcount {refs} != tree holders {tree_refs[page]} "
                              f"+ copy holders {op_refs.get(page, 0)}")
        assert host.reclaimable_refs(page) == 0, f"host page {page}: reclaimable host refs"
