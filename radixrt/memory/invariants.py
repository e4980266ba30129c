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

Cost: O(number of pages + tree tokens / page_size + nodes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
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
    assert len(node.pages) == num_pages, f"{where}: {len(node.pages)} pages, span needs {num_pages}"
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
