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

dtypes: float32 float64 float16 int8 uint8 int16 int32 int64 bool uint16
uint32 uint64 map to the numpy dtypes of the same name. numpy has no float8:
float8_e4m3fn and float8_e5m2 travel as raw bytes in ``uint8`` arrays (put
them with ``dtype=``). numpy has no bfloat16 either: a bfloat16 tensor comes
back as its raw 16-bit words in a ``uint16`` array; ``bfloat16_to_float32``
widens them (exactly), and ``float32_to_bfloat16`` makes words to ``put`` with
``dtype="bfloat16"``. With ml_dtypes installed, ``words.view(ml_dtypes.bfloat16)``
also works; torch users can do
``torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)``.

torch: ``c.get("emb", torch=True)`` (also ``get_rows`` and ``get_shard``)
returns a ``torch.Tensor`` sharing the fetched buffer (``torch.from_numpy``, no
copy); a bfloat16 tensor comes back as ``torch.bfloat16`` (a view of the same
16-bit words). ``put``/``update`` also take CPU torch tensors (bfloat16
included). tessera imports torch only when asked to; without it, ``torch=True``
raises ImportError.

safetensors: ``c.import_safetensors(path, chunk_dim=0, placements=[...],
prefix="m/")`` makes one tensor per entry (all or nothing);
``c.export_safetensors(path, prefix="m/")`` (or ``names=[...]``) writes them
back, gathered straight into the file.

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
import threading
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _tessera

#: The release this package was built from, as ``tessera --version`` and the
#: daemons' ``--version`` print it; ``__wire_protocol__`` is the protocol they
#: speak.
__version__: str = _tessera.version
__wire_protocol__: str = _tessera.wire_protocol

__all__ = [
    "connect",
    "Client",
    "TensorMeta",
    "ShardMeta",
    "ShardHandle",
    "TensorInfo",
    "WorkerInfo",
    "CoordinatorInfo",
    "ReshardStats",
    "UpdateStats",
    "SafetensorsExport",
    "LoadStats",
    "SaveStats",
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
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float8_e4m3fn": np.dtype(np.uint8),  # raw float8 bytes
    "float8_e5m2": np.dtype(np.uint8),
}
#: dtypes numpy lacks, held as raw words of the same size.
_RAW_WORDS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
_TESSERA_OF = {v: k for k, v in _NUMPY_OF.items() if k not in _RAW_WORDS}


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
    # The principal that created it (its bytes count against that
    # principal's quota); None: no one (a cluster without identities).
    owner: Optional[str] = None
    # Its mirror group's selector; None: not mirrored.
    mirror: Optional[str] = None

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
    replicas: int = 1  # workers holding each shard
    # Its mirror group's selector (a copy on every matching worker); None:
    # not mirrored.
    mirror: Optional[str] = None


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
    # Shards (and their bytes) kept for another cluster than the
    # coordinator's: quarantined, never freed on its word.
    quarantined_shards: int = 0
    quarantined_bytes: int = 0
    # A GPU worker's device memory: its size and what is free (0: host).
    device_total_bytes: int = 0
    device_free_bytes: int = 0
    # Its failure domain (the worker's --zone, by default its host) and
    # "ready", "cordoned", "draining" or "dead".
    zone: str = ""
    state: str = ""
    # Its TCP data port (HOST:PORT); "" when it has none.
    data_address: str = ""
    # Its --labels, which mirror groups select workers by.
    labels: Dict[str, str] = dataclasses.field(default_factory=dict, hash=False)


@dataclasses.dataclass(frozen=True)
class CoordinatorInfo:
    """One row of ``coordinators()``: where it is reached, "leader" or
    "standby", and whether it stands (an address given to ``connect`` that
    does not is a standby that is not alive)."""

    address: str
    role: str
    alive: bool


