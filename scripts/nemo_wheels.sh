#!/usr/bin/env bash
# The wheels of requirements-nemo.txt for the lent GPU machine (Python 3.12, manylinux x86_64),
# without dependencies (the image has torch, numpy and packaging), into DEST (.whl-nemo), for
# benchmarks/nemo_gpu.sh; prints their sizes (the device's carry is 64 MiB with the tree).
#   bash scripts/nemo_wheels.sh [DEST]
set -euo pipefail
DEST=${1:-.whl-nemo}
mkdir -p "$DEST"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  -r requirements-nemo.txt -d "$DEST"
du -b "$DEST"/*.whl | awk '{printf "%8.1f MB  %s\n", $1 / 1e6, $2; s += $1} END {printf "%8.1f MB  total\n", s / 1e6}'
