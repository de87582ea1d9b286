"""asyncio API: the same calls as :class:`tessera.Client`, awaitable.

    import asyncio, tessera.aio

    async def main():
        c = await tessera.aio.connect("127.0.0.1:7070")
        rows = await c.get("emb", np.s_[1000:1016, :])
        await asyncio.gather(*(c.get_rows("emb", [i]) for i in range(16)))
        await c.close()

Each call runs the C++ SDK on a thread of the client's pool (the SDK
releases the GIL), never on the event loop, so the loop keeps serving other
tasks meanwhile. Plain gets (``get(name, region)``) skip the Python threads:
C++ threads read, and the loop collects what finished when an eventfd says
so, several at a time. Cancelling the awaiting task (``task.cancel()``,
``asyncio.wait_for`` timing out) cancels the call itself: its RPCs are given
up at once (CANCELLED) and its thread is free again, not left to run out its
timeout.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, TypeVar

from . import Client, ReshardStats, TensorInfo, TensorMeta, UpdateStats, WorkerInfo
from . import _region_key, _tessera
from . import connect as _connect

T = TypeVar("T")

__all__ = ["AsyncClient", "connect"]


class AsyncClient:
    """A :class:`tessera.Client` whose calls are coroutines.

    ``max_workers`` threads run calls at once (default 32); more wait their
    turn in the pool without blocking the loop.
    """

    def __init__(self, client: Client, max_workers: int = 32) -> None:
        self._client = client
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="tessera-aio")
        self._max_workers = max_workers
        self._in_flight = 0  # calls still running (a pool or reader thread)
        self._lock = threading.Lock()
        self._reader: Any = None  # _tessera.AsyncReader, made on first get
        self._reader_loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiting: dict = {}  # get id -> its future
        self._ids = itertools.count(1)

    @property
    def client(self) -> Client:
        """The synchronous client underneath (shares connections and caches)."""
        return self._client

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        token = _tessera.Cancellation()

        def run() -> T:
            try:
                with token:
                    return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._in_flight -= 1

        with self._lock:
            self._in_flight += 1
        future = loop.run_in_executor(self._pool, run)
        try:
            return await future
        except asyncio.CancelledError:
            # The task gave up: so does the call, on its thread.
            token.cancel()
            raise

    async def workers(self) -> List[WorkerInfo]:
        return await self._call(self._client.workers)

    async def quota(self) -> List[Dict[str, Any]]:
        return await self._call(self._client.quota)

    async def list(self) -> List[TensorInfo]:
        return await self._call(self._client.list)

    async def describe(self, name: str) -> TensorMeta:
        return await self._call(self._client.describe, name)

    async def create(self, name: str, shape: Any, dtype: str = "float32",
                     **kwargs: Any) -> TensorMeta:
        return await self._call(self._client.create, name, shape, dtype, **kwargs)

    async def put(self, name: str, array: Any, **kwargs: Any) -> TensorMeta:
        return await self._call(self._client.put, name, array, **kwargs)

    async def get(self, name: str, region: Any = None, **kwargs: Any) -> Any:
        if kwargs:  # out=, torch=, progress=...: the pool's path
            return await self._call(self._client.get, name, region, **kwargs)
        loop = asyncio.get_running_loop()
        reader = self._reader_for(loop)
        future = loop.create_future()
        token = _tessera.Cancellation()
        get_id = next(self._ids)
        self._waiting[get_id] = future
        with self._lock:
            self._in_flight += 1
        try:
            reader.get(get_id, name, _region_key(region), token)
        except BaseException:
            del self._waiting[get_id]
            with self._lock:
                self._in_flight -= 1
            raise
        try:
            return await future
        except asyncio.CancelledError:
            token.cancel()  # the read gives up; collect() still counts it
            raise

    def _reader_for(self, loop: asyncio.AbstractEventLoop) -> Any:
        if self._reader is None or self._reader_loop is not loop:
            if self._reader is not None:
                self._drop_reader()
            self._reader = self._client._impl.async_reader(self._max_workers)
            self._reader_loop = loop
            loop.add_reader(self._reader.fd(), self._collect)
        return self._reader

    def _collect(self) -> None:
        for get_id, array, error in self._reader.collect():
            with self._lock:
                self._in_flight -= 1
            future = self._waiting.pop(get_id, None)
            if future is None or future.done():
                continue  # cancelled meanwhile
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(array)

    def _drop_reader(self) -> None:
        try:
            self._reader_loop.remove_reader(self._reader.fd())
        except Exception:  # the loop is closed already
            pass
        self._reader.close()
        self._reader = None

    async def get_rows(self, name: str, indices: Any, **kwargs: Any) -> Any:
        return await self._call(self._client.get_rows, name, indices, **kwargs)

    async def update(self, name: str, array: Any, region: Any = None,
                     **kwargs: Any) -> UpdateStats:
        return await self._call(self._client.update, name, array, region, **kwargs)

    async def reshard(self, name: str, **kwargs: Any) -> ReshardStats:
        return await self._call(self._client.reshard, name, **kwargs)

    async def delete(self, name: str) -> None:
        return await self._call(self._client.delete, name)

    async def wait(self, name: str, version: Optional[int] = None,
                   timeout: Optional[float] = None) -> int:
        """:meth:`tessera.Client.wait`; cancelling the task ends the wait."""
        return await self._call(self._client.wait, name, version, timeout)

    async def close(self) -> None:
        """Waits for calls in flight, then closes the client."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, functools.partial(self._pool.shutdown, wait=True))
        if self._reader is not None:
            while self._waiting:  # gets in flight finish first
                await asyncio.sleep(0.001)
            self._drop_reader()
        self._client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def connect(address: Optional[str] = None, *, max_workers: int = 32,
                  **kwargs: Any) -> AsyncClient:
    """Connects as :func:`tessera.connect` (same arguments), without blocking
    the loop, and returns an :class:`AsyncClient`."""
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(
        None, functools.partial(_connect, address, **kwargs))
    return AsyncClient(client, max_workers=max_workers)
