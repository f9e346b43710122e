"""Energy of a run: GPU counters (NVML), a power trace, host sensors (RAPL, Grace hwmon).

``arithmetic`` turns readings into joules (pure, tested on recorded traces), ``nvml`` and
``host`` read the sensors, ``meter`` ties them to the measured window (``core.window``).
The method and its limits: docs/benchmarks/energy.md.
"""
