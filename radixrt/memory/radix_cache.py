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
page. A page held by the tree is never written (copy-on-write, see req_kv.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

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

    # ---------------------------------------------------------------- lookup / insert
    def match_prefix(self, token_ids: Sequence[int], *, record_stats: bool = False) -> MatchResult:
        """Find the longest cached prefix of token_ids; O(prefix_len + depth).

        Splits the node in which the match ends, so last_node.end == prefix_len. Takes no references;
        refreshes last_access_time along the path. record_stats=True adds the lookup to the hit-rate
        counters; KVManager.admit does so, scheduling-policy probes (LPM ordering) should not.
        """
        tokens = tuple(token_ids)
        matched, pages, node = 0, [], self.root
        if not self.disable and tokens:
            node, matched, pages = self._walk(tokens)
        if record_stats:
            self.total_queried_tokens += len(tokens)
            self.total_matched_tokens += matched
        return MatchResult(prefix_len=matched, pages=pages, last_node=node)

    def insert(self, token_ids: Sequence[int], pages: Sequence[int]) -> int:
        """Publish token_ids whose KV lies in pages; return how many leading tokens were already cached.

        pages covers positions [0, len(token_ids)): entry i holds positions [i*page_size, (i+1)*page_size)
        (at least ceil(len / page_size) entries; extra ones are ignored). The tree takes its own
        reference on the pages of the new suffix only (page indices prefix // page_size ..); the caller
        keeps its references and stays responsible for them. No-op returning 0 when disabled.
        """
        if self.disable or len(token_ids) == 0:
            return 0
        return self._insert(tuple(token_ids), pages)[0]

    def insert_path(self, token_ids: Sequence[int], pages: Sequence[int]) -> TreeNode:
        """insert(token_ids, pages), then return the node that ends at len(token_ids) (one walk, where
        insert + match_prefix take two). Raises ValueError when disabled or token_ids is empty."""
        if self.disable or len(token_ids) == 0:
            raise ValueError("insert_path needs an enabled cache and at least one token")
        return self._insert(tuple(token_ids), pages)[1]

    def _insert(self, tokens: tuple[int, ...], pages: Sequence[int]) -> tuple[int, TreeNode]:
        """(tokens already cached, node ending at len(tokens)); see insert."""
        ps = self.page_size
        num_needed = (len(tokens) + ps - 1) // ps
        if len(pages) < num_needed:
            raise ValueError(f"{len(tokens)} tokens need {num_needed} pages, got {len(pages)}")
        node, matched, _ = self._walk(tokens)
        if matched < len(tokens):
            new_pages = list(pages[matched // ps : num_needed])
            self.allocator.inc_ref(new_pages, reclaimable=True)
            leaf = TreeNode(
                key=tokens[matched:], pages=new_pages, start=matched, parent=node,
                last_access_time=node.last_access_time,
            )
            node.children[tokens[matched]] = leaf
            return matched, leaf
        return matched, node

    def _walk(self, tokens: tuple[int, ...]) -> tuple[TreeNode, int, list[int]]:
        """Descend along tokens, splitting the node where the match ends inside it.

        Returns (deepest matched node, matched length, pages of the matched prefix). For each page
        index the page comes from the deepest matched node covering it, i.e. the one covering the last
        matched position in that page.
        """
        now = self._clock = self._clock + 1
        ps = self.page_size
        node, pos, pages = self.root, 0, []
        node.last_access_time = now
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            k = _common_prefix_len(child.key, tokens, pos)
            if k < len(child.key):
                child = self._split(child, k)
            child.last_access_time = now
            pages[child.start // ps :] = child.pages  # replaces a shared boundary page, then extends
            node, pos = child, pos + k
        return node, pos, pages

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
        if cut % ps:  # the page holding the cut is now held by both halves
            self.allocator.inc_ref(node.pages[:1], reclaimable=node.lock_ref == 0)
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


def _common_prefix_len(key: tuple[int, ...], tokens: tuple[int, ...], pos: int) -> int:
    """Length of the common prefix of key and tokens[pos:]."""
    n = len(key)
    if tokens[pos : pos + n] == key:
        return n
    limit = min(n, len(tokens) - pos)
    for i in range(limit):
        if key[i] != tokens[pos + i]:
            return i
    return limit
