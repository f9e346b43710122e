"""``python -m hopperlab.profiling job|metrics|trim`` (see ``finish.main``)."""

import sys

from hopperlab.profiling.finish import main

sys.exit(main())
