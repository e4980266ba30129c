"""PageAllocator: allocation, reference counts, free list, reclaimable accounting."""

from __future__ import annotations

import pytest

from radixrt.memory.page_allocator import PageAllocator


def _alloc(a: PageAllocator, n: int) -> list[int] | None:
    pages = a.alloc(n)
    a.check_invariants()
    return pages


def test_page_zero_reserved_and_fresh_pages_ascending() -> None:
    a = PageAllocator(5)
    assert a.num_total_pages == 4
    assert a.num_free_pages() == 4
    assert _alloc(a, 4) == [1, 2, 3, 4]
    assert a.num_free_pages() == 0
    assert all(a.refcount(p) == 1 for p in (1, 2, 3, 4))
    with pytest.raises(ValueError):
        a.refcount(0)
    with pytest.raises(ValueError):
        a.inc_ref([0])


def test_alloc_is_all_or_nothing() -> None:
    a = PageAllocator(4)
    assert _alloc(a, 2) == [1, 2]
    assert _alloc(a, 2) is None
    assert a.num_free_pages() == 1
    assert a.refcount(3) == 0
    assert _alloc(a, 0) == []
    with pytest.raises(ValueError):
        a.alloc(-1)


def test_page_is_freed_exactly_when_count_reaches_zero() -> None:
    a = PageAllocator(3)
    (p,) = _alloc(a, 1)
    a.inc_ref([p, p])
    a.check_invariants()
    assert a.refcount(p) == 3
    a.dec_ref([p])
    a.dec_ref([p])
    a.check_invariants()
    assert a.refcount(p) == 1
    assert p not in a.free_pages()
    a.dec_ref([p])
    a.check_invariants()
    assert p in a.free_pages()
    assert a.num_free_pages() == 2
    with pytest.raises(ValueError, match="double free"):
        a.dec_ref([p])
    with pytest.raises(ValueError, match="free page"):
        a.inc_ref([p])


def test_freed_pages_are_reused() -> None:
    a = PageAllocator(3)
    pages = _alloc(a, 2)
    assert pages is not None
    a.dec_ref(pages)
    again = _alloc(a, 2)
    assert again is not None and sorted(again) == sorted(pages)


def test_out_of_range_ids_raise() -> None:
    a = PageAllocator(3)
    for bad in (-1, 3, 100):
        with pytest.raises(ValueError):
            a.dec_ref([bad])


def test_reclaimable_pages_counted_only_when_every_ref_is_reclaimable() -> None:
    a = PageAllocator(4)
    p, q = _alloc(a, 2) or []
    a.inc_ref([p], reclaimable=True)  # p: one hard (the allocation) + one reclaimable
    a.check_invariants()
    assert a.num_reclaimable_pages() == 0
    a.dec_ref([p])  # the hard ref goes: only the reclaimable ref is left
    a.check_invariants()
    assert a.num_reclaimable_pages() == 1 and a.reclaimable_refs(p) == 1
    a.set_reclaimable([q], True)
    a.check_invariants()
    assert a.num_reclaimable_pages() == 2
    a.set_reclaimable([q], False)
    a.check_invariants()
    assert a.num_reclaimable_pages() == 1
    a.dec_ref([p], reclaimable=True)
    a.check_invariants()
    assert a.num_reclaimable_pages() == 0 and a.refcount(p) == 0
    with pytest.raises(ValueError):
        a.dec_ref([q], reclaimable=True)  # q has no reclaimable ref
    with pytest.raises(ValueError):
        a.set_reclaimable([q], False)
    a.set_reclaimable([q], True)
    with pytest.raises(ValueError):
        a.set_reclaimable([q], True)  # its only ref is already reclaimable


def test_check_invariants_detects_corruption() -> None:
    a = PageAllocator(4)
    _alloc(a, 1)
    a._free.append(1)  # a held page also on the free list
    with pytest.raises(AssertionError, match="page 1"):
        a.check_invariants()
    b = PageAllocator(4)
    _alloc(b, 1)
    b._num_reclaimable += 1
    with pytest.raises(AssertionError, match="reclaimable"):
        b.check_invariants()
