"""The gate of the oversubscription variants (``oversubscribe: true``), first thing in the run.

Full fine-tuning of Llama-2-7B under managed memory asks for more than an 80-96 GB GPU holds;
on a discrete GPU that can hang the node for everyone, so such a run is refused (``skipped``,
with the reason) before the managed allocator, the model or the data are touched, unless the
node is a Grace Hopper or the site allows oversubscription (cuda.managed_policy).
"""

from __future__ import annotations

from hopperlab.core.rundir import SkipRun
from hopperlab.cuda.managed_policy import oversubscription_refusal
from hopperlab.node import hardware
from hopperlab.workloads.base import Recording, RunView


def check_oversubscription(spec: RunView, oversubscribe: bool, recorder: Recording) -> None:
    """Raise SkipRun where this node may not oversubscribe; tag the decision either way."""
    if not oversubscribe:
        return
    hw = recorder.hardware or hardware.fingerprint()
    site = spec.site
    allow = site.allow_oversubscription
    grace = bool(hw.get("is_grace_hopper"))
    node = (f"{hw.get('gpu_model') or 'without a GPU'} on {hw.get('cpu_arch')}"
            f"{' (Grace Hopper)' if grace else ', not a Grace Hopper'}")
    reason = oversubscription_refusal(grace, allow, node=node,
                                      site=site.name or "(none)")
    recorder.set_tag("finetune.oversubscription",
                     "refused" if reason else ("allowed: Grace Hopper" if grace
                                               else "allowed: site allow_oversubscription"))
    if reason:
        raise SkipRun(reason)
