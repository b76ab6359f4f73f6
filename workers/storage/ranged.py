"""An object read as a seekable file by ranged GETs, with memory bounded whatever its size.

The object is read in aligned blocks of `block` bytes. Each GET costs a round trip (tens of
milliseconds on a loaded server), so a reader moving forward keeps the next `ahead` blocks in
flight on its own threads, and holds at most `ahead + 1` blocks: a 20 GB object streams through
24 MiB by default. A reader that jumps (a Parquet footer, a zip's central directory) fetches only
the block it lands in. Measured against moto's server on loopback (a 51 MB object): 1 MiB ranges
25 MB/s, 4 MiB 95, 16 MiB 283 (a local file: 1,660): hence blocks of 8 MiB, two ahead.
"""

from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mxq.objects import ObjectURL
from mxq.workers.settings.storage import StorageSettings
from mxq.workers.storage.client import (
    ObjectChanged,
    StorageConfig,
    StorageError,
    head,
    read_range,
    storage_of,
    versions,
)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


BLOCK_BYTES = 8 << 20
AHEAD = 2
HEADER_BLOCK_BYTES = 64 << 10  # a header or a footer: one small GET, nothing ahead
MAX_PREFIX_OBJECTS = 1_000_000  # a folder of images in a bucket is listed at most this far
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")  # what of a folder or a prefix of images is read


@dataclass(frozen=True)
class RemoteObject:
    """An object in the store with its size (read once, at open): what readers take in place of
    a local path. Its text is its URL, which names it in every message."""

    storage: StorageSettings
    url: ObjectURL
    size: int
    etag: str | None = None  # the version opened: every ranged read asks for it (If-Match)

    @classmethod
    def at(cls, settings: StorageConfig, url: ObjectURL) -> RemoteObject:
        storage = storage_of(settings)
        return cls(storage, url, *head(storage, url))

    def __str__(self) -> str:
        return str(self.url)

    @property
    def suffix(self) -> str:
        return self.url.suffix

    def open(self, block: int = BLOCK_BYTES, ahead: int = AHEAD) -> ObjectReader:
        return ObjectReader(self, block, ahead)


@dataclass(frozen=True)
class RemotePrefix:
    """The objects directly under a prefix (`s3://b/scans/`), listed once with the version of
    each (its ETag), the only one a read takes (If-Match): a folder of images in a bucket. Its
    text is its URL."""

    storage: StorageSettings
    url: ObjectURL
    objects: tuple[tuple[str, int, str], ...]  # (key, size, ETag), by key

    @classmethod
    def at(cls, settings: StorageConfig, url: ObjectURL) -> RemotePrefix:
        storage = storage_of(settings)
        found = versions(storage, url, MAX_PREFIX_OBJECTS)
        return cls(storage, url, tuple(sorted(o for o in found if "/" not in o[0][len(url.key):])))

    def __str__(self) -> str:
        return str(self.url)

    @property
    def suffix(self) -> str:
        return ""

    @property
    def size(self) -> int:
        return sum(size for _, size, _ in self.objects)

    @property
    def images(self) -> list[tuple[str, int, str]]:
        """The objects that are images (by their keys' suffixes), as listed."""
        return [o for o in self.objects if PurePosixPath(o[0]).suffix.lower() in IMAGE_SUFFIXES]

    def read(self, key: str, size: int, etag: str) -> bytes:
        """One object whole (an image: its header is checked before it is decoded), the version
        listed: ObjectChanged, naming it, where it was replaced since."""
        url = ObjectURL(self.url.bucket, key)
        try:
            return bytes(read_range(self.storage, url, 0, size, etag=etag))
        except ObjectChanged:
            raise ObjectChanged(f"input {url} changed since the job listed {self} (then ETag "
                                f"{etag}): submit the job again to score the new contents") from None


class ObjectReader(io.RawIOBase):
    """A read-only, seekable view of a RemoteObject (`io.BufferedReader` may wrap it)."""

    def __init__(self, obj: RemoteObject, block: int = BLOCK_BYTES, ahead: int = AHEAD) -> None:
        super().__init__()
        self.obj, self.block, self.ahead = obj, block, ahead
        self.pos, self.last_block = 0, -2
        self.blocks: dict[int, tuple[Future[memoryview], bytearray]] = {}
        self.spare: list[bytearray] = []  # the buffers of blocks dropped, for the next ones
        self.pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="mxq-s3") if ahead else None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.obj.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self.pos < self.obj.size:
            index, within = divmod(self.pos, self.block)
            data = self._block(index)
            n = min(len(view) - done, len(data) - within)
            if n <= 0:  # the server sent less than the range: the object changed or was cut
                raise StorageError(f"cannot read {self.obj}: it holds fewer than the {self.obj.size:,} "
                                   "bytes it had when opened (replaced while the job read it?)")
            view[done:done + n] = data[within:within + n]
            done, self.pos = done + n, self.pos + n
        return done

    def _fetch(self, index: int, into: bytearray) -> memoryview:
        start = index * self.block
        return read_range(self.obj.storage, self.obj.url, start, min(start + self.block, self.obj.size),
                          into, self.obj.etag)

    def _buffer(self) -> bytearray:
        return self.spare.pop() if self.spare else bytearray(self.block)

    def _drop(self, index: int) -> None:
        """Forget a block; its buffer is reused unless a thread may still be writing it."""
        future, buffer = self.blocks.pop(index)
        if future.done() or future.cancel():
            self.spare.append(buffer)

    def _block(self, index: int) -> memoryview:
        """Block `index`, and the next `ahead` in flight when reading moves forward."""
        sequential = index in (self.last_block, self.last_block + 1)
        self.last_block = index
        for old in [i for i in self.blocks if i < index or i > index + self.ahead]:
            self._drop(old)
        if self.pool is not None and sequential:
            last = (self.obj.size - 1) // self.block
            for i in range(index + 1, min(index + self.ahead, last) + 1):
                if i not in self.blocks:
                    buffer = self._buffer()
                    self.blocks[i] = (self.pool.submit(self._fetch, i, buffer), buffer)
        if index in self.blocks:
            return self.blocks[index][0].result()
        buffer = self._buffer()
        data = self._fetch(index, buffer)
        done: Future[memoryview] = Future()
        done.set_result(data)
        self.blocks[index] = (done, buffer)
        return data

    def close(self) -> None:
        if self.pool is not None:
            for future, _ in self.blocks.values():
                future.cancel()
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.blocks.clear()
        self.spare.clear()
        super().close()
