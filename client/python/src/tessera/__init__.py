"""tessera: sharded tensors on a cluster of workers, fetched into numpy.

A thin Python layer over the C++ SDK (one implementation of planning,
parallel fetch and assembly)::

    import numpy as np
    import tessera

    c = tessera.connect("127.0.0.1:7070")          # or $TESSERA_COORDINATOR
    c.put("emb", array, chunk_dim=0, placements=["rank:0", "rank:1"])
    rows = c.get("emb", np.s_[1000:2000, :])       # remote fetch of a region
    full = c.get("emb")                            # gather the whole tensor
    c.get("emb", np.s_[0:64], out=buf)             # into your array, no allocation
    meta = c.describe("emb")                       # shape, dtype, version, shards
    shard = meta.shards[1].handle.to_here()        # one shard, straight from its worker
    c.reshard("emb", chunk_dim=1, placements=["rank:2", "rank:3"])
    c.list(); c.workers(); c.delete("emb")

Data path: fetched bytes land directly in the numpy array's buffer (one copy,
from the network). ``put`` reads straight from the array's buffer.

Threads: a Client is safe to share between threads; the GIL is released
while waiting on the network, so several Python threads fetch in parallel.

dtypes: float32 float64 float16 int8 uint8 int16 int32 int64 bool map to the
numpy dtypes of the same name. numpy has no bfloat16: a bfloat16 tensor comes
back as its raw 16-bit words in a ``uint16`` array; ``bfloat16_to_float32``
widens them (exactly), and ``float32_to_bfloat16`` makes words to ``put`` with
``dtype="bfloat16"``. With ml_dtypes installed, ``words.view(ml_dtypes.bfloat16)``
also works; torch users can do
``torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)``.

torch: ``torch.from_numpy(c.get("emb"))`` shares the array's memory (no copy);
tessera itself does not depend on torch.

Errors raise subclasses of ``TesseraError`` whose message is the C++ SDK's
(the same words as the CLI): ``NotFound`` (also a ``KeyError``),
``InvalidArgument`` (a ``ValueError``), ``OutOfBounds`` (a ``ValueError`` and
an ``IndexError``), ``AlreadyExists``, ``FailedPrecondition``, ``Aborted``,
``Unavailable`` (dead worker or coordinator), ``DeadlineExceeded``, ...
"""

from __future__ import annotations

import dataclasses
import operator
import os
import types
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _tessera

__all__ = [
    "connect",
    "Client",
    "TensorMeta",
    "ShardMeta",
    "ShardHandle",
    "TensorInfo",
    "WorkerInfo",
    "ReshardStats",
    "DTYPES",
    "numpy_dtype",
    "bfloat16_to_float32",
    "float32_to_bfloat16",
    "TesseraError",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfBounds",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
]

DEFAULT_COORDINATOR = "127.0.0.1:7070"

# --------------------------------------------------------------------------
# Errors: one class per absl::StatusCode, the message unchanged.
# --------------------------------------------------------------------------


class TesseraError(Exception):
    """Base of every error tessera raises. ``code`` is the absl status code name."""

    code: str = "UNKNOWN"

    def __str__(self) -> str:  # KeyError would add quotes; keep messages clean.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class Cancelled(TesseraError):
    code = "CANCELLED"


class Unknown(TesseraError):
    code = "UNKNOWN"


class InvalidArgument(TesseraError, ValueError):
    """A bad spec, region, dtype, name or argument (nothing was changed)."""

    code = "INVALID_ARGUMENT"


