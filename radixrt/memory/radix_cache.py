"""Radix tree of token ids over reference-counted KV pages (the prefix cache).

Design: RadixAttention (Zheng et al., "SGLang: Efficient Execution of Structured Language Model
Programs", 2023): KV of finished and running requests stays in a radix tree keyed by token ids; a new
request reuses the KV of its longest cached prefix; unlocked leaves are evicted in LRU order. Pages and
reference counts follow PagedAttention (Kwon et al., SOSP 2023).

The tree is kept at token granularity, independent of the page size. A node covering token positions
[start, end) holds the pages of page indices start // page_size .. (end - 1) // page_size, one
reference on each. A node boundary may therefore fall inside a page: parent and child then both
reference that page (or the child a copy of it). Every page of a node holds the KV of the node's whole
root-to-node path for the positions it covers, including positions before `start` that lie in the same
page. A page held by the tree is never written (copy-on-write, see kv_manager.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixrt.memory.invariants import check_cache_invariants
from radixrt.memory.page_allocator import PageAllocator


@dataclass(slots=True, eq=False)
class TreeNode:
    """One edge of the radix tree: a span of tokens and the pages holding their KV.

    Compared and hashed by identity. A node keeps its identity when it is split: the new node is the
    *upper* half, so a request that locked this node still locks exactly the tokens it matched.
    """

    key: tuple[int, ...]  # token ids of positions [start, end)
    pages: list[int]  # pages of page indices start // page_size .. (end - 1) // page_size; one ref each
    start: int  # absolute position (tokens from the root) of key[0]
    parent: TreeNode | None = field(repr=False)  # None for the root and for nodes no longer in the tree
    children: dict[int, TreeNode] = field(default_factory=dict, repr=False)  # child.key[0] -> child
    lock_ref: int = 0  # locks on this node or any descendant (own_lock_ref + sum of children's lock_ref)
    own_lock_ref: int = 0  # inc_lock_ref calls that named this node
    last_access_time: int = 0  # logical clock of the last match/insert through this node (LRU key)
    # key as int64 bytes, built at the first compare with a query given as bytes (match_prefix's
    # token_bytes); split with the key
    key_bytes: bytes | None = field(default=None, repr=False)
    # host tier (host_tier.py; all empty / 0 without one): host_pages mirrors `pages` page index for
    # page index, one host reference each ([] = no host copy); `pages` is [] when the node lives on
    # the host only. load_id != 0: its device pages are being loaded (not readable yet); store_id != 0:
    # its host pages are being written. hit_count: admissions through it (write_through_selective).
    host_pages: list[int] = field(default_factory=list, repr=False)
    load_id: int = 0
    store_id: int = 0
    hit_count: int = 0

    @property
    def end(self) -> int:
        """Position one past the node's last token (== prefix length at this node)."""
        return self.start + len(self.key)


@dataclass(slots=True)
class MatchResult:
    """Longest cached prefix of a query.

    pages: ceil(prefix_len / page_size) pages covering positions [0, prefix_len); the last one may be
    partially filled and is shared with the tree (never write it: copy it first). The result takes no
    references: pages and last_node are safe to use only until the next evict, unless the caller locks
    last_node (inc_lock_ref) and takes its own refs on the pages first.
    """

    prefix_len: int
    pages: list[int]
    last_node: TreeNode
    # with a host tier: the match through host-only (or loading) nodes too, which prefix_len, pages
    # and last_node (the part readable on the device now) stop before; else == prefix_len, last_node
    host_prefix_len: int = 0
    host_last_node: TreeNode | None = None


@dataclass(slots=True)
class MatchHint:
    """The last match of one query, kept by the caller (a waiting request) to make the next match
    of the same tokens O(depth) while the tree has not changed around it; see
    `RadixCache.match_prefix`. Pass a fresh MatchHint() the first time; match_prefix updates it."""

    last_node: TreeNode | None = None
    prefix_len: int = 0
    query_len: int = -1  # len(token_ids) of the match; -1: no match recorded yet


