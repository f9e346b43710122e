"""Memory techniques shared by the workloads, one module per technique.

``pinned`` (the exact-size pinned buffer pool), ``activation_offload`` (saved activations to
pinned host memory: hooks and streams) with ``offload_budget`` (its policy under a GPU-memory
budget), ``parameter_offload`` (frozen weights streamed layer by layer), ``checkpointing``,
``recompute_elementwise``, ``chunked_cross_entropy``, ``fp8``, ``managed_allocator``,
``saved_tensor_census`` (what one forward saves for backward, by size class) and ``layers``
(finding the decoder layers). How they compose: docs/memory.md.

Which values of the knobs reach which technique is the families' to declare
(``FamilyInfo.supported_knobs``); this package names none. Importing it is cheap (no torch).
"""