class DeadlineExceeded(TesseraError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class NotFound(TesseraError, KeyError):
    """The tensor (or worker) does not exist. Also catchable as ``KeyError``."""

    code = "NOT_FOUND"

    def __str__(self) -> str:
        return TesseraError.__str__(self)


class AlreadyExists(TesseraError):
    code = "ALREADY_EXISTS"


class PermissionDenied(TesseraError):
    code = "PERMISSION_DENIED"


class ResourceExhausted(TesseraError):
    """A worker is out of capacity."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(TesseraError):
    """The state must change first (e.g. a handle to a freed version)."""

    code = "FAILED_PRECONDITION"


class Aborted(TesseraError):
    """A conflict (e.g. a concurrent version change); retry at a higher level."""

    code = "ABORTED"


class OutOfBounds(TesseraError, ValueError, IndexError):
    """A region or index outside the tensor ("out of bounds")."""

    code = "OUT_OF_RANGE"


class Unimplemented(TesseraError):
    code = "UNIMPLEMENTED"


class Internal(TesseraError):
    code = "INTERNAL"


class Unavailable(TesseraError):
    """A worker or the coordinator cannot be reached; retrying may help."""

    code = "UNAVAILABLE"


class DataLoss(TesseraError):
    code = "DATA_LOSS"


class Unauthenticated(TesseraError):
    code = "UNAUTHENTICATED"


_ERROR_CLASSES = {
    1: Cancelled,
    2: Unknown,
    3: InvalidArgument,
    4: DeadlineExceeded,
    5: NotFound,
    6: AlreadyExists,
    7: PermissionDenied,
    8: ResourceExhausted,
    9: FailedPrecondition,
    10: Aborted,
    11: OutOfBounds,
    12: Unimplemented,
    13: Internal,
    14: Unavailable,
    15: DataLoss,
    16: Unauthenticated,
}
_tessera._set_error_classes(_ERROR_CLASSES)

# --------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------

#: Every tessera dtype name.
DTYPES: Tuple[str, ...] = tuple(_tessera.dtype_names())

_NUMPY_OF = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),  # raw bfloat16 words
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_TESSERA_OF = {v: k for k, v in _NUMPY_OF.items() if k != "bfloat16"}


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of arrays holding tessera ``dtype`` (bfloat16 -> uint16 words)."""
    try:
        return _NUMPY_OF[dtype]
    except KeyError:
        raise InvalidArgument(
            f"unknown dtype '{dtype}' (expected one of {' '.join(DTYPES)})") from None


def bfloat16_to_float32(words: np.ndarray) -> np.ndarray:
    """Widens bfloat16 words (a uint16 array, as ``get`` returns) to float32, exactly."""
    words = np.asarray(words)
    if words.dtype != np.uint16:
        raise InvalidArgument(f"bfloat16 words must be a uint16 array, got {words.dtype}")
    return (words.astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values: Any) -> np.ndarray:
    """Rounds values to bfloat16 (nearest even; NaN stays NaN) as uint16 words."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(nan, quiet, rounded).astype(np.uint16)


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------

ShardHandle = _tessera.ShardHandle


@dataclasses.dataclass(frozen=True)
class ShardMeta:
    """One shard of a tensor: its box (offsets/sizes), where it lives, and its handle."""

    index: int
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    rank: int
    device: str
    worker: str
    address: str
    shard_id: int
    available: bool
    placement: str  # "rank:N/DEVICE"
    handle_string: str  # "NAME@vVERSION#SHARD_ID"
    handle: Optional[ShardHandle] = dataclasses.field(compare=False, repr=False, default=None)

    @property
    def box(self) -> Tuple[slice, ...]:
        """The shard's box as slices: ``full[shard.box]`` is the shard's data."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """A tensor's global metadata (one version) and its shards, in spec order."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    version: int
    requires_grad: bool
    pin_memory: bool
    nbytes: int
    shards: List[ShardMeta]

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One row of ``list()``."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    version: int
    num_shards: int


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One row of ``workers()``."""

    name: str
    rank: int
    address: str
    device: str
    alive: bool
    bytes_used: int
    capacity_bytes: int


@dataclasses.dataclass(frozen=True)
class ReshardStats:
    """What a reshard cost: the new version and the data it moved."""

    version: int
    pieces_moved: int
    bytes_moved: int
    bytes_copied_locally: int
    shards_kept: int
    seconds: float


def _meta(d: dict) -> TensorMeta:
    shards = [ShardMeta(**s) for s in d.pop("shards")]
    return TensorMeta(shards=shards, **d)


# --------------------------------------------------------------------------
# Regions, boxes and shardings
# --------------------------------------------------------------------------

#: A region of ``get``: ``np.s_[a:b, :]`` (a slice, an int, ``...`` or a tuple
#: of them), or text like ``"0:5,:"``.
Region = Union[slice, int, types.EllipsisType, Tuple[Any, ...], str, None]
#: A shard box: ``np.s_[0:5, :]``, a sequence of (start, stop) pairs
#: (``None`` = open end), or text ``"0:5,:"``.
Box = Union[Tuple[Any, ...], Sequence[Tuple[Optional[int], Optional[int]]], str]
#: Placements: ``["rank:0", "w1/cpu"]`` or ``"rank:0,rank:1"``.
Placements = Union[Sequence[str], str]


def _opt_index(v: Any, what: str) -> Optional[int]:
    if v is None:
        return None
    try:
        return operator.index(v)
    except TypeError:
        raise InvalidArgument(f"{what}: bound {v!r} is not an integer") from None


def _check_step(s: slice, what: str) -> None:
    if s.step is not None and _opt_index(s.step, what) != 1:
        raise InvalidArgument(
            f"{what}: step {s.step} is not supported (regions are contiguous boxes; "
            "fetch the box and slice the numpy array, e.g. c.get(name, np.s_[a:b])[::2])")


def _region_key(region: Region) -> Any:
    """Encodes a numpy-style key for the extension: [(start, stop, is_index) | None(...)]."""
    if region is None or isinstance(region, str):
        return region
    items = region if isinstance(region, tuple) else (region,)
    key = []
    for item in items:
        if item is Ellipsis:
            key.append(None)
        elif isinstance(item, slice):
            _check_step(item, "region")
            key.append((_opt_index(item.start, "region"), _opt_index(item.stop, "region"), False))
        elif item is None:
            raise InvalidArgument("region: np.newaxis (None) is not supported; "
                                  "reshape the result instead")
        else:
            try:
                i = operator.index(item)
            except TypeError:
                raise InvalidArgument(
                    f"region: {item!r} is not a slice, an integer or '...' "
                    "(fancy and boolean indexing are not supported)") from None
            key.append((i, None if i == -1 else i + 1, True))
    return key


def _box(box: Box) -> Any:
    """Encodes one shard box as text or a list of (start, stop) pairs."""
    if isinstance(box, str):
        return box
    if isinstance(box, slice):
        box = (box,)
    ranges = []
    for item in box:
        if isinstance(item, slice):
            _check_step(item, "shard box")
            ranges.append((_opt_index(item.start, "shard box"), _opt_index(item.stop, "shard box")))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            ranges.append((_opt_index(item[0], "shard box"), _opt_index(item[1], "shard box")))
        else:
            raise InvalidArgument(
                f"shard box: {item!r} is not a slice or a (start, stop) pair")
    return ranges


def _placements(placements: Placements) -> Any:
    if isinstance(placements, str):
        return placements
    return [str(p) for p in placements]


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------


class _Closed:
    """Stands in for the extension's client after close()."""

    def __init__(self, address: str) -> None:
        self._address = address

    def __getattr__(self, attr: str) -> Any:
        raise FailedPrecondition(f"the client of coordinator {self._address} is closed")


class Client:
    """A connection to a tessera cluster. Safe to share between threads.

    Create one with :func:`connect`. Shardings (``put``, ``create``,
    ``reshard``) are given one of two ways:

    * chunk sharding, as ``torch.chunk``: ``chunk_dim=D, placements=[P0, P1, ...]``
      (one shard per placement; ``D`` may be negative);
    * enumerable sharding: ``shards=[(BOX, P), ...]`` where ``BOX`` is
      ``np.s_[0:5, :]``, a list of ``(start, stop)`` pairs, or text ``"0:5,:"``
      (one entry per dim; negative bounds count from the end; ``None`` or an
      omitted bound is open), or the CLI's text ``shards="0:5,:@rank:0;5:10,:@rank:1"``.
      Shards must not overlap and must cover the tensor.

    A placement is ``"rank:N"``, a worker name ``"w1"``, optionally with a device
    (``"rank:0/cpu"``). For ``put``/``create`` with neither, the tensor is chunked
    along dim 0 over every alive worker in rank order.
    """

    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._address: str = impl.address

    @property
    def address(self) -> str:
        """The coordinator's HOST:PORT."""
        return self._address

    def __repr__(self) -> str:
        return f"tessera.Client({self.address!r})"

    def close(self) -> None:
        """Drops this client's connections (handles already given out keep theirs).

        Later calls raise FailedPrecondition. Also done by ``with connect(...) as c:``.
        """
        self._impl = _Closed(self._address)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- cluster -----------------------------------------------------------

    def workers(self) -> List[WorkerInfo]:
        """The workers the coordinator knows, alive or not."""
        return [WorkerInfo(**w) for w in self._impl.workers()]

    def list(self) -> List[TensorInfo]:
        """Every tensor: name, shape, dtype, version, number of shards."""
        return [TensorInfo(**t) for t in self._impl.list()]

    # -- tensors -----------------------------------------------------------

    def describe(self, name: str) -> TensorMeta:
        """The tensor's metadata and its shards, each with a :class:`ShardHandle`.

        Raises NotFound if there is no such tensor.
        """
        return _meta(self._impl.describe(name))

    def delete(self, name: str) -> None:
        """Deletes the tensor and frees its shards. Raises NotFound if absent."""
        self._impl.delete(name)

    def put(self, name: str, array: Any, *, chunk_dim: Optional[int] = None,
            placements: Optional[Placements] = None,
            shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
            dtype: Optional[str] = None) -> TensorMeta:
        """Scatters ``array`` into a new sharded tensor ``name`` (shape and dtype from it).

        The bytes are read straight from the array's buffer (a non C-contiguous
        array is made contiguous first). ``dtype`` defaults to the array's; give
        ``dtype="bfloat16"`` with a uint16 array of bfloat16 words (see
        :func:`float32_to_bfloat16`). The tensor becomes visible only once every
        shard is written. Raises AlreadyExists if ``name`` exists, InvalidArgument
        for a bad sharding ("overlap", "cover", "invalid sharding dim", "does not
        exist", ...).
        """
        arr = np.asarray(array)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if dtype is None:
            dtype = _TESSERA_OF.get(arr.dtype)
            if dtype is None:
                raise InvalidArgument(
                    f"put: numpy dtype {arr.dtype} has no tessera dtype (expected one of "
                    f"{', '.join(str(d) for d in _TESSERA_OF)}; for bfloat16 pass uint16 "
                    "words with dtype='bfloat16')")
        elif arr.dtype != numpy_dtype(dtype):
            raise InvalidArgument(
                f"put: dtype '{dtype}' needs a {numpy_dtype(dtype)} array, got {arr.dtype} "
                "(convert it first; tessera does not cast)")
        if arr.ndim == 0:
            raise InvalidArgument(
                "put: a tensor needs at least one dim (got a 0-d array; reshape it to (1,))")
        arr = np.ascontiguousarray(arr)
        spec = self._spec(chunk_dim, placements, shards, default_all=True)
        return _meta(self._impl.put(name, arr, dtype, spec))

    def create(self, name: str, shape: Sequence[int], dtype: str = "float32", *,
               chunk_dim: Optional[int] = None, placements: Optional[Placements] = None,
               shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
               init: str = "empty") -> TensorMeta:
        """Allocates a sharded tensor on the workers, filled per ``init``.

        ``init``: ``"empty"`` (the default, as the CLI), ``"zeros"``, ``"ones"``,
        ``"arange"`` (np.arange(n).reshape(shape) cast to dtype), ``"full:V"``
        or ``"rand:SEED"`` (floats in [0, 1), integers in [0, 100); a pure
        function of the seed, independent of the sharding).
        """
        shape = [operator.index(d) for d in shape]
        spec = self._spec(chunk_dim, placements, shards, default_all=True)
        return _meta(self._impl.create(name, shape, str(dtype), spec, init))

    def get(self, name: str, region: Region = None, *, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Fetches the tensor, or ``region`` of it, straight from its workers.

        ``region`` uses numpy's basic indexing: ``np.s_[1000:2000, :]``,
        negative bounds, omitted trailing dims, ``...``, and integers (which drop
        the dim, as numpy does); or text ``"1000:2000,:"``. Unlike numpy, bounds
        are not clamped: a region outside the tensor raises OutOfBounds ("out
        of bounds"), as does ``stop < start``; a step other than 1 raises
        InvalidArgument.

        With ``out``, the data is written into that array, which must be a
        writeable, C-contiguous ndarray of exactly the result's dtype and shape
        (else InvalidArgument); it is returned. Otherwise a new array is
        returned. bfloat16 tensors come back as uint16 words.
        """
        return self._impl.get(name, _region_key(region), out)

    def get_shard(self, name: str, index: int) -> np.ndarray:
        """Shard ``index`` (in describe order) of the current version."""
        return self._impl.get_shard(name, operator.index(index))

    def reshard(self, name: str, *, chunk_dim: Optional[int] = None,
                placements: Optional[Placements] = None,
                shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None) -> ReshardStats:
        """Moves the tensor to a new sharding; data is preserved, version + 1.

        Pieces that keep their owner are not moved. Readers of the old version
        finish on it; handles to it fail afterwards with FailedPrecondition.
        """
        spec = self._spec(chunk_dim, placements, shards, default_all=False)
        return ReshardStats(**self._impl.reshard(name, spec))

    # -- helpers -----------------------------------------------------------

    def _spec(self, chunk_dim: Optional[int], placements: Optional[Placements],
              shards: Any, default_all: bool) -> tuple:
        if shards is not None:
            if chunk_dim is not None or placements is not None:
                raise InvalidArgument(
                    "give either chunk_dim and placements, or shards, not both")
            if isinstance(shards, str):
                return ("text", shards)
            entries = []
            for entry in shards:
                try:
                    box, placement = entry
                except (TypeError, ValueError):
                    raise InvalidArgument(
                        f"shards: {entry!r} is not a (box, placement) pair") from None
                entries.append((_box(box), str(placement)))
            return ("shards", entries)
        if placements is None:
            if not default_all:
                raise InvalidArgument(
                    "missing the sharding: give chunk_dim=D, placements=[...] or shards=[...]")
            alive = sorted((w for w in self.workers() if w.alive), key=lambda w: w.rank)
            if not alive:
                raise Unavailable("no alive workers to place the tensor on")
            placements = [f"rank:{w.rank}" for w in alive]
        return ("chunk", 0 if chunk_dim is None else operator.index(chunk_dim),
                _placements(placements))


def connect(address: Optional[str] = None, *, connect_timeout: float = 5.0,
            rpc_timeout: float = 30.0, data_timeout: float = 1800.0,
            max_parallel_streams: int = 16, tls_ca: Optional[str] = None,
            tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
            token_file: Optional[str] = None) -> Client:
    """Connects to the coordinator at HOST:PORT.

    ``address`` defaults to ``$TESSERA_COORDINATOR``, then ``127.0.0.1:7070``.
    Raises Unavailable (naming the coordinator) if it cannot be reached within
    ``connect_timeout`` seconds. Timeouts are in seconds: ``rpc_timeout`` per
    control call, ``data_timeout`` per data stream.

    Security (as the CLI): ``tls_ca``, ``tls_cert``, ``tls_key`` are PEM files
    for mutual TLS and ``token_file`` holds this client's secret; each defaults
    to ``$TESSERA_TLS_CA``, ``$TESSERA_TLS_CERT``, ``$TESSERA_TLS_KEY`` and
    ``$TESSERA_TOKEN_FILE``. A refused certificate or token raises
    Unauthenticated; a role that may not, PermissionDenied.
    """
    if address is None:
        address = os.environ.get("TESSERA_COORDINATOR") or DEFAULT_COORDINATOR

    def setting(value: Optional[str], env: str) -> str:
        return value if value is not None else os.environ.get(env, "")

    return Client(_tessera.Client.connect(
        address, float(rpc_timeout), float(connect_timeout), float(data_timeout),
        int(max_parallel_streams), setting(tls_ca, "TESSERA_TLS_CA"),
        setting(tls_cert, "TESSERA_TLS_CERT"), setting(tls_key, "TESSERA_TLS_KEY"),
        setting(token_file, "TESSERA_TOKEN_FILE")))
