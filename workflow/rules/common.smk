# The resolved matrix (validated: a config mistake stops here, before any job) and helpers.
import shlex
import sys

from hopperlab.spec import SpecError, load_matrix
from hopperlab.workflow_support import (
    config_args,
    run_key,
    run_output_paths,
    spec_fingerprint,
    tracking_marker,
)

try:
    MATRIX = load_matrix(workflow.basedir, config)
except SpecError as exc:
    raise WorkflowError(f"hopperlab: config error:\n{exc}") from None

RESULTS = MATRIX.config["results_dir"]
HOPPERLAB = f"{shlex.quote(sys.executable)} -m hopperlab.cli"
CONFIG_ARGS = config_args(MATRIX.config)
TRACKING_MARKER = tracking_marker(MATRIX)
RUN_OUTPUTS = run_output_paths(MATRIX)
