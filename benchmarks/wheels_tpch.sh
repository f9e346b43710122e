#!/usr/bin/env bash
# The carry for TPC-H on a lent GPU machine (issue 36: its references): .whl-tpch = the
# workflow's wheels (.whl-wf) without MLflow's (mlflow, mlflow-skinny, mlflow-tracing,
# databricks-sdk: 20 MB) and torchao, plus DuckDB 1.5.5 and its TPC-H extension for the GPU
# image's Python 3.12 (27 MB; DuckDB 2.0 cannot load the extension offline, FIELD-NOTES.md).
# Both folders together do not fit the 64 MiB carry. Without MLflow the runs stay on disk
# (benchmarks/references_gpu.sh starts no tracking server; `hopperlab sync` uploads them later).
#   bash benchmarks/wheels_tpch.sh            # from the repository root, with .whl-wf there
#   WHEELS=.whl-tpch ... bash benchmarks/references_gpu.sh OUT   (carry .whl-tpch)
set -euo pipefail
SRC=${1:-.whl-wf}; DST=${2:-.whl-tpch}
[ -d "$SRC" ] || { echo "wheels_tpch: no $SRC (the workflow's wheels) here" >&2; exit 2; }
rm -rf "$DST"; mkdir -p "$DST"
for whl in "$SRC"/*.whl; do
  case $(basename "$whl") in mlflow*|databricks_sdk*|torchao*) ;; *) cp "$whl" "$DST"/;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$DST" \
  duckdb==1.5.5 duckdb-extension-tpch==1.5.5
du -sh "$DST"
