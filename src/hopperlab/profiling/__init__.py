"""Profiling: the ``profiler`` knob (nsys | torch) from command line to ``prof_`` metrics.

* ``command``     the nsys command line per knob combination, the site's ``profiling:`` block,
                  and the check that refuses ``profiler: nsys`` before submission where no nsys is;
* ``finish``      the wrapper that runs after the profiled process (CSV reports, SQLite export,
                  metrics into the record; its docstring says why it runs there);
* ``nsys_sqlite`` / ``torch_trace``  read a profile into a ``timeline.Timeline``;
* ``timeline``    the derived metrics, the same for both profilers.

Importing this package is cheap (no torch, no sqlite reading): ``hopperlab.run.launch`` imports it on
the submitting side.
"""

from hopperlab.profiling.command import (NSYS_TRACES, PROFILE_DIR, TORCH_TRACE, ProfilingSettings,
                                         check_profiler, nsys_executable, nsys_profile_args,
                                         profiler_prefix, site_settings)

__all__ = ["NSYS_TRACES", "PROFILE_DIR", "TORCH_TRACE", "ProfilingSettings", "check_profiler",
           "nsys_executable", "nsys_profile_args", "profiler_prefix", "site_settings"]
