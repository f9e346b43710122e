"""The saved-tensor census: what one forward keeps for backward, tensor by tensor, by size class.

Why here (``memory``): it is a measurement *of* the saved-tensor hooks the memory techniques
use (activation offload, ``save_on_cpu``, parameter offload), and must run inside them; it
depends on nothing but torch and ``memory.layers``, so any family may use it. The size classes,
the table's summary and its file formats are plain Python (torch is imported inside the
functions that record), so the report on the login node reads them from here too.

How it counts (docs/memory.md, "The saved-tensor census"):

* **What**: every tensor autograd saves for backward while the census is active (one forward),
  through a pair of saved-tensor hooks pushed *inside* the technique's: only the innermost pair
  is active, so the census's pack records the tensor and hands it to the technique's pack
  (``torch._C._autograd._top_saved_tensors_default_hooks``), and its unpack hands back the
  technique's unpack. The technique offloads as it would without the census.
* **Bytes**: ``nbytes`` is numel x element size of the tensor as saved (what an offload copies).
  A save whose memory an earlier save of the same forward already covers (the same tensor saved
  by two consumers, or a view of it) adds only the bytes no earlier save covered
  (``new_bytes``, from the byte ranges each save spans in its storage); one that adds none is an
  alias: listed, not counted. Storages are told apart by identity (a weak reference), not by
  address, so memory freed by an offload and reused is a new storage.
* **Parameters**: saves of parameters or views of them (weights saved by matrix products) are
  counted apart (``param_*``): they exist anyway and no offload copies them.
* **Where**: the innermost module running at the save (forward pre/post hooks on every module,
  present only during the census's forward), its path (``model.layers.3.mlp.up_proj``), the
  decoder layer it is in (``None``: embedding, head, loss) and a coarse kind from the path.
* **Classes**: the source's five size classes, decimal MB, by ``nbytes``.

Checkpointing: the non-reentrant checkpoint's own hooks are innermost inside each layer, so the
census sees what it keeps (the layer's inputs, kind ``layer``), not the layer's internals; its
recomputation runs in backward, after the census's hooks are gone, and is not counted.
"""

from __future__ import annotations

import csv
import io
import math
import weakref
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Sequence

from hopperlab.memory.layers import decoder_layers

MB = 1e6
GB = 1e9
#: the census's files in a run's artifacts/ folder (one row per save; the summary with them)
CENSUS_JSON = "census.json"
CENSUS_CSV = "census.csv"


@dataclass(frozen=True)
class SizeClass:
    """A size class of the source's table: ``low <= nbytes < high`` (decimal bytes)."""

    key: str
    label: str
    low: float
    high: float


#: the source's five classes (issue 19): < 100 MB, 100-499, 500-999, 1000-1999, >= 2000 MB
SIZE_CLASSES: tuple[SizeClass, ...] = (
    SizeClass("lt100mb", "< 100 MB", 0.0, 100 * MB),
    SizeClass("100_499mb", "100-499 MB", 100 * MB, 500 * MB),
    SizeClass("500_999mb", "500-999 MB", 500 * MB, 1000 * MB),
    SizeClass("1000_1999mb", "1000-1999 MB", 1000 * MB, 2000 * MB),
    SizeClass("ge2000mb", ">= 2000 MB", 2000 * MB, math.inf),
)

#: kinds from a module path, first match wins: (kind, words any path segment may contain)
KIND_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ffn-expert", ("experts", "expert")),
    ("router", ("router", "gate")),
    ("norm", ("norm",)),
    ("attention", ("attn", "attention")),
    ("ffn", ("mlp", "ffn", "feed_forward")),
    ("embedding", ("embed", "wte", "wpe")),
    ("head", ("lm_head", "head")),
    ("loss", ("loss",)),
)
KINDS = tuple(k for k, _ in KIND_RULES) + ("layer", "other")


def size_class(nbytes: float) -> SizeClass:
    """The class of a saved tensor of ``nbytes`` bytes."""
    for cls in SIZE_CLASSES:
        if cls.low <= nbytes < cls.high:
            return cls
    raise ValueError(f"no size class for {nbytes!r} bytes")


def kind_of(path: str, layer: int | None, after_layers: bool) -> str:
    """A coarse kind from the innermost module's path: a segment naming a known part (``router``
    and ``gate`` match whole segments: Llama's ``gate_proj`` is the FFN's); a save made by a
    decoder layer itself (outside its submodules: a checkpoint's inputs) is ``layer``; one made by
    the top model after the decoder stack ran is ``loss``; anything else ``other``."""
    segments = [s.lower() for s in path.split(".") if s and not s.isdigit()]
    for kind, words in KIND_RULES:
        for seg in reversed(segments):
            exact = kind in ("router", "head")
            if (seg in words) if exact else any(w in seg for w in words):
                return kind
    if layer is not None:
        return "layer"
    return "loss" if after_layers else "other"