@dataclasses.dataclass(frozen=True)
class ReshardStats:
    """What a reshard cost: the new version and the data it moved;
    ``sent``: the bytes each worker sent to others ({worker: bytes})."""

    version: int
    pieces_moved: int
    bytes_moved: int
    bytes_copied_locally: int
    shards_kept: int
    seconds: float
    sent: Dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class UpdateStats:
    """What an update cost: the new version, bytes sent, shards taken over
    unchanged, and what its commit's copies sent between workers in all
    (``put --update --json`` ``"relayed_bytes"``: only the changes to copies
    that hold version N)."""

    version: int
    bytes_written: int
    shards_kept: int
    seconds: float
    relayed_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class SafetensorsExport:
    """What ``export_safetensors`` wrote: entries as dicts (entry, tensor, shape, dtype)."""

    path: str
    entries: List[dict]
    bytes: int
    file_bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class LoadStats:
    """What ``load`` made: the tensors, their bytes, and what the workers read
    from the files to fill them."""

    dir: str
    tensors: List[TensorInfo]
    bytes: int
    bytes_read: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class SaveStats:
    """What ``save`` wrote: the tensors saved, their bytes, and the number of
    .safetensors files the workers wrote."""

    dir: str
    tensors: List[str]
    bytes: int
    files: int
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
# torch (imported only when asked for)
# --------------------------------------------------------------------------


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415 (optional dependency)
    except ImportError as e:
        raise ImportError(
            f"torch=True needs PyTorch, which cannot be imported here ({e}); "
            "install it or use the numpy result") from None
    return torch


def _is_torch_tensor(x: Any) -> bool:
    # Checked without importing torch: only a torch user can pass one.
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "numpy")


def _to_torch(arr: np.ndarray, dtype: str) -> Any:
    """``arr`` as a torch tensor sharing its memory; bfloat16 and float8 words
    as torch's dtype of that name."""
    torch = _torch()
    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if dtype in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        target = getattr(torch, dtype, None)
        if target is None:
            raise InvalidArgument(
                f"this torch ({torch.__version__}) has no {dtype}; fetch a numpy array "
                "instead (torch=False)")
        signed = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[arr.dtype.itemsize]
        return torch.from_numpy(arr.view(signed)).view(target)
    return torch.from_numpy(arr)


def _from_torch(t: Any) -> Tuple[np.ndarray, Optional[str]]:
    """A CPU torch tensor as a numpy view of its memory, and its tessera dtype if bfloat16."""
    torch = _torch()
    if t.device.type != "cpu":
        raise InvalidArgument(
            f"a torch tensor on {t.device} cannot be read in place; move it with .cpu() first")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.contiguous().numpy(), None


def _out_array(out: Any) -> Any:
    """``out`` as the numpy array the extension writes into (a torch tensor's memory)."""
    if out is None or not _is_torch_tensor(out):
        return out
    torch = _torch()
    if out.device.type != "cpu" or not out.is_contiguous():
        raise InvalidArgument("out: a torch tensor must be on the CPU and contiguous")
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16).numpy().view(np.uint16)
    return out.numpy()


def _rows(indices: Any) -> np.ndarray:
    """Row indices as a C-contiguous int64 array (1-D, integers only)."""
    if _is_torch_tensor(indices):
        indices = indices.detach().cpu().numpy()
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise InvalidArgument(f"rows: indices must be 1-D, got shape {idx.shape}")
    if idx.size == 0:
        idx = idx.astype(np.int64)
    if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
        raise InvalidArgument(f"rows: indices must be integers, got {idx.dtype}")
    if idx.dtype == np.uint64 and idx.size and int(idx.max()) > np.iinfo(np.int64).max:
        raise OutOfBounds("rows: an index is out of bounds (beyond int64)")
    return np.ascontiguousarray(idx, dtype=np.int64)


