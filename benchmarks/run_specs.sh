#!/usr/bin/env bash
# Run every spec.json under DIR/results through hopperlab.run.runner.execute (what each Slurm job
# runs), one process per run, then build DIR/results/{summary.csv,report.html}. Needs python3
# with numpy, pyyaml and matplotlib (torch for GPU work); no Snakemake, submitit or MLflow.
# Copies summary, report and the records to $OUT when it is set.
set -u
dir=${1:?usage: run_specs.sh DIR}
export PYTHONPATH=$(cd "$(dirname "$0")/.." && pwd)/src PYTHONUNBUFFERED=1
cd "$dir"
for spec in results/*/*/*/spec.json; do
  t0=$(date +%s.%N)
  python3 -c "import sys; from hopperlab.run.runner import execute; r = execute(sys.argv[1]); print(r['key'], r['status'], (r['reason'] or '')[:100])" "$PWD/$spec" 2>&1 | tail -n 3
  echo "  $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
done
python3 -m hopperlab.results.report results
if [ -n "${OUT:-}" ]; then
  cp results/summary.csv results/report.html "$OUT"/
  tar czf "$OUT/records.tgz" results/*/*/*/record.json results/*/*/*/hardware.json results/*/*/*/steps.jsonl
fi
