"""``python -m hopperlab.assets``: see ``hopperlab.cli.assets``."""

import sys

from hopperlab.cli.assets import main

sys.exit(main())