class RadixCache:
    """Prefix cache over a PageAllocator. The scheduler owns it; it is not thread-safe.

    References: the tree holds exactly one reference per entry of each node's `pages`. Those of an
    unlocked node are reclaimable (see PageAllocator); locking a node makes the refs of its whole path
    hard. Invariants: see `check_invariants` (radixrt/memory/invariants.py).
    With disable=True the tree stays empty: match_prefix finds nothing and insert is a no-op.
    """

    def __init__(self, allocator: PageAllocator, page_size: int, disable: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.root = TreeNode(key=(), pages=[], start=0, parent=None)
        self._clock = 0  # logical time for LRU; bumped once per match/insert
        self.total_queried_tokens = 0
        self.total_matched_tokens = 0
        self.num_evicted_tokens = 0  # tokens removed by evict (statistics, tests)
        self.tier: Any = None  # a HostTier (host_tier.py) attaches itself here; None: one tier

    # ---------------------------------------------------------------- lookup / insert
    def match_prefix(self, token_ids: Sequence[int], *, end: int | None = None, record_stats: bool = False,
                     hint: MatchHint | None = None, token_bytes: bytes | None = None,
                     root: TreeNode | None = None) -> MatchResult:
        """Find the longest cached prefix of token_ids[:end] (end None: all of them); O(prefix_len + depth).

        Splits the node in which the match ends, so last_node.end == prefix_len. Takes no references;
        refreshes last_access_time along the path. record_stats=True adds the lookup to the hit-rate
        counters; KVManager.admit does so, scheduling-policy probes (LPM ordering) should not.
        `end` saves the caller a copy of a long token list (e.g. all but a request's last token).

        hint: the caller's MatchHint for these same tokens (a waiting request probed at every
        schedule). When the previous match it records still holds (`_hint_holds`), the walk is
        skipped: same result and same side effects (LRU refresh of the path, clock, stats; no split
        is needed since that match ended at its node's end), in O(depth). The hint is updated to
        this match either way.

        token_bytes: optional int64 (native order) bytes of a prefix of token_ids, e.g. a request's
        prompt (bytes past `end` are ignored): the tokens it covers are compared with a node's key
        as one memcmp instead of a compare per token.

        root: a namespace root (`namespace_root`) to match under instead of the shared root.
        """
        n = len(token_ids) if end is None else end
        if not 0 <= n <= len(token_ids):
            raise ValueError(f"end {end} outside the {len(token_ids)} tokens given")
        node, matched = root or self.root, 0
        if self.disable or n == 0:
            pass
        elif hint is not None and self._hint_holds(hint, token_ids, n):
            node, matched = hint.last_node, hint.prefix_len  # type: ignore[assignment]
            self._touch_path(node)
        else:
            node, matched = self._walk(token_ids, n, root, token_bytes=token_bytes)
        if hint is not None:
            hint.last_node, hint.prefix_len, hint.query_len = node, matched, n
        full, full_len = node, matched
        if self.tier is not None:
            node = self.tier.device_node(node)
            matched = node.end
        if record_stats:
            self.total_queried_tokens += n
            self.total_matched_tokens += matched
        return MatchResult(prefix_len=matched, pages=self._path_pages(node), last_node=node,
                           host_prefix_len=full_len, host_last_node=full)

    def _hint_holds(self, hint: MatchHint, token_ids: Sequence[int], n: int) -> bool:
        """Whether a walk of token_ids[:n] would end where `hint` says, without splitting anything.

        The hint's match ended at the end of its node (the walk splits there), and later changes of
        the tree can alter it only (a) by removing that node (evict / reset detach it; ancestors
        go only after it), or (b) by adding a child there on the query's next token (insert). A
        split elsewhere on the path keeps the node, its end, and the page ids of the path. The
        caller guarantees that token_ids[:prefix_len] are the tokens it matched before (a waiting
        request's tokens do not change; the tree never holds a token still in flight).
        """
        node, m = hint.last_node, hint.prefix_len
        if node is None or hint.query_len != n or node.end != m:
            return False
        if node.parent is None and node is not self.root:  # evicted or flushed
            return False
        return m == n or token_ids[m] not in node.children

    def namespace_root(self, ns_key: int) -> TreeNode:
        """The root of namespace ns_key (< 0), created on first use (cache_salt tenants).

        A namespace root is a child of the shared root keyed by ns_key (never a token id, which is
        >= 0, so no walk from the shared root enters it) with key (ns_key,), start -1 and no pages:
        its end is 0, so the subtree below it is an ordinary tree of positions [0, ...). Walks that
        start there (match_prefix(root=...), insert(start=...)) see only that namespace. Evicted
        like any leaf once empty and unlocked. Raises ValueError for ns_key >= 0.
        """
        if ns_key >= 0:
            raise ValueError(f"namespace keys are negative, got {ns_key}")
        node = self.root.children.get(ns_key)
        if node is None:
            node = self.root.children[ns_key] = TreeNode(key=(ns_key,), pages=[], start=-1, parent=self.root,
                                                         last_access_time=self._clock)
        return node

    def insert(self, token_ids: Sequence[int], pages: Sequence[int], start: TreeNode | None = None,
               end: int | None = None) -> int:
        """Publish token_ids[:end] (end None: all) whose KV lies in pages; return how many leading
        tokens were already cached.

        pages covers positions [0, end): entry i holds positions [i*page_size, (i+1)*page_size)
        (at least ceil(end / page_size) entries; extra ones are ignored). The tree takes its own
        reference on the pages of the new suffix only (page indices prefix // page_size ..); the caller
        keeps its references and stays responsible for them. No-op returning 0 when disabled.

        start: optional node whose path is known to hold token_ids[:start.end] (e.g. the node a
        request has locked, see KVManager); the walk begins there instead of at the root, with the
        same result and side effects. Ignored when it ends beyond `end`.
        """
        n = len(token_ids) if end is None else end
        if self.disable or n == 0:
            return 0
        return self._insert(token_ids, n, pages, start)[0]

    def insert_path(self, token_ids: Sequence[int], pages: Sequence[int], start: TreeNode | None = None,
                    end: int | None = None) -> TreeNode:
        """insert(token_ids, pages, start, end), then return the node that ends at `end` (one walk,
        where insert + match_prefix take two). Raises ValueError when disabled or nothing is given."""
        n = len(token_ids) if end is None else end
        if self.disable or n == 0:
            raise ValueError("insert_path needs an enabled cache and at least one token")
        return self._insert(token_ids, n, pages, start)[1]

    def _insert(self, tokens: Sequence[int], n: int, pages: Sequence[int], start: TreeNode | None = None
                ) -> tuple[int, TreeNode]:
        """(tokens already cached, node ending at n) for tokens[:n]; see insert."""
        ps = self.page_size
        if n > len(tokens):
            raise ValueError(f"end {n} outside the {len(tokens)} tokens given")
        num_needed = (n + ps - 1) // ps
        if len(pages) < num_needed:
            raise ValueError(f"{n} tokens need {num_needed} pages, got {len(pages)}")
        if start is not None:
            self._check_attached(start)
            if start.end > n:
                start = None
        node, matched = self._walk(tokens, n, start)
        if matched < n:
            new_pages = list(pages[matched // ps : num_needed])
            self.allocator.inc_ref(new_pages, reclaimable=True)
            leaf = TreeNode(
                key=tuple(tokens[matched:n]), pages=new_pages, start=matched, parent=node,
                last_access_time=node.last_access_time,
            )
            node.children[tokens[matched]] = leaf
            if self.tier is not None:
                self.tier.on_insert(leaf, tokens, pages)
            return matched, leaf
        if self.tier is not None:
            self.tier.on_insert(node, tokens, pages)
        return matched, node

    def _walk(self, tokens: Sequence[int], n: int, start: TreeNode | None = None,
              token_bytes: bytes | None = None) -> tuple[TreeNode, int]:
        """Descend along tokens[:n], splitting the node where the match ends inside it.

        Returns (deepest matched node, matched length). Starts at the root, or at `start` when the
        caller knows that start's path holds tokens[:start.end] (the root walk would pass through
        it). Every node on the matched path, the root included, gets the same new access time.
        token_bytes: see match_prefix.
        """
        node = self.root if start is None else start
        now = self._touch_path(node)
        pos = node.end
        children = node.children
        # tokens [0, covered) can be compared as bytes
        covered = 0 if token_bytes is None else min(n, len(token_bytes) // 8)
        while pos < n:
            child = children.get(tokens[pos])
            if child is None:
                break
            key = child.key
            stop = pos + len(key)
            if stop <= covered:
                key_bytes = child.key_bytes
                if key_bytes is None:
                    try:
                        key_bytes = child.key_bytes = np.array(key, np.int64).tobytes()
                    except OverflowError:  # a token outside int64: no bytes form, compare as ints
                        key_bytes = b""  # (never equal to the non-empty query slice)
                k = (len(key) if token_bytes[8 * pos : 8 * stop] == key_bytes  # type: ignore[index]
                     else _common_prefix_len(key, tokens, pos, n))
            else:
                k = _common_prefix_len(key, tokens, pos, n)
            if k < len(key):
                child = self._split(child, k)
            child.last_access_time = now
            node, pos, children = child, pos + k, child.children
        return node, pos

    def _touch_path(self, node: TreeNode) -> int:
        """Advance the LRU clock and stamp node and its ancestors with it (a walk's refresh)."""
        now = self._clock = self._clock + 1
        cur: TreeNode | None = node
        while cur is not None:
            cur.last_access_time = now
            cur = cur.parent
        return now

    def _path_pages(self, node: TreeNode) -> list[int]:
        """Pages of positions [0, node.end): for each page index, the page of the deepest node on the
        path covering it (the one covering the last position of the path in that page)."""
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        ps, pages = self.page_size, []
        for cur in reversed(path):
            pages[cur.start // ps :] = cur.pages  # replaces a shared boundary page, then extends
        return pages

    def _split(self, node: TreeNode, k: int) -> TreeNode:
        """Cut node after its first k tokens; return the new upper node (node keeps the lower part)."""
        ps = self.page_size
        cut = node.start + k
        first_index = node.start // ps
        upper = TreeNode(
            key=node.key[:k], pages=node.pages[: (cut - 1) // ps - first_index + 1], start=node.start,
            parent=node.parent, lock_ref=node.lock_ref, last_access_time=node.last_access_time,
        )
        assert node.parent is not None
        node.parent.children[node.key[0]] = upper
        node.key = node.key[k:]
        node.pages = node.pages[cut // ps - first_index :]
        node.start = cut
        node.parent = upper
        upper.children[node.key[0]] = node
        if node.key_bytes is not None:
            upper.key_bytes, node.key_bytes = node.key_bytes[: 8 * k], node.key_bytes[8 * k :]
        if cut % ps:  # the page holding the cut is now held by both halves
            self.allocator.inc_ref(node.pages[:1], reclaimable=node.lock_ref == 0)
        if self.tier is not None:
            self.tier.on_split(upper, node, (cut - 1) // ps - first_index + 1, cut // ps - first_index)
        return upper

    # ---------------------------------------------------------------- locking
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock the path root..node: none of it can be evicted until the matching dec_lock_ref."""
        self._check_attached(node)
        node.own_lock_ref += 1
        cur: TreeNode | None = node
        while cur is not None:
            if cur.lock_ref == 0 and cur.pages:
                self.allocator.set_reclaimable(cur.pages, False)
            cur.lock_ref += 1
            cur = cur.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one inc_lock_ref(node). Raises RuntimeError if node holds no lock of its own."""
        self._check_attached(node)
        if node.own_lock_ref <= 0:
            raise RuntimeError("dec_lock_ref on a node that is not locked")
        node.own_lock_ref -= 1
        cur: TreeNode | None = node
        while cur is not None:
            cur.lock_ref -= 1
            if cur.lock_ref == 0 and cur.pages:
                self.allocator.set_reclaimable(cur.pages, True)
            cur = cur.parent

    def _check_attached(self, node: TreeNode) -> None:
        if node is not self.root and node.parent is None:
            raise RuntimeError("node is no longer in the tree (evicted or flushed)")

    # ---------------------------------------------------------------- eviction
    def evict(self, num_pages: int) -> int:
        """Evict unlocked leaves, least recently used first, until num_pages pages became free.

        Stops early when nothing evictable is left. Returns the number of pages that became free (a
        page also held by someone else is not freed by dropping the tree's reference). A parent whose
        last child goes becomes a candidate itself. O(N log N) in the number of tree nodes.
        """
        if num_pages <= 0 or self.disable:
            return 0
        if self.tier is not None:
            return self.tier.evict_device(num_pages)
        alloc = self.allocator
        free_before = alloc.num_free_pages()
        heap = [(n.last_access_time, i, n) for i, n in enumerate(self.iter_nodes())
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        seq = len(heap)
        while heap and alloc.num_free_pages() - free_before < num_pages:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            alloc.dec_ref(leaf.pages, reclaimable=True)
            leaf.parent = None
            self.num_evicted_tokens += len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, seq, parent))
                seq += 1
        return alloc.num_free_pages() - free_before

    def evictable_size(self) -> int:
        """Pages that would become free if every unlocked node were evicted; O(1)."""
        return 0 if self.disable else self.allocator.num_reclaimable_pages()

    def protected_size(self) -> int:
        """Pages held by a locked node or by anything outside the tree (running requests)."""
        alloc = self.allocator
        return alloc.num_total_pages - alloc.num_free_pages() - self.evictable_size()

    def reset(self) -> None:
        """Drop every node and its references (flush). Raises RuntimeError while any node is locked."""
        if self.root.lock_ref:
            raise RuntimeError(f"cannot flush the radix cache: {self.root.lock_ref} locks are held")
        for node in list(self.iter_nodes()):
            self.allocator.dec_ref(node.pages, reclaimable=True)
            if self.tier is not None:
                self.tier.drop_host_copy(node)
            node.parent = None
        self.root.children = {}

    # ---------------------------------------------------------------- introspection
    def iter_nodes(self) -> Iterator[TreeNode]:
        """All nodes except the root, parents before children (depth first)."""
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    def token_path(self, node: TreeNode) -> tuple[int, ...]:
        """Token ids from the root to node (positions [0, node.end))."""
        parts = []
        cur: TreeNode | None = node
        while cur is not None:
            parts.append(cur.key)
            cur = cur.parent
        return tuple(t for part in reversed(parts) for t in part)

    def hit_rate(self) -> float:
        """Matched / queried tokens over match_prefix calls with record_stats=True (admissions);
        0.0 before any."""
        if self.total_queried_tokens == 0:
            return 0.0
        return self.total_matched_tokens / self.total_queried_tokens

    def check_invariants(self, external_refs: Mapping[int, int] | None = None) -> None:
        """Raise AssertionError if the tree, the allocator and the holders disagree.

        external_refs: page -> references held outside the tree (running requests); when given, every
        page's refcount must equal tree holders + external holders exactly. See invariants.py.
        """
        check_cache_invariants(self, external_refs)


def _common_prefix_len(key: tuple[int, ...], tokens: Sequence[int], pos: int, n: int) -> int:
    """Length of the common prefix of key and tokens[pos:n] (tokens: a tuple or a list).

    One slice compare (C speed) settles a full match; otherwise the first difference is found by
    comparing runs of _RUN tokens, then the tokens of the first run that differs.
    """
    size = len(key)
    limit = min(size, n - pos)
    if limit == size and tokens[pos + size - 1] == key[-1] and tuple(tokens[pos : pos + size]) == key:
        return size
    i = 0
    while i + _RUN <= limit and tuple(tokens[pos + i : pos + i + _RUN]) == key[i : i + _RUN]:
        i += _RUN
    stop = min(i + _RUN, limit)
    while i < stop and key[i] == tokens[pos + i]:
        i += 1
    return i


_RUN = 32  # tokens per slice compare while looking for the first difference
