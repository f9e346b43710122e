"""What the submitting side adds to every record: the machine it ran on, the container image
(runtime, digest) and what it cost.

Done when the record is settled (``submit._settle_record``), so that a job that died before
writing its record is named and priced too, and the job itself stays free of pricing.
The machine name goes into the record (``machine``) and its tags (MLflow tag ``machine``);
the cost figures go into its metrics (``cost_run``, ``cost_per_...``), the currency into the tag
``cost.currency``; energy per unit of work and work per joule (``config.energy``) too, priced
at the site's ``per_kwh`` as lines of their own (``cost_energy...``).
"""

from __future__ import annotations

from typing import Any

from hopperlab.config.cost import price
from hopperlab.config.energy import (
    ENERGY_GPU,
    energy_basis,
    energy_cost,
    energy_figures,
    energy_scope,
)
from hopperlab.config.spec import RunSpec
from hopperlab.run.isolation import isolation_of
from hopperlab.core.energy_names import (SLOW_STEP_X, SLOW_STEPS, TAG_BASIS, TAG_SLOW,
                                         TAG_WORK_NOT_COUNTED)
from hopperlab.node.containers import image_digest
from hopperlab.node.naming import machine_name
from hopperlab.workloads import family_info

TAG_MACHINE = "machine"


def annotate_record(rec: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
    """``rec`` with ``machine`` and, where the site has a price, the cost metrics."""
    name = machine_name(rec.get("hardware") or {}, spec.site.machine)
    if getattr(spec, "host_bound", None) is not None:  # a stand-in spec may have none
        rec["isolation"] = isolation_of(spec)
    rec["machine"] = name
    tags = rec.setdefault("tags", {})
    tags[TAG_MACHINE] = name
    container = getattr(spec.site, "container", None)  # a site without one: no container block
    if container is not None and container.image:
        rec["container"] = {
            "runtime": container.runtime, "image": container.image,
            "image_file": container.image_file,
            "digest": image_digest(str(container.image_file), container.runtime)}
        tags["container.runtime"] = str(container.runtime)
        tags["container.image"] = container.image
        if rec["container"]["digest"]:
            tags["container.digest"] = str(rec["container"]["digest"])
    params = spec.params if isinstance(spec.params, dict) else vars(spec.params)
    metrics = rec.setdefault("metrics", {})
    units = family_info(spec.family).work_units
    metrics.update(energy_figures(metrics, units, params))
    if ENERGY_GPU in metrics:
        tags[TAG_BASIS] = energy_basis(metrics, units, params, tags.get(TAG_WORK_NOT_COUNTED))
    if metrics.get(SLOW_STEPS):
        tags[TAG_SLOW] = (f"{metrics[SLOW_STEPS]:g} measured step(s) over {SLOW_STEP_X:g}x the "
                          f"median step (longest {metrics.get('step_time_max_s', float('nan')):.3g}"
                          f" s): a stall inside the measured window")
    cost = spec.site.cost
    if cost is None:
        return rec
    figures, note = price(metrics, rec.get("duration_s"), cost=cost,
                          gpus=spec.resources.gpus,
                          nodes=int(getattr(spec.resources, "nodes", 1) or 1),
                          units=units, params=params)
    metrics.update(figures)
    energy = energy_cost(metrics, cost, units)
    if energy:
        metrics.update(energy)
        tags["cost.energy"] = f"{cost.per_kwh:g} {cost.currency}/kWh x {energy_scope(metrics)} " \
                              "energy of the measured window"
    tags["cost.currency"] = cost.currency
    tags["cost.basis"] = f"per {cost.basis} hour"
    if cost.example:
        tags["cost.example"] = "true"
    if note:
        tags["cost.note"] = note
    return rec
