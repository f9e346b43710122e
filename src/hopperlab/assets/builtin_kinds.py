"""The built-in asset kinds, listed once.

Importing this module registers each of them (every module below calls ``register_kind`` when
imported). ``hopperlab.assets`` imports it, so that whoever reads the registry finds them all; a
new built-in kind is a new module here and a line in ``BUILT_IN``. Families of other packages add
theirs with ``register_kind``.
"""

from __future__ import annotations

from hopperlab.assets import dolly, hub, recsys, tables, tiny, tpch

#: the modules that define the built-in kinds
BUILT_IN = (dolly, hub, recsys, tables, tiny, tpch)