# ----------------------------------------------------------------------------- the rows
@dataclass
class SavedTensor:
    """One save of the census's forward (a row of ``census.csv``)."""

    index: int
    name: str
    kind: str
    layer: int | None
    dtype: str
    shape: tuple[int, ...]
    device: str
    nbytes: int
    new_bytes: int
    parameter: bool
    alias: bool
    size_class: str

    @property
    def counted(self) -> bool:
        """An activation's save that holds memory no earlier save held."""
        return not self.parameter and not self.alias


@dataclass
class ClassSummary:
    key: str
    label: str
    tensors: int = 0
    bytes: int = 0
    share: float = 0.0
    #: kind -> bytes of that kind in the class
    kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class CensusTable:
    """The census of one forward: the rows, by class, by decoder layer and in total."""

    tensors: list[SavedTensor]
    num_layers: int
    step: int | None = None

    def counted(self) -> list[SavedTensor]:
        return [t for t in self.tensors if t.counted]

    def total_bytes(self) -> int:
        return sum(t.new_bytes for t in self.counted())

    def classes(self) -> list[ClassSummary]:
        out = {c.key: ClassSummary(c.key, c.label) for c in SIZE_CLASSES}
        for t in self.counted():
            s = out[t.size_class]
            s.tensors += 1
            s.bytes += t.new_bytes
            s.kinds[t.kind] = s.kinds.get(t.kind, 0) + t.new_bytes
        total = self.total_bytes()
        for s in out.values():
            s.share = s.bytes / total if total else 0.0
            s.kinds = dict(sorted(s.kinds.items(), key=lambda kv: -kv[1]))
        return list(out.values())

    def layers(self) -> dict[str, dict[str, int]]:
        """Tensors and bytes per decoder layer (``"none"``: embedding, head, loss)."""
        out: dict[str, dict[str, int]] = {}
        for t in self.counted():
            row = out.setdefault("none" if t.layer is None else str(t.layer),
                                 {"tensors": 0, "bytes": 0})
            row["tensors"] += 1
            row["bytes"] += t.new_bytes
        return out

    def metrics(self) -> dict[str, float]:
        """The ``census_*`` metrics (GB decimal, shares as fractions of the counted bytes)."""
        counted = self.counted()
        params = [t for t in self.tensors if t.parameter]
        in_layers = sum(t.new_bytes for t in counted if t.layer is not None)
        out = {"census_tensors_total": float(len(counted)),
               "census_gb_total": self.total_bytes() / GB,
               "census_gb_in_layers": in_layers / GB,
               "census_gb_outside_layers": (self.total_bytes() - in_layers) / GB,
               "census_gb_per_layer": in_layers / GB / self.num_layers if self.num_layers else 0.0,
               "census_layers": float(self.num_layers),
               "census_alias_tensors": float(sum(t.alias for t in self.tensors)),
               "census_param_tensors": float(len(params)),
               "census_param_gb": sum(t.nbytes for t in params) / GB}
        for s in self.classes():
            out[f"census_tensors_{s.key}"] = float(s.tensors)
            out[f"census_gb_{s.key}"] = s.bytes / GB
            out[f"census_share_{s.key}"] = s.share
        return out

    def kind_tags(self) -> dict[str, str]:
        """``census.kinds_<class>``: the kinds that fill each class, largest first."""
        return {f"census.kinds_{s.key}": kinds_text(s.kinds) for s in self.classes() if s.kinds}

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "num_layers": self.num_layers,
                "size_classes": [asdict(c) | {"high": None if math.isinf(c.high) else c.high}
                                 for c in SIZE_CLASSES],
                "metrics": self.metrics(), "classes": [asdict(s) for s in self.classes()],
                "layers": self.layers(), "tensors": [asdict(t) for t in self.tensors]}

    def to_csv(self) -> str:
        buf = io.StringIO()
        names = list(SavedTensor.__dataclass_fields__)
        writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        for t in self.tensors:
            row = asdict(t)
            row["shape"] = "x".join(str(d) for d in t.shape)
            row["layer"] = "" if t.layer is None else t.layer
            writer.writerow(row)
        return buf.getvalue()