def _array_and_dtype(array: Any, dtype: Optional[str], what: str) -> Tuple[np.ndarray, str]:
    """A C-contiguous native-order numpy array and its tessera dtype (no casting)."""
    if _is_torch_tensor(array):
        array, torch_dtype = _from_torch(array)
        if torch_dtype is not None and dtype is None:
            dtype = torch_dtype
    arr = np.asarray(array)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if dtype is None:
        dtype = _TESSERA_OF.get(arr.dtype)
        if dtype is None:
            raise InvalidArgument(
                f"{what}: numpy dtype {arr.dtype} has no tessera dtype (expected one of "
                f"{', '.join(str(d) for d in _TESSERA_OF)}; for bfloat16 pass uint16 "
                "words with dtype='bfloat16', for float8 uint8 bytes with "
                "dtype='float8_e4m3fn' or 'float8_e5m2')")
    elif arr.dtype != numpy_dtype(dtype):
        raise InvalidArgument(
            f"{what}: dtype '{dtype}' needs a {numpy_dtype(dtype)} array, got {arr.dtype} "
            "(convert it first; tessera does not cast)")
    # (ascontiguousarray would turn a 0-d array into 1-d.)
    return (arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)), dtype


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------


class _Closed:
    """Stands in for the extension's client after close()."""

    def __init__(self, address: str) -> None:
        self._address = address

    def __getattr__(self, attr: str) -> Any:
        raise FailedPrecondition(f"the client of coordinator {self._address} is closed")


