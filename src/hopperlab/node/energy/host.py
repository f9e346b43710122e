"""Host energy where the node exposes it: RAPL (x86) and the Grace hwmon power sensors.

RAPL (``/sys/class/powercap/intel-rapl:N``, AMD too) counts microjoules per package and its
DRAM subzone, wrapping at ``max_energy_range_uj``; since Linux 5.10 ``energy_uj`` is readable by
root only on many distributions, which is said when it is so. Grace (GH200) exposes power, not
energy: ACPI power meters in ``/sys/class/hwmon`` named by ``power1_oem_info`` ("Module Power
Socket 0", "Grace Power Socket 0", "CPU Power Socket 0", "SysIO Power Socket 0"), read in
microwatts and integrated by the meter. The module sensor includes the GPU: it is kept apart
(``energy_module_j``), not added to the host's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")
HWMON_ROOT = Path("/sys/class/hwmon")
_GRACE = re.compile(r"^(Module|Grace|CPU|SysIO) Power Socket (\d+)", re.IGNORECASE)
#: which sensors make the host's energy (the module one includes the GPU)
HOST_KINDS = ("package", "dram", "grace")


@dataclass(frozen=True)
class HostSensor:
    """One sensor: ``kind`` package | dram | grace | module | cpu | sysio; ``counter`` True: a
    microjoule counter (RAPL) that wraps at ``wrap``; False: microwatts (hwmon)."""

    name: str
    kind: str
    path: Path
    counter: bool
    wrap: float | None = None

    def read(self) -> float | None:
        try:
            return float(self.path.read_text().strip())
        except (OSError, ValueError):
            return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def rapl_sensors(root: Path = RAPL_ROOT) -> tuple[list[HostSensor], str | None]:
    """Package and DRAM counters under ``root``, or why none can be read."""
    zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.is_dir()) \
        if Path(root).is_dir() else []
    if not zones:
        return [], f"no RAPL zones in {root}"
    out: list[HostSensor] = []
    unreadable = []
    for zone in zones:
        name = _text(zone / "name") or zone.name
        kind = "package" if name.startswith("package") else "dram" if name == "dram" else None
        if kind is None:
            continue  # core / uncore / psys: inside the package, or the whole platform
        sensor = HostSensor(f"{name} ({zone.name})", kind, zone / "energy_uj", True,
                            _float(_text(zone / "max_energy_range_uj")))
        if sensor.read() is None:
            unreadable.append(zone.name)
            continue
        out.append(sensor)
    if not out and unreadable:
        return [], (f"RAPL energy_uj not readable in {', '.join(unreadable)} (root only since "
                    "Linux 5.10 on many distributions)")
    return out, None if out else f"no package or dram RAPL zone in {root}"


def grace_sensors(root: Path = HWMON_ROOT) -> tuple[list[HostSensor], str | None]:
    """The Grace module / socket / CPU / SysIO power sensors under ``root``, or why none."""
    if not Path(root).is_dir():
        return [], f"no {root}"
    out = []
    for mon in sorted(Path(root).iterdir()):
        label = _text(mon / "device" / "power1_oem_info") or _text(mon / "power1_oem_info")
        m = _GRACE.match(label or "")
        if not m:
            continue
        sensor = HostSensor(label or mon.name, m.group(1).lower(), mon / "power1_average", False)
        if sensor.read() is not None:
            out.append(sensor)
    return out, None if out else f"no Grace power sensor in {root}"


def host_sensors(rapl_root: Path = RAPL_ROOT, hwmon_root: Path = HWMON_ROOT
                 ) -> tuple[list[HostSensor], str | None]:
    """RAPL where there is RAPL, else Grace's sensors, else none and both reasons."""
    rapl, why_rapl = rapl_sensors(rapl_root)
    if rapl:
        return rapl, None
    grace, why_grace = grace_sensors(hwmon_root)
    if grace:
        return grace, None
    return [], f"{why_rapl}; {why_grace}"


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
