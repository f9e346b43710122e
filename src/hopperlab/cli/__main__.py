"""`python -m hopperlab.cli`: the same command line as `hopperlab` (used by the workflow's rules)."""

from hopperlab.cli.main import main

raise SystemExit(main())
