"""Reference-counted allocator of KV pages.

The KV pool is cut into pages of `page_size` token slots (slot = page * page_size + offset), as in
PagedAttention (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023), where blocks carry reference counts so that sequences can share them and
copy on write. This module knows nothing about tokens or trees: it hands out page ids (plain ints) and
counts who holds each page.

Page 0 is reserved as the sink for padded tokens and is never handed out, so valid page ids are
1 .. num_pages - 1.
"""

from __future__ import annotations

from collections.abc import Iterable


class PageAllocator:
    """Hands out KV pages and keeps a reference count per page.

    Invariants (checked by `check_invariants`):
      * a page is on the free list exactly when its reference count is 0;
      * a page returns to the free list exactly when its count drops to 0 (never earlier, never twice);
      * each reference is either *hard* or *reclaimable*, and reclaimable refs <= refs for every page.

    Reclaimable references are those of a holder that gives the page up on demand: an unlocked
    radix-tree node, which eviction may remove. A page is *reclaimable* when it is held and every
    reference to it is reclaimable (so evicting all unlocked tree nodes would free it). The count of
    such pages is maintained in O(1) per operation, so the cache's `evictable_size()` costs nothing.

    Ownership: whoever called `alloc` / `inc_ref` owns one reference per page and must give it back with
    exactly one `dec_ref`. Errors (`ValueError`) signal a bookkeeping bug in the caller; pages listed
    before the offending one have already been processed.
    """

    __slots__ = ("num_pages", "num_total_pages", "_refs", "_soft", "_free", "_num_reclaimable")

    def __init__(self, num_pages: int) -> None:
        """num_pages: size of the KV pool in pages, page 0 included (so num_pages - 1 are allocatable)."""
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1 (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        self.num_total_pages = num_pages - 1  # allocatable pages
        self._refs = [0] * num_pages  # page -> number of holders
        self._soft = [0] * num_pages  # page -> number of reclaimable holders (<= _refs)
        # Free list used as a stack; reversed so that a fresh allocator hands out 1, 2, 3, ...
        self._free = list(range(num_pages - 1, 0, -1))
        self._num_reclaimable = 0  # pages with 0 < _refs == _soft

    # ---------------------------------------------------------------- queries
    def num_free_pages(self) -> int:
        return len(self._free)

    def num_reclaimable_pages(self) -> int:
        """Held pages all of whose references are reclaimable."""
        return self._num_reclaimable

    def refcount(self, page: int) -> int:
        if not 0 < page < self.num_pages:
            self._check_id(page)
        return self._refs[page]

    def reclaimable_refs(self, page: int) -> int:
        self._check_id(page)
        return self._soft[page]

    def free_pages(self) -> list[int]:
        """A copy of the free list (for checks and tests)."""
        return list(self._free)

    # ---------------------------------------------------------------- mutation
    def alloc(self, n: int) -> list[int] | None:
        """Take n free pages, each with reference count 1 (hard).

        Returns None, and allocates nothing, when fewer than n pages are free. Raises ValueError if n < 0.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        for page in pages:
            self._refs[page] = 1
        return pages

    def inc_ref(self, pages: Iterable[int], *, reclaimable: bool = False) -> None:
        """Add one reference to each page (listed twice: two references). Pages must be held already."""
        refs, soft, num_pages = self._refs, self._soft, self.num_pages
        for page in pages:  # checks inlined (this runs per page of every admitted prefix)
            if not 0 < page < num_pages:
                self._check_id(page)
            r = refs[page]
            if r == 0:
                raise ValueError(f"inc_ref of free page {page}")
            refs[page] = r + 1
            if reclaimable:
                soft[page] += 1  # r == s before iff after: the reclaimable-page tally is unchanged
            elif r == soft[page]:
                self._num_reclaimable -= 1  # it gained a hard reference

    def dec_ref(self, pages: Iterable[int], *, reclaimable: bool = False) -> None:
        """Drop one reference from each page; a page whose count reaches 0 goes back to the free list.

        reclaimable: the dropped references are reclaimable ones (as taken with inc_ref(reclaimable=True)).
        Raises ValueError on a free page (double free) or a missing reclaimable reference.
        """
        refs, soft, num_pages, free = self._refs, self._soft, self.num_pages, self._free
        for page in pages:  # checks inlined, as in inc_ref
            if not 0 < page < num_pages:
                self._check_id(page)
            r, s = refs[page], soft[page]
            if r == 0:
                raise ValueError(f"dec_ref of free page {page} (double free)")
            if reclaimable and s == 0:
                raise ValueError(f"dec_ref(reclaimable=True) of page {page}, which has no reclaimable ref")
            was = r == s
            r -= 1
            refs[page] = r
            if reclaimable:
                s -= 1
                soft[page] = s
            if r == 0:
                free.append(page)
                self._num_reclaimable -= was
            else:
                self._num_reclaimable += (r == s) - was

    def set_reclaimable(self, pages: Iterable[int], reclaimable: bool) -> None:
        """Turn one hard reference of each page into a reclaimable one (True) or back (False).

        Used when a tree node is unlocked (its refs become reclaimable) or locked (they become hard).
        """
        refs, soft, num_pages = self._refs, self._soft, self.num_pages
        for page in pages:  # checks inlined, as in inc_ref
            if not 0 < page < num_pages:
                self._check_id(page)
            r, s = refs[page], soft[page]
            if reclaimable:
                if s >= r:
                    raise ValueError(f"page {page}: no hard reference to make reclaimable (refs={r})")
                soft[page] = s + 1
                self._num_reclaimable += s + 1 == r
            else:
                if s == 0:
                    raise ValueError(f"page {page}: no reclaimable reference to make hard")
                soft[page] = s - 1
                self._num_reclaimable -= s == r

    # ---------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Raise AssertionError if the free list, the counts and the reclaimable tally disagree."""
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        assert 0 not in free, "reserved page 0 is on the free list"
        num_reclaimable = 0
        for page in range(1, self.num_pages):
            r, s = self._refs[page], self._soft[page]
            assert (r == 0) == (page in free), f"page {page}: refcount {r} but on free list: {page in free}"
            assert 0 <= s <= r, f"page {page}: reclaimable refs {s} not within [0, refcount {r}]"
            num_reclaimable += r > 0 and r == s
        assert self._refs[0] == 0, "reserved page 0 has references"
        assert num_reclaimable == self._num_reclaimable, (
            f"reclaimable page tally {self._num_reclaimable} != recount {num_reclaimable}"
        )

    def _check_id(self, page: int) -> None:
        if not 0 < page < self.num_pages:
            raise ValueError(f"page id {page} outside 1..{self.num_pages - 1}")
