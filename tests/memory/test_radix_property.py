"""Property test: random request lifecycles against a naive model of the cache.

The model is a set of stored token sequences. After every step:
  * the full invariant holds, with the live requests' page refs as external refs;
  * the simulated KV content of every tree node and every live request is right: each position's
    slot holds the KV of exactly that token prefix (this catches any page-sharing, copy-on-write or
    use-after-free bug, since freed pages are wiped);
  * the tree stores exactly the prefixes the model stored, minus evictions (prefix closures compared),
    and everything a request or a test lock has locked is still there.
match_prefix / admit results must equal the longest common prefix with a stored sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixrt.memory.kv_manager import KVManager, ReqKV
from radixrt.memory.kv_sim import SimKVPool, check_world, prefix_hashes
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache, TreeNode

TOKENS = st.lists(st.integers(0, 4), max_size=12)
PICK = st.integers(0, 1 << 16)


@dataclass(slots=True)
class SimReq:
    kv: ReqKV
    tokens: list[int]  # prompt + the output it will produce (known in advance in the simulation)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _closure(seqs: Sequence[Sequence[int]]) -> set[int]:
    """Prefix hashes of every non-empty prefix of seqs."""
    out: set[int] = set()
    for s in seqs:
        out.update(prefix_hashes(s))
    return out


class KVMachine(RuleBasedStateMachine):
    @initialize(
        ps=st.sampled_from([1, 2, 4, 16]),
        capacity_tokens=st.integers(16, 160),
        disable=st.sampled_from([False, False, False, False, True]),
        bases=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=40), min_size=1, max_size=4),
    )
    def setup(self, ps: int, capacity_tokens: int, disable: bool, bases: list[list[int]]) -> None:
        self.ps = ps
        self.alloc = PageAllocator(max(3, capacity_tokens // ps) + 1)
        self.cache = RadixCache(self.alloc, ps, disable=disable)
        self.mgr = KVManager(self.alloc, self.cache, ps)
        self.pool = SimKVPool(ps)
        self.bases = bases
        self.reqs: list[SimReq] = []
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.model: list[tuple[int, ...]] = []  # stored sequences (resident in the tree)
        self.evicted_seen = 0
        self.num_steps = 0

    # ---------------------------------------------------------------- helpers
    def _query(self, src: int, cut: int, tail: list[int]) -> list[int]:
        candidates = [list(s) for s in self.model] + self.bases
        return candidates[src % len(candidates)][:cut] + tail

    def _model_lcp(self, query: Sequence[int]) -> int:
        return max((_lcp(query, s) for s in self.model), default=0)

    def _store(self, tokens: Sequence[int]) -> None:
        if tokens and not self.cache.disable:
            self.model.append(tuple(tokens))

    def _snapshot(self) -> tuple:
        refs = [self.alloc.refcount(p) for p in range(1, self.alloc.num_pages)]
        return self.alloc.free_pages(), refs, self.cache.root.lock_ref, self.cache.evictable_size()

    def _pages_for(self, n: int) -> int:
        return -(-n // self.ps)

    # ---------------------------------------------------------------- request lifecycle
    @rule(src=PICK, cut=st.integers(0, 40), tail=TOKENS, out=TOKENS, reserve=st.integers(0, 8))
    def admit(self, src: int, cut: int, tail: list[int], out: list[int], reserve: int) -> None:
        self._admit(self._query(src, cut, tail) or [1], out, reserve)

    @rule(src=PICK, cut=st.integers(0, 40), tail=TOKENS, out=TOKENS)
    def serve(self, src: int, cut: int, tail: list[int], out: list[int]) -> None:
        """A whole request at once: admit, compute prompt + output, finish (fills the tree quickly)."""
        req = self._admit(self._query(src, cut, tail) or [1], out, 0)
        if req is not None:
            self._reserve(req, len(req.tokens))
            self.reqs.remove(req)
            self._store(req.tokens[: req.kv.kv_len])
            self.mgr.cache_finished_req(req.kv, req.tokens[: req.kv.kv_len])

    def _admit(self, prompt: list[int], out: list[int], reserve: int) -> SimReq | None:
        expected = self._model_lcp(prompt[:-1])
        # Dry run of the admission rule: what is available once the matched path is locked?
        probe = self.cache.match_prefix(prompt[:-1], record_stats=False)
        assert probe.prefix_len == expected
        self.cache.inc_lock_ref(probe.last_node)
        available = self.mgr.num_available_pages()
        self.cache.dec_lock_ref(probe.last_node)
        needed = ((expected % self.ps != 0) + self._pages_for(len(prompt) + reserve)
                  - self._pages_for(expected))
        before = self._snapshot()
        counters = (self.cache.total_queried_tokens, self.cache.total_matched_tokens)
        result = self.mgr.admit(prompt, reserve)
        delta = (self.cache.total_queried_tokens - counters[0], self.cache.total_matched_tokens - counters[1])
        assert delta == (len(prompt) - 1, expected), "hit-rate counters"
        event("admit: refused" if result is None
              else f"admit: hit={expected > 0} cow={expected % self.ps != 0}")
        if result is None:
            assert needed > available, f"admit refused with {needed} needed, {available} available"
            assert self._snapshot() == before, "failed admit changed state"
            return None
        assert needed <= available, "admit accepted without room"
        kv, cow = result
        assert kv.cached_len == kv.kv_len == expected
        assert len(cow) == (expected % self.ps != 0)
        self.pool.copy_pages(cow)
        req = SimReq(kv, prompt + out)
        self.reqs.append(req)
        return req

    @precondition(lambda self: self.reqs)
    @rule(pick=PICK, chunk=st.integers(1, 24))
    def reserve(self, pick: int, chunk: int) -> None:
        req = self.reqs[pick % len(self.reqs)]
        self._reserve(req, min(req.kv.kv_len + chunk, len(req.tokens)))

    def _reserve(self, req: SimReq, new_len: int) -> None:
        kv, start = req.kv, req.kv.kv_len
        needed = self._pages_for(new_len) - len(kv.pages)
        available = self.mgr.num_available_pages()
        before = list(kv.pages)
        slots = self.mgr.reserve(kv, new_len)
        event("reserve: refused" if slots is None else "reserve: ok")
        if slots is None:
            assert needed > available and kv.pages == before and kv.kv_len == start
            return
        assert needed <= available and len(slots) == new_len - start and kv.kv_len == new_len
        assert kv.pages[: len(before)] == before, "page table is not append-only"
        self.pool.write(slots, req.tokens, start, self.alloc)

    @precondition(lambda self: self.reqs)
    @rule(pick=PICK)
    def publish(self, pick: int) -> None:
        req = self.reqs[pick % len(self.reqs)]
        before = list(req.kv.pages)
        self.mgr.cache_unfinished_req(req.kv, req.tokens[: req.kv.kv_len])
        assert req.kv.pages == before
        self._store(req.tokens[: req.kv.kv_len // self.ps * self.ps])

    @precondition(lambda self: self.reqs)
    @rule(pick=PICK)
    def finish(self, pick: int) -> None:
        req = self.reqs.pop(pick % len(self.reqs))
        self._store(req.tokens[: req.kv.kv_len])
        self.mgr.cache_finished_req(req.kv, req.tokens[: req.kv.kv_len])

    @precondition(lambda self: self.reqs)
    @rule(pick=PICK)
    def release(self, pick: int) -> None:
        self.mgr.release(self.reqs.pop(pick % len(self.reqs)).kv)

    # ---------------------------------------------------------------- cache operations
    @rule(num_pages=st.integers(1, 8))
    def evict(self, num_pages: int) -> None:
        evictable = self.cache.evictable_size()
        freed = self.cache.evict(num_pages)
        event(f"evict: freed>0={freed > 0}")
        assert freed <= evictable
        if evictable >= num_pages:
            assert freed >= num_pages
        else:
            assert freed == evictable and self.cache.evictable_size() == 0

    @rule(src=PICK, cut=st.integers(0, 60), tail=TOKENS)
    def match(self, src: int, cut: int, tail: list[int]) -> None:
        query = self._query(src, cut, tail)
        m = self.cache.match_prefix(query)
        event(f"match: hit={m.prefix_len > 0} mid-page={m.prefix_len % self.ps != 0}")
        assert m.prefix_len == self._model_lcp(query)
        assert self.cache.token_path(m.last_node) == tuple(query[: m.prefix_len])
        self.pool.check(m.pages, query, m.prefix_len, "match")

    @rule(src=PICK, cut=st.integers(0, 60), tail=TOKENS)
    def lock(self, src: int, cut: int, tail: list[int]) -> None:
        query = self._query(src, cut, tail)
        m = self.cache.match_prefix(query, record_stats=False)
        self.cache.inc_lock_ref(m.last_node)
        self.locks.append((m.last_node, tuple(query[: m.prefix_len])))

    @precondition(lambda self: self.locks)
    @rule(pick=PICK)
    def unlock(self, pick: int) -> None:
        node, _ = self.locks.pop(pick % len(self.locks))
        self.cache.dec_lock_ref(node)

    @rule(finish_first=st.booleans())
    def flush(self, finish_first: bool) -> None:
        """End every request and lock (finishing or aborting them), then flush the cache."""
        for req in self.reqs:
            if finish_first:
                self.mgr.cache_finished_req(req.kv, req.tokens[: req.kv.kv_len])
            else:
                self.mgr.release(req.kv)
        for node, _ in self.locks:
            self.cache.dec_lock_ref(node)
        self.reqs, self.locks = [], []
        self.cache.check_invariants({})
        assert self.cache.protected_size() == 0, "pages still protected after every request ended"
        self.cache.reset()
        self.model = []
        self.evicted_seen = self.cache.num_evicted_tokens
        assert self.alloc.num_free_pages() == self.alloc.num_total_pages

    # ---------------------------------------------------------------- checks
    @invariant()
    def memory_is_consistent(self) -> None:
        if not hasattr(self, "mgr"):
            return
        self.num_steps += 1
        self.pool.poison_free(self.alloc)
        check_world(self.mgr, self.pool, [(r.kv, r.tokens) for r in self.reqs])
        self._sync_model()

    def _sync_model(self) -> None:
        """Compare the tree's stored prefixes with the model's, then adopt the tree's (evictions)."""
        leaves = [self.cache.token_path(n) for n in self.cache.iter_nodes() if not n.children]
        in_tree, in_model = _closure(leaves), _closure(self.model)
        assert in_tree <= in_model, "the tree holds a prefix that was never published"
        if self.cache.num_evicted_tokens == self.evicted_seen:
            assert in_tree == in_model, "a published prefix vanished without eviction"
        self.evicted_seen = self.cache.num_evicted_tokens
        for req in self.reqs:
            node = req.kv.last_node
            assert node is not None and (node is self.cache.root or node.parent is not None)
            assert self.cache.token_path(node) == tuple(req.tokens[: req.kv.published_len])
        for node, path in self.locks:
            assert node is self.cache.root or node.parent is not None, "a locked node was evicted"
            assert self.cache.token_path(node) == path
        self.model = leaves

    def teardown(self) -> None:
        if not hasattr(self, "mgr"):
            return
        event(f"steps: {self.num_steps // 20 * 20}+")
        for i, req in enumerate(self.reqs):
            if i % 2:
                self.mgr.release(req.kv)
            else:
                self.mgr.cache_finished_req(req.kv, req.tokens[: req.kv.kv_len])
        for node, _ in self.locks:
            self.cache.dec_lock_ref(node)
        check_world(self.mgr, self.pool, [])
        assert self.cache.protected_size() == 0, "pages still protected after every request ended"
        self.cache.evict(self.alloc.num_total_pages)
        assert self.alloc.num_free_pages() == self.alloc.num_total_pages
        self.cache.reset()
        self.cache.check_invariants({})


_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much]
# `make test` runs a quarter of the examples at full depth; `pytest -m stress` runs them all.
TestKVManagerProperties = KVMachine.TestCase
TestKVManagerProperties.settings = settings(max_examples=50, stateful_step_count=150, deadline=None,
                                          database=None, suppress_health_check=_SUPPRESS)


@pytest.mark.stress
class TestKVManagerPropertiesStress(KVMachine.TestCase):
    settings = settings(max_examples=200, stateful_step_count=150, deadline=None, database=None,
                        suppress_health_check=_SUPPRESS)
