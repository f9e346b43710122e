"""Where a fine-tuning variant's peak GPU memory goes: which live allocations make up the peak
of the measured steps, grouped by the line of Python that allocated them.

Runs one variant of ``finetune_gpu.py`` with PyTorch's allocator history recording from the
start of the measured steps (``torch.cuda.memory._record_memory_history``), replays the
allocation trace, and prints the live bytes at the peak by allocating frame.

    python benchmarks/peak_probe.py --variant offload-activations [--keep-last 1] [--top 15]
        [--keep-head] [--budget-gib 40] [--recompute] [--inflight-mib 256] [--expandable]
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_gpu as fg  # noqa: E402

GIB = float(1 << 30)


def frame_label(frames: list[dict]) -> str:
    """The innermost frames of project, peft or transformers code (not torch internals)."""
    keep = [f for f in frames if any(k in f.get("filename", "") for k in
                                     ("hopperlab", "peft", "transformers", "finetune_gpu"))]
    pick = keep[:2] or frames[:1]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in pick)


def peak_breakdown(snapshot: dict, top: int) -> None:
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live: dict[int, tuple[int, str]] = {}
    # allocations alive before recording started are in the segments, not in the trace
    base = sum(b["size"] for seg in snapshot["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")
    recorded = set()
    for e in events:
        if e["action"] == "alloc":
            recorded.add(e["addr"])
    cur = best = 0
    best_live: dict[int, tuple[int, str]] = {}
    best_at = ""
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], frame_label(e.get("frames", [])))
            cur += e["size"]
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
        if cur > best:
            best, best_live = cur, dict(live)
            best_at = frame_label(e.get("frames", []))
    print(f"recorded allocations live at the peak: {best / GIB:.2f} GiB (plus what was "
          f"allocated before recording and still alive at the end: {base / GIB:.2f} GiB)")
    print(f"the allocation that reached the peak: {best_at}")
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for size, label in best_live.values():
        groups[label].append(size)
    for label, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(sizes) / GIB:7.3f} GiB  {len(sizes):5d} x  {label}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="offload-activations")
    ap.add_argument("--keep-last", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--keep-head", action="store_true")
    ap.add_argument("--budget-gib", type=float, default=None)
    ap.add_argument("--recompute", action="store_true", help="recompute_elementwise")
    ap.add_argument("--inflight-mib", type=int, default=1024)
    ap.add_argument("--expandable", action="store_true", help="expandable_segments")
    ap.add_argument("--out", type=Path, default=Path("/tmp/peak-probe"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    started = {"on": False}
    reset = torch.cuda.reset_peak_memory_stats

    def reset_and_record(*a, **kw):  # called by the workload when the measured steps start
        if not started["on"]:
            torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
            started["on"] = True
        return reset(*a, **kw)

    torch.cuda.reset_peak_memory_stats = reset_and_record
    p = replace(fg.LORA7B, measured_steps=2, warmup_steps=2)
    knobs = fg.Knobs(offload="activations")
    if args.variant == "save-on-cpu":
        p = replace(p, activation_offload="save_on_cpu")
    elif args.variant == "baseline":
        knobs = fg.Knobs()
    p = replace(p, offload_keep_last_layers=args.keep_last, offload_keep_head=args.keep_head,
                offload_budget_gib=args.budget_gib, recompute_elementwise=args.recompute,
                offload_max_inflight_mib=args.inflight_mib, expandable_segments=args.expandable)
    snap: dict = {}
    orig_free = fg.free_memory

    def grab_then_free() -> None:  # run_variant frees memory after the run: snapshot first
        if started["on"] and not snap:
            snap.update(torch.cuda.memory._snapshot())
            torch.cuda.memory._record_memory_history(enabled=None)
        orig_free()

    fg.free_memory = grab_then_free
    name = (f"{args.variant}-keep{args.keep_last}{'-head' if args.keep_head else ''}"
            f"{f'-budget{args.budget_gib:g}' if args.budget_gib else ''}"
            f"{'-recompute' if args.recompute else ''}")
    fg.run_variant(args.out, "probe", name, "7b", p, knobs)
    peak_breakdown(snap, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
