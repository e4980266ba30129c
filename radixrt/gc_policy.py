"""Garbage-collector policy of the serving processes and of the offline Engine."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive after start-up (model modules, tokenizer, tables,
    imported modules) into the collector's permanent generation (`gc.freeze`), so later collections
    do not rescan them. Otherwise an old-generation collection on the serving path walks every torch
    and transformers object the process holds, a pause inside whichever pass allocates at that
    moment. Objects created later are collected as usual. Returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
