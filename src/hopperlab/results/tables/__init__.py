"""The plain-text tables a person reads in the docs and a GPU call's output, as `hopperlab
table` verbs (runs, sharded, energy): what were scripts beside the product."""
