"""``python -m hopperlab.assets``: see ``hopperlab.assets.cli``."""

import sys

from hopperlab.assets.cli import main

sys.exit(main())
