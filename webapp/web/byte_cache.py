"""A least-recently-used cache of strings bounded in bytes, not in entries.

A cache bounded by its count of entries is bounded in memory only by the size of
the largest entry: the Markdown cache held up to 1,024 texts of up to 100,000
characters each, with their HTML -- hundreds of megabytes in the worst case.
This one counts what each entry takes (``sys.getsizeof`` of key and value),
evicts the least recently used beyond ``max_bytes``, and never keeps an entry
larger than a quarter of it. Safe to share between threads (replies are
rendered off the event loop).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable


class ByteBoundedCache:
    def __init__(self, compute: Callable[[str], str], max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes!r}")
        self.compute = compute
        self.max_bytes = max_bytes
        self.size = 0  # bytes held now
        self._entries: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __call__(self, key: str) -> str:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        value = self.compute(key)  # outside the lock: other threads go on meanwhile
        cost = sys.getsizeof(key) + sys.getsizeof(value)
        if cost > self.max_bytes // 4:
            return value
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, cost)
                self.size += cost
                while self.size > self.max_bytes:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.size -= dropped
        return value

    def cache_clear(self) -> None:  # named as functools.lru_cache's
        with self._lock:
            self._entries.clear()
            self.size = 0