class _Progress:
    """A tqdm bar fed, every 0.25 s, from the bytes the client has moved
    (counted as they land or leave) while one call runs; nothing when
    ``enabled`` is false."""

    def __init__(self, impl: Any, total: Optional[int], desc: str,
                 enabled: bool,
                 sample: Optional[Callable[[], Optional[Tuple[int, int]]]] = None
                 ) -> None:
        self._impl = impl
        self._total = total if total else None
        self._desc = desc
        self._enabled = enabled
        self._bar: Any = None
        # (done, total) from elsewhere (the coordinator, for a reshard);
        # None: this client's own byte counts.
        self._sample = sample

    def __enter__(self) -> "_Progress":
        if not self._enabled:
            return self
        try:
            from tqdm import tqdm
        except ImportError as e:
            raise ImportError(
                "progress=True needs tqdm (Debian: python3-tqdm; pip install tqdm)") from e
        self._base = self._impl.moved() if self._sample is None else 0
        self._bar = tqdm(total=self._total, desc=self._desc, unit="B",
                         unit_scale=True, unit_divisor=1024)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._update()

    def _update(self) -> None:
        if self._sample is not None:
            now = self._sample()
            if now is None:
                return
            done, total = now
            if total and self._bar.total != total:
                self._total = total
                self._bar.total = total
                self._bar.refresh()
        else:
            done = self._impl.moved() - self._base
        if self._total is not None:
            done = min(done, self._total)
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._bar is None:
            return False
        self._stop.set()
        self._thread.join()
        self._update()
        if exc_type is None and self._sample is not None and self._bar.total:
            # Done: the last bytes landed after the last sample, and the
            # move is no longer there to ask.
            self._bar.update(self._bar.total - self._bar.n)
        self._bar.close()
        return False


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    n = numpy_dtype(dtype).itemsize
    for d in shape:
        n *= int(d)
    return n


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

    def transfer_stats(self) -> Dict[str, Any]:
        """What this client's data plane moved since it connected:
        ``{"bytes": {transport: N}, "fallbacks": {transport: N}, "served":
        {worker: N}, "landed": N, "sent": N, "workers_sent": {worker: N}}``
        (``get --json``'s ``"transport"``, ``"fallbacks"`` and
        ``"replicas"``: bytes read from each worker; a transport or worker
        that moved nothing is left out). ``"workers_sent"`` is what each
        worker sent to others for this client's writes and reshards, filling
        replicas and mirrors (the writes' ``--json`` ``"sent"``)."""
        return self._impl.transfer_stats()

    def coordinators(self) -> List[CoordinatorInfo]:
        """The coordinators (``connect("A1,A2,A3")``), the leader first."""
        return [CoordinatorInfo(**c) for c in self._impl.coordinators()]

    def quota(self) -> List[Dict[str, Any]]:
        """What principals hold against their quotas (``tessera quota
        --json``): ``[{"principal", "bytes", "bytes_limit", "names",
        "names_limit"}]``, a limit ``None`` where there is none. An admin
        sees every principal, others only themselves. A change past a quota
        raises ``ResourceExhausted`` ("quota: ...")."""
        return self._impl.quotas()

    def list(self) -> List[TensorInfo]:
        """Every tensor: name, shape, dtype, version, number of shards."""
        return [TensorInfo(**t) for t in self._impl.list()]

    # -- workers (the admin role) ------------------------------------------

    def cordon(self, worker: str) -> None:
        """No new shards or replicas go to ``worker``. Raises NotFound."""
        self._impl.set_worker_state(worker, "cordoned")

    def uncordon(self, worker: str) -> None:
        """``worker`` takes new shards again. Raises NotFound."""
        self._impl.set_worker_state(worker, "ready")

    def drain(self, worker: str, timeout: float = 600.0) -> None:
        """Moves every shard ``worker`` holds elsewhere and returns once it holds none.

        Repair gives each of its shards a replica on a ready worker, then frees
        its own (with one replica that moves the shard). Raises NotFound for an
        unknown worker, DeadlineExceeded after ``timeout`` seconds (the drain
        goes on).
        """
        self._impl.drain_worker(worker, timeout)

    def remove_worker(self, worker: str) -> None:
        """Forgets a dead or drained worker.

        Raises FailedPrecondition ("holds") while it holds the only replica of a
        shard, or while it is alive and not drained.
        """
        self._impl.remove_worker(worker)

    # -- tensors -----------------------------------------------------------

    def describe(self, name: str) -> TensorMeta:
        """The tensor's metadata and its shards, each with a :class:`ShardHandle`.

        Raises NotFound if there is no such tensor.
        """
        return _meta(self._impl.describe(name))

    def delete(self, name: str) -> None:
        """Deletes the tensor and frees its shards. Raises NotFound if absent."""
        self._impl.delete(name)

    def wait(self, name: str, version: Optional[int] = None,
             timeout: Optional[float] = None) -> int:
        """Waits until the tensor's committed version is at least ``version``
        (None: one more than it is now) and returns it, at once if it already
        is. The coordinator answers at the commit: nothing polls. Raises
        DeadlineExceeded after ``timeout`` seconds (None: 24 h), NotFound when
        the tensor is unknown or deleted meanwhile, ResourceExhausted when the
        coordinator holds its ``--max_waiters`` waits. Given several
        coordinators, a wait carries on at the next leader after a
        failover."""
        return self._impl.wait(name, version, timeout)

    def put(self, name: str, array: Any, *, chunk_dim: Optional[int] = None,
            placements: Optional[Placements] = None,
            shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
            dtype: Optional[str] = None, replicas: int = 0,
            mirror: Optional[str] = None, progress: bool = False) -> TensorMeta:
        """Scatters ``array`` into a new sharded tensor ``name`` (shape and dtype from it).

        ``progress=True`` shows a tqdm bar of the bytes as they are written
        (needs tqdm: Debian's python3-tqdm).

        The bytes are read straight from the array's buffer (a non C-contiguous
        array is made contiguous first); a CPU torch tensor works too (bfloat16
        included). ``dtype`` defaults to the array's; give
        ``dtype="bfloat16"`` with a uint16 array of bfloat16 words (see
        :func:`float32_to_bfloat16`). The tensor becomes visible only once every
        shard is written. Raises AlreadyExists if ``name`` exists, InvalidArgument
        for a bad sharding ("overlap", "cover", "invalid sharding dim", "does not
        exist", ...).
        """
        arr, dtype = _array_and_dtype(array, dtype, "put")
        if arr.ndim == 0:
            raise InvalidArgument(
                "put: a tensor needs at least one dim (got a 0-d array; reshape it to (1,))")
        spec = self._spec(chunk_dim, placements, shards, default_all=True,
                          replicas=replicas, mirror=mirror)
        with _Progress(self._impl, arr.nbytes, f"put {name}", progress):
            return _meta(self._impl.put(name, arr, dtype, spec))

    def create(self, name: str, shape: Sequence[int], dtype: str = "float32", *,
               chunk_dim: Optional[int] = None, placements: Optional[Placements] = None,
               shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
               init: str = "empty", replicas: int = 0,
               mirror: Optional[str] = None) -> TensorMeta:
        """Allocates a sharded tensor on the workers, filled per ``init``.

        ``init``: ``"empty"`` (the default, as the CLI), ``"zeros"``, ``"ones"``,
        ``"arange"`` (np.arange(n).reshape(shape) cast to dtype), ``"full:V"``
        or ``"rand:SEED"`` (floats in [0, 1), integers in [0, 100); a pure
        function of the seed, independent of the sharding).
        """
        shape = [operator.index(d) for d in shape]
        spec = self._spec(chunk_dim, placements, shards, default_all=True,
                          replicas=replicas, mirror=mirror)
        return _meta(self._impl.create(name, shape, str(dtype), spec, init))

    def get(self, name: str, region: Region = None, *, out: Optional[Any] = None,
            torch: bool = False, with_version: bool = False,
            progress: bool = False) -> Any:
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

        ``torch=True`` returns a ``torch.Tensor`` sharing the result's memory
        (bfloat16 as ``torch.bfloat16``); ``out`` may then also be a contiguous
        CPU torch tensor of the result's dtype and shape. Raises ImportError
        when torch cannot be imported.

        ``with_version=True`` returns ``(result, version)``: the version whose
        bytes the result holds (a get that met a newer version, committed
        meanwhile, reads that one whole).

        ``progress=True`` shows a tqdm bar of the bytes as they land (needs
        tqdm: Debian's python3-tqdm); for a whole tensor it knows the total.
        """
        if torch:
            _torch()
        total = None
        if progress and region is None:
            meta = self.describe(name)
            total = _nbytes(meta.shape, meta.dtype)
        with _Progress(self._impl, total, f"get {name}", progress):
            arr, version = self._impl.get(name, _region_key(region),
                                          _out_array(out))
        if with_version:
            return self._finish_get(name, arr, out, torch), version
        return self._finish_get(name, arr, out, torch)

    def _finish_get(self, name: str, arr: Any, out: Optional[Any],
                    torch: bool) -> Any:
        if not torch:
            return arr
        if out is not None and _is_torch_tensor(out):
            return out
        return _to_torch(arr, self._dtype_of(name, arr))

    def get_rows(self, name: str, indices: Any, *, out: Optional[Any] = None,
                 torch: bool = False, with_version: bool = False,
                 progress: bool = False) -> Any:
        """Rows ``indices`` of dim 0, as an array of shape ``(len(indices),) + shape[1:]``.

        ``indices``: a 1-D sequence or array of integers (any order, repeats
        allowed, negative counts from the end; empty gives 0 rows). Row i of
        the result is row ``indices[i]``; each distinct row is read once, with
        one batched request per worker. An index outside the tensor raises
        OutOfBounds ("out of bounds"); non-integer or non-1-D indices raise
        InvalidArgument. ``out``, ``torch``, ``with_version`` and
        ``progress`` as for :meth:`get`.
        """
        if torch:
            _torch()
        idx = _rows(indices)
        with _Progress(self._impl, None, f"get_rows {name}", progress):
            arr, version = self._impl.get_rows(name, idx, _out_array(out))
        if with_version:
            return self._finish_get(name, arr, out, torch), version
        return self._finish_get(name, arr, out, torch)

    def get_shard(self, name: str, index: int, *, torch: bool = False) -> Any:
        """Shard ``index`` (in describe order) of the current version."""
        if torch:
            _torch()
        arr = self._impl.get_shard(name, operator.index(index))
        return _to_torch(arr, self._dtype_of(name, arr)) if torch else arr

    def update(self, name: str, array: Any, region: Region = None, *,
               dtype: Optional[str] = None, progress: bool = False) -> UpdateStats:
        """Writes new contents into tensor ``name`` as version N+1, keeping its layout.

        Without ``region`` the array must have the tensor's shape; with one
        (numpy basic indexing, as :meth:`get`), the region's shape (dims that
        integer indices drop left out), and only that region changes: shards
        that do not intersect it are taken over without a copy. The dtype must
        be the tensor's (no casting; bfloat16 as uint16 words or a torch
        bfloat16 tensor). Readers see all of version N or all of N+1. A shape
        or dtype mismatch raises InvalidArgument ("shape", "dtype").
        """
        arr, dtype = _array_and_dtype(array, dtype, "update")
        key = None if region is None else _region_key(region)
        with _Progress(self._impl, arr.nbytes, f"update {name}", progress):
            return UpdateStats(**self._impl.update(name, arr, dtype, key))

    def import_safetensors(self, path: str, *, chunk_dim: Optional[int] = None,
                           placements: Optional[Placements] = None,
                           shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
                           prefix: str = "", replicas: int = 0,
                           mirror: Optional[str] = None,
                           progress: bool = False) -> List[TensorInfo]:
        """Creates one tensor per entry of the .safetensors file at ``path``.

        Each tensor is named ``prefix`` + the entry's name and laid out by the
        sharding (as :meth:`put`; boxes are resolved against each entry's
        shape; with none, chunked along dim 0 over every alive worker). All or
        nothing: the file, every name, every layout and that no name is taken
        are checked before anything is created, and a failure later deletes
        what was made. A malformed file raises InvalidArgument naming
        "safetensors"; a chunk dim beyond an entry's dims, "invalid sharding
        dim". The data is read from a mapping of the file (no copy).
        ``progress=True`` shows a tqdm bar of the bytes as they are written.
        """
        spec = self._spec(chunk_dim, placements, shards, default_all=True,
                          replicas=replicas, mirror=mirror)
        with _Progress(self._impl, None, f"import {path}", progress):
            made = self._impl.import_safetensors(str(path), spec, prefix)
        return [TensorInfo(**t) for t in made]

    def load(self, dir: str, *, chunk_dim: Optional[int] = None,
             placements: Optional[Placements] = None,
             shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
             prefix: str = "", replicas: int = 0, mirror: Optional[str] = None,
             progress: bool = False) -> LoadStats:
        """One tensor per entry of checkpoint directory ``dir``, relative to the
        workers' ``--checkpoint_root`` (a Hugging Face model directory: one
        .safetensors file, or several named by model.safetensors.index.json).

        Each tensor is named ``prefix`` + the entry's name and laid out by the
        sharding (as :meth:`import_safetensors`; a 0-d entry is kept as shape
        ``(1,)``). Each worker reads from the files only its shards' bytes; no
        byte passes through this process. All or nothing. A directory that is
        absolute or leaves the root raises InvalidArgument naming
        "checkpoint_root"; a damaged file, "checkpoint". ``dir`` may also be
        a checkpoint :meth:`save` wrote. ``progress=True`` shows a tqdm bar
        of the bytes the workers have landed.
        """
        spec = self._spec(chunk_dim, placements, shards, default_all=True,
                          replicas=replicas, mirror=mirror)
        with _Progress(self._impl, None, f"load {dir}", progress,
                       sample=self._impl.load_progress):
            d = self._impl.load(str(dir), spec, prefix)
        d["tensors"] = [TensorInfo(**t) for t in d["tensors"]]
        return LoadStats(**d)

    def save(self, dir: str, names: Optional[Sequence[str]] = None, *,
             prefix: Optional[str] = None, overwrite: bool = False,
             progress: bool = False) -> SaveStats:
        """Saves tensors, each at its current version, into checkpoint
        directory ``dir``, relative to the workers' ``--checkpoint_root``.

        Give ``names`` or ``prefix`` (every tensor whose name starts with
        it). Each worker writes the shards it holds into its own .safetensors
        file, in parallel; then ``tessera.json`` and
        ``model.safetensors.index.json`` go in, each whole, so a save that
        fails leaves any earlier checkpoint in ``dir`` loadable. ``load``
        reads it back in any layout. ``progress=True`` shows a tqdm bar of
        the bytes the workers have written (with ``names``). A checkpoint
        already in ``dir`` that another principal saved (or that tessera did
        not save) is replaced only with ``overwrite=True``; else
        ``AlreadyExists``. Needs the write role.
        """
        if (names is None) == (prefix is None):
            raise InvalidArgument("save: give names or prefix, not both or neither")
        if isinstance(names, str):
            names = [names]
        listed = None if names is None else [str(n) for n in names]
        watched = listed[0] if listed else None
        with _Progress(self._impl, None, f"save {dir}", progress and watched is not None,
                       sample=lambda: self._impl.reshard_progress(watched)):
            d = self._impl.save(str(dir), listed, prefix, overwrite)
        return SaveStats(**d)

    def export_hf(self, dir: str, names: Optional[Sequence[str]] = None, *,
                  prefix: Optional[str] = None, strip_prefix: str = "",
                  max_shard_size: Union[int, str, None] = None,
                  overwrite: bool = False, progress: bool = False) -> SaveStats:
        """Writes tensors as a Hugging Face sharded directory ``dir``,
        relative to the workers' ``--checkpoint_root`` (``tessera export
        --hf``).

        Give ``names`` or ``prefix``. The directory gets
        ``model-0000K-of-0000N.safetensors`` files, each holding whole
        tensors and at most ``max_shard_size`` bytes of data unless one
        tensor is larger (bytes as an int, or a size as Hugging Face writes
        one: ``"5GB"``, ``"500MiB"``; default 5 GB), and
        ``model.safetensors.index.json``. Entries are the tensor names less
        ``strip_prefix``. The workers holding the shards write the bytes;
        none pass through this client. A directory tessera did not write,
        or another principal's, is replaced only with ``overwrite=True``;
        else ``AlreadyExists``. ``load`` reads it back in any layout.
        ``progress=True`` shows a tqdm bar of the bytes written (with
        ``names``). Needs the write role.
        """
        if (names is None) == (prefix is None):
            raise InvalidArgument("export_hf: give names or prefix, not both or neither")
        if isinstance(names, str):
            names = [names]
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, (int, str, type(None))) \
                or (isinstance(max_shard_size, int) and max_shard_size >= 2**63):
            raise InvalidArgument("export_hf: max_shard_size is bytes (an int) or a size such as '5GB'")
        listed = None if names is None else [str(n) for n in names]
        watched = listed[0] if listed else None
        with _Progress(self._impl, None, f"export {dir}", progress and watched is not None,
                       sample=lambda: self._impl.reshard_progress(watched)):
            d = self._impl.export_hf(str(dir), listed, prefix, str(strip_prefix),
                                     max_shard_size, overwrite)
        return SaveStats(**d)

    def export_safetensors(self, path: str, names: Optional[Sequence[str]] = None, *,
                           prefix: Optional[str] = None,
                           metadata: Optional[dict] = None,
                           progress: bool = False) -> SafetensorsExport:
        """Writes tensors into one new .safetensors file at ``path`` (atomically).

        Give ``names`` (entry names are the tensor names) or ``prefix`` (every
        tensor whose name starts with it; entry names are the rest). dtypes
        map to F32 F64 F16 BF16 I8 U8 I16 I32 I64 BOOL U16 U32 U64 F8_E4M3
        F8_E5M2. Tensors imported from a file go first, in that file's
        order, and the file's ``__metadata__`` comes back; ``metadata`` (str
        to str) adds to it (or replaces a key's value). Each tensor is
        gathered straight into the file's mapping; a failed export leaves no
        file.
        ``progress=True`` shows a tqdm bar of the bytes as they land.
        """
        if (names is None) == (prefix is None):
            raise InvalidArgument("export_safetensors: give names or prefix, not both or neither")
        if isinstance(names, str):
            names = [names]
        meta = [(str(k), str(v)) for k, v in (metadata or {}).items()]
        with _Progress(self._impl, None, f"export {path}", progress):
            d = self._impl.export_safetensors(
                str(path), None if names is None else [str(n) for n in names], prefix, meta)
        return SafetensorsExport(**d)

    def reshard(self, name: str, *, chunk_dim: Optional[int] = None,
                placements: Optional[Placements] = None,
                shards: Optional[Union[str, Iterable[Tuple[Box, str]]]] = None,
                replicas: int = 0, mirror: Optional[str] = None,
                progress: bool = False) -> ReshardStats:
        """Moves the tensor to a new sharding; data is preserved, version + 1.

        Pieces that keep their owner are not moved. Readers of the old version
        finish on it; handles to it fail afterwards with FailedPrecondition.
        ``progress=True`` shows a tqdm bar of the bytes as they land in the
        new shards (the coordinator's count: the workers move them).
        """
        spec = self._spec(chunk_dim, placements, shards, default_all=False,
                          replicas=replicas, mirror=mirror)
        with _Progress(self._impl, None, f"reshard {name}", progress,
                       sample=lambda: self._impl.reshard_progress(name)):
            return ReshardStats(**self._impl.reshard(name, spec))

    # -- helpers -----------------------------------------------------------

    def _dtype_of(self, name: str, arr: np.ndarray) -> str:
        """The tessera dtype of a fetched array: uint16 and uint8 arrays may
        hold bfloat16 or float8 words, which the tensor's dtype tells."""
        if arr.dtype in (np.dtype(np.uint16), np.dtype(np.uint8)):
            return self.describe(name).dtype
        return _TESSERA_OF[arr.dtype]

    def _spec(self, chunk_dim: Optional[int], placements: Optional[Placements],
              shards: Any, default_all: bool, replicas: int = 0,
              mirror: Optional[str] = None) -> tuple:
        """The sharding as the native module takes it; its last items are
        ``replicas`` (workers per shard; 0: the default, 1 for a new tensor
        and the current count for a reshard) and ``mirror`` (the mirror
        group's selector, ``"none"`` to drop it; ``""``: a create's none, a
        reshard's current)."""
        return self._layout(chunk_dim, placements, shards, default_all) + (
            operator.index(replicas), "" if mirror is None else str(mirror))

    def _layout(self, chunk_dim: Optional[int], placements: Optional[Placements],
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
            token_file: Optional[str] = None,
            transport: Optional[str] = None) -> Client:
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

    ``transport`` (as the CLI's ``--transport``; default
    ``$TESSERA_TRANSPORT``, then ``"auto"``): how bytes move between the
    workers and this client. ``"auto"`` takes shared memory for workers on
    this host, else UCX where allowed, else the workers' TCP data ports,
    else gRPC; ``"shm"``, ``"ucx"``, ``"tcp"`` or ``"grpc"`` forces one (a
    worker it cannot reach raises FailedPrecondition or Unavailable naming
    the transport and the worker). Any other name raises InvalidArgument.
    ``Client.transfer_stats()`` tells what each transport moved.
    """
    if address is None:
        address = os.environ.get("TESSERA_COORDINATOR") or DEFAULT_COORDINATOR

    def setting(value: Optional[str], env: str) -> str:
        return value if value is not None else os.environ.get(env, "")

    return Client(_tessera.Client.connect(
        address, float(rpc_timeout), float(connect_timeout), float(data_timeout),
        int(max_parallel_streams), setting(tls_ca, "TESSERA_TLS_CA"),
        setting(tls_cert, "TESSERA_TLS_CERT"), setting(tls_key, "TESSERA_TLS_KEY"),
        setting(token_file, "TESSERA_TOKEN_FILE"),
        setting(transport, "TESSERA_TRANSPORT") or "auto"))