def kinds_text(kinds: dict[str, int]) -> str:
    """``ffn 1.2 GB, attention 0.31 GB`` (bytes per kind, largest first)."""
    return ", ".join(f"{k} {b / GB:.3g} GB" for k, b in sorted(kinds.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------- recording
class _Storages:
    """Byte ranges already saved, per storage (by identity), to count shared memory once."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, list[tuple[int, int]]]] = {}

    def add(self, storage: Any, start: int, end: int) -> int:
        """Record ``[start, end)`` of ``storage``; return how many bytes of it are new."""
        entry = self._seen.get(id(storage))
        if entry is None or entry[0]() is not storage:
            entry = (weakref.ref(storage), [])
            self._seen[id(storage)] = entry
        ranges = entry[1]
        new = _uncovered(ranges, start, end)
        ranges.append((start, end))
        return new


def _uncovered(ranges: Sequence[tuple[int, int]], start: int, end: int) -> int:
    """Bytes of ``[start, end)`` that none of ``ranges`` covers."""
    cuts = sorted((max(a, start), min(b, end)) for a, b in ranges if a < end and b > start)
    covered, reach = 0, start
    for a, b in cuts:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return (end - start) - covered


def _span(t: Any) -> tuple[int, int]:
    """The byte range of its storage a tensor's elements span."""
    size = t.element_size()
    if t.numel() == 0:
        return t.storage_offset() * size, t.storage_offset() * size
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    start = t.storage_offset() * size
    return start, start + extent * size


class SavedTensorCensus:
    """Record what one forward saves for backward; use ``observe`` (or the object itself) as the
    context around that forward, inside the technique's context.

    Example::

        census = SavedTensorCensus(model)
        with census.observe(lambda: ActivationOffload(...))():   # or nullcontext
            loss = model(**batch).loss
        loss.backward()
        table = census.table()                 # rows, classes, layers, census_* metrics
    """

    def __init__(self, model: Any, layers: Iterable[Any] | None = None):
        self.model = model
        self.layers = list(decoder_layers(model) if layers is None else layers)
        self._layer_index = {id(m): i for i, m in enumerate(self.layers)}
        self._rows: list[SavedTensor] = []
        self._stack: list[tuple[str, int | None]] = []
        self._storages = _Storages()
        self._params: set[int] = set()
        self._hooks: list[Any] = []
        self._saved: Any = None
        self._after_layers = False
        self._active = False

    # -- context ---------------------------------------------------------------------------
    def observe(self, technique: Callable[[], ContextManager[Any]]) -> Callable[[], ExitStack]:
        """A forward-context factory: the technique's context, the census innermost in it."""
        def context() -> ExitStack:
            stack = ExitStack()
            stack.enter_context(technique())
            stack.enter_context(self)
            return stack
        return context

    def __enter__(self) -> "SavedTensorCensus":
        import torch

        if self._active:
            raise RuntimeError("the census is already active")
        self._rows, self._stack, self._storages = [], [], _Storages()
        self._after_layers = False
        self._params = {id(p.untyped_storage()) for p in self.model.parameters() if p.numel()}
        self._hook_modules()
        outer = torch._C._autograd._top_saved_tensors_default_hooks(True)
        self._saved = torch.autograd.graph.saved_tensors_hooks(*self._chained(outer))
        self._saved.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        self._saved.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def table(self, step: int | None = None) -> CensusTable:
        return CensusTable(list(self._rows), len(self.layers), step)

    # -- hooks -----------------------------------------------------------------------------
    def _chained(self, outer: tuple[Callable, Callable] | None) -> tuple[Callable, Callable]:
        """Pack: record, then the technique's pack (or keep a detached alias: see
        ``activation_offload._Kept``); unpack: the technique's."""
        if outer is None:
            def pack(t: Any) -> Any:
                self._record(t)
                return t.detach()
            return pack, lambda packed: packed
        outer_pack, outer_unpack = outer

        def chained_pack(t: Any) -> Any:
            self._record(t)
            return outer_pack(t)
        return chained_pack, outer_unpack

    def _hook_modules(self) -> None:
        for path, module in self.model.named_modules():
            layer = self._layer_index.get(id(module))
            self._hooks.append(module.register_forward_pre_hook(self._enter(path, layer)))
            self._hooks.append(module.register_forward_hook(self._leave(layer)))

    def _enter(self, path: str, layer: int | None) -> Callable[..., None]:
        def hook(_module: Any, _args: Any) -> None:
            inherited = self._stack[-1][1] if self._stack else None
            self._stack.append((path, layer if layer is not None else inherited))
        return hook

    def _leave(self, layer: int | None) -> Callable[..., None]:
        def hook(_module: Any, _args: Any, _out: Any) -> None:
            if self._stack:
                self._stack.pop()
            if layer is not None and layer == len(self.layers) - 1:
                self._after_layers = True
        return hook

    def _is_parameter(self, t: Any) -> bool:
        import torch

        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return True
        # not ``is_leaf and requires_grad``: a view made inside an autograd.Function's forward
        # is one too
        return id(t.untyped_storage()) in self._params

    def _record(self, t: Any) -> None:
        path, layer = self._stack[-1] if self._stack else ("", None)
        nbytes = t.numel() * t.element_size()
        parameter = self._is_parameter(t)
        new = nbytes if parameter else self._storages.add(t.untyped_storage(), *_span(t))
        self._rows.append(SavedTensor(
            index=len(self._rows), name=path, kind=kind_of(path, layer, self._after_layers),
            layer=layer, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape),
            device=t.device.type, nbytes=nbytes, new_bytes=0 if parameter else new,
            parameter=parameter, alias=not parameter and nbytes > 0 and new == 0,
            size_class=size_class(nbytes).key))
