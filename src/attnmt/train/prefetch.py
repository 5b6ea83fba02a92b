"""Batches drawn ahead of the training loop, on a background thread.

The loop's thread dispatches an update and returns at once (JAX runs it asynchronously),
so whatever it does between two dispatches is time the device may sit idle. Drawing a
batch (gathering its rows), counting its tokens and FLOPs and the like are done here
instead, `depth` updates ahead, while the device computes.

Each item carries the iterator's position after its batch was drawn: a checkpoint saves
the position of the last batch the loop consumed, not of those queued behind it, so a
resumed run draws exactly the batches the uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")

# How often a blocked producer looks whether it was closed (seconds): a bound on how long
# close() waits for it, never a delay on the batches.
_POLL_S = 0.05


class ResumableIterator(Protocol):
    """What the prefetcher draws from (attnmt.data.pipeline.BatchIterator)."""

    def __next__(self) -> Any: ...

    def get_state(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Prefetched(Generic[T]):
    value: T  # prepare(batch)
    position: dict[str, Any]  # the iterator's state after drawing this batch


@dataclasses.dataclass(frozen=True)
class _Failed:
    error: BaseException


_END = object()  # the iterator is exhausted


class Prefetcher(Generic[T]):
    """Iterates `Prefetched(prepare(batch), position)` over `source`'s batches, in order.

    `depth` > 0: a daemon thread draws and prepares up to `depth` items ahead (it never
    holds up the process's exit). 0: each item is drawn when asked for, on the caller's
    thread. `budget`: at most this many batches are drawn (None: no limit) until
    `allow(n)` raises it, so a run that needs N updates draws no batch past the N-th.
    An exception raised by the source or `prepare` is raised, as it was, by the `next()`
    that would have returned its item. Close it (or use it as a context manager) on every
    path out: the thread is stopped and joined.
    """

    def __init__(
        self,
        source: ResumableIterator,
        prepare: Callable[[Any], T],
        depth: int = 2,
        budget: int | None = None,
    ) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be ≥ 0, got {depth}")
        self._source, self._prepare, self._depth = source, prepare, depth
        self._budget = threading.Semaphore(budget) if budget is not None else None
        self._stopped = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._done = False  # the end or a failure was handed out: nothing follows
        self._thread: threading.Thread | None = None
        if depth:
            self._thread = threading.Thread(
                target=self._produce, name="attnmt-prefetch", daemon=True
            )
            self._thread.start()

    def __iter__(self) -> Iterator[Prefetched[T]]:
        return self

    def __next__(self) -> Prefetched[T]:
        if self._done:
            raise StopIteration
        item = self._get() if self._thread else self._draw()
        if item is _END or isinstance(item, _Failed):
            self._done = True
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failed):
            raise item.error
        return item

    def allow(self, batches: int = 1) -> None:
        """Raises the budget by `batches` (an update that must be drawn again, or more)."""
        if self._budget is not None:
            for _ in range(batches):
                self._budget.release()

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stops the producer and waits for it: it finishes the batch it is drawing, if
        any, and exits; queued items are dropped. Idempotent."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        self._done = True

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _get(self) -> Any:
        """The producer's next item (it puts one for every end, so only a thread that died
        by other means, which Python does not raise into, leaves the queue empty)."""
        while True:
            try:
                return self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                dead = self._thread is not None and not self._thread.is_alive()
                if dead and self._queue.empty():
                    raise RuntimeError("the prefetch thread ended without a batch") from None

    def _draw(self) -> Any:
        """The next item, `_END` or `_Failed` (drawn on the calling thread)."""
        try:
            batch = next(self._source)
        except StopIteration:
            return _END
        except Exception as error:
            return _Failed(error)
        position = self._source.get_state()  # before prepare: the source's alone
        try:
            return Prefetched(self._prepare(batch), position)
        except Exception as error:
            return _Failed(error)

    def _produce(self) -> None:
        while self._wait_for_budget():
            item = self._draw()
            if not self._put(item) or item is _END or isinstance(item, _Failed):
                return

    def _wait_for_budget(self) -> bool:
        """False once closed; True when one more batch may be drawn."""
        while not self._stopped.is_set():
            if self._budget is None or self._budget.acquire(timeout=_POLL_S):
                return not self._stopped.is_set()
        return False

    def _put(self, item: Any) -> bool:
        """Queues `item` once there is room; False if closed first."""
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False
