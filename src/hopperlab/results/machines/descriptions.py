"""``configs/machines/<name>.yaml``: what a machine offers, each figure with its source.

Predictions read these (each family's ``workloads/<family>/predict.py``); a figure without a
source would be a guess passed off as a fact, so every figure is ``{value: ..., source: ...}``
and the file is read strictly: a missing or unknown key is an error naming the file and the key
path. ``value: null`` is allowed
where the machine does not have the thing (direct host reads over PCIe), and the source says why.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hopperlab.core.errors import SpecError
from hopperlab.core.schema import load_yaml, typed_from_mapping
from hopperlab.node.naming import split_gpu_count

MACHINES_DIR = Path("configs") / "machines"


@dataclass(frozen=True)
class Figure:
    """One number and where it comes from (measured here, with the command; or published, with
    the reference)."""

    value: float | None
    source: str

    def __post_init__(self) -> None:
        if not self.source.strip():
            raise ValueError("source: must say where the figure comes from")
        if self.value is not None and (isinstance(self.value, bool)
                                       or not math.isfinite(self.value) or self.value <= 0):
            raise ValueError(f"value: is {self.value!r}; a machine's figure is a finite number "
                             f"above 0 (null: not known)")


@dataclass(frozen=True)
class Directions:
    """GB/s host->device, device->host, both at once (the sum)."""

    h2d: Figure
    d2h: Figure
    bidir: Figure


@dataclass(frozen=True)
class HostLink:
    kind: str
    pinned: Directions
    pageable: Directions
    #: kernels reading host memory directly (zero-copy / system memory over C2C), GB/s
    direct_h2d: Figure


@dataclass(frozen=True)
class MatmulProbe:
    """The node's own matmul loop in TFLOP per joule (the runs ``membench/matmul/bf16`` and ``/fp8``, measured):
    no model does more work per joule, so a run above it by more than 10 % has joules or work
    that are wrong (``config.energy.plausibility``). fp8 runs are held to the fp8 figure."""

    bf16: Figure
    fp8: Figure | None = None

    def ceiling(self, fp8: bool) -> float | None:
        figure = self.fp8 if fp8 and self.fp8 is not None else self.bf16
        return figure.value


@dataclass(frozen=True)
class MachineDescription:
    name: str
    description: str
    aliases: tuple[str, ...]
    gpu_model: str
    cpu_arch: str
    gpu_memory_gb: Figure
    hbm_tbps: Figure
    bf16_tflops: Figure
    fp8_tflops: Figure
    host_link: HostLink
    host_memory_gb: Figure
    host_memory_gbps: Figure
    cpu_cores: Figure
    #: the module's (GH200: CPU + GPU + memory) or board's power in W, for energy predictions;
    #: optional: a description without it predicts no energy and says so
    module_power_w: Figure | None = None
    #: the node's matmul probe (TFLOP per joule), for the energy plausibility gate; optional:
    #: without it a comparison cannot tell an implausible energy and says nothing of it
    matmul_tflop_per_j: MatmulProbe | None = None
    source_file: str = ""

    def figure(self, path: str) -> Figure:
        """``host_link.pinned.h2d`` -> that Figure."""
        obj: Any = self
        for part in path.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, Figure):
            raise KeyError(path)
        return obj


def _build(cls: type, data: Any, where: str) -> Any:
    """A (nested) frozen dataclass from YAML, strictly: unknown, missing or mistyped keys are
    SpecErrors naming ``where`` and the key path."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    values = dict(data)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        optional = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(optional) == 1 and dataclasses.is_dataclass(optional[0]) \
                and values.get(f.name) is not None:
            tp = optional[0]  # an optional figure given: built like a required one
        if dataclasses.is_dataclass(tp) and f.name in values:
            values[f.name] = _build(tp, values[f.name], f"{where}.{f.name}")
    return typed_from_mapping(cls, values, where, "key of a machine description",
                              hidden=("source_file",))


def load_description(path: Path) -> MachineDescription:
    data = load_yaml(path, "machine description")
    desc = _build(MachineDescription, data, str(path))
    if desc.name != path.stem:
        raise SpecError(f"{path}: name: is {desc.name!r}, expected {path.stem!r} (the file name)")
    return dataclasses.replace(desc, source_file=str(path))


def load_descriptions(folder: Path) -> dict[str, MachineDescription]:
    """Every description in ``folder``, by name (each file validated)."""
    return {p.stem: load_description(p) for p in sorted(Path(folder).glob("*.yaml"))}


#: a node of several GPUs has its own host (cores, memory): those figures of the one-GPU
#: description do not carry over
_HOST_FIGURES = ("host_memory_gb", "host_memory_gbps", "cpu_cores")


def _several(base: MachineDescription, count: int, name: str) -> MachineDescription:
    """``<count>x<base>``: the base's per-GPU figures (peaks, HBM, each GPU's host link); the
    host's own figures unknown until a description of that node is written."""
    unknown = {f: Figure(None, f"not described: {name} is {count} GPUs of {base.name}, whose "
                               f"host figures are a one-GPU node's (write {name}.yaml)")
               for f in _HOST_FIGURES}
    return dataclasses.replace(base, name=name, aliases=(), module_power_w=None,
                               description=f"{count} x {base.description} (per-GPU figures of "
                                           f"{base.name})", **unknown)


def find_description(folder: Path, name: str) -> MachineDescription:
    """The description named ``name`` or carrying it as an alias; ``<n>x<name>`` (a run of
    several GPUs, node.naming) without a file of its own takes ``<name>``'s per-GPU figures."""
    descs = load_descriptions(folder)
    if name in descs:
        return descs[name]
    for desc in descs.values():
        if name in desc.aliases:
            return desc
    count, single = split_gpu_count(name)
    if count > 1:
        return _several(find_description(folder, single), count, name)
    known = ", ".join(f"{n} ({', '.join(d.aliases)})" if d.aliases else n
                      for n, d in descs.items()) or "none"
    raise SpecError(f"--machine {name}: no description in {folder}; known machines: {known}")
