#!/usr/bin/env bash
# The aarch64 trial: the README's first command, for real, on an arm64 Debian 12 under qemu-user.
#
# Why: the README says its commands work on a GH200's Grace; a pip resolution of the wheel set
# (tests/platform/test_aarch64_install.py) does not show that the code runs there. This script
# builds an arm64 Debian 12 root once (mmdebstrap through Debian's mirror), installs Python,
# PyPI's aarch64 CPU torch and this checkout in it, and runs `snakemake --cores 2` on one run of
# every family. Emulated: no time it prints is a figure of Grace. Not in CI's default path (the
# root alone is minutes; each run is 5-20x slower than native). Results: docs/gh200.md.
#
# Usage (as root, on an x86 Debian 12 machine that reaches Debian's mirror and PyPI):
#   bash scripts/aarch64_trial.sh
# Environment:
#   AARCH64_ROOT=/var/tmp/hopperlab-arm64   where the root lives (kept between runs; never committed)
#   AARCH64_TORCH=torch==2.10.0             PyPI's last aarch64 CPU build (2.11+ are CUDA 13) that
#                                           torchao 0.18 imports with (2.9.1 lacks ScalingType)
#   AARCH64_RUNS="KEY ..."                  the runs (default: one per family, below)
#   AARCH64_RESULTS=results-aarch64         the results folder inside the root's copy
#   AARCH64_FRESH=1                         drop the results and assets of an earlier trial first
#   AARCH64_TIME_MIN=30                     each run's time limit in the root's copy (emulation is slow)
set -euo pipefail

ROOT=${AARCH64_ROOT:-/var/tmp/hopperlab-arm64}
TORCH=${AARCH64_TORCH:-torch==2.10.0}
RESULTS=${AARCH64_RESULTS:-results-aarch64}
# one run per family: the cheapest that runs (or says why it cannot) on a CPU-only node
RUNS=${AARCH64_RUNS:-membench/alloc/host finetune/lora-llama2-7b/baseline inference/kv-cache/resident recommender/latency/cpu-only database/tpch/device selftest/trivial/ok}
MIRROR=${AARCH64_MIRROR:-http://deb.debian.org/debian}
PROJECT=$(cd "$(dirname "$0")/.." && pwd)
DEST=/opt/hopperlab

say() { printf '[aarch64 %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

[ "$(id -u)" = 0 ] || { echo "aarch64_trial.sh: needs root (mmdebstrap, binfmt_misc, chroot)" >&2; exit 2; }

# 1. qemu-user through binfmt_misc: arm64 binaries run as if native (flag F: works in a chroot)
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  command -v update-binfmts >/dev/null && [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-user-static binfmt-support
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64
fi
# arch-test: mmdebstrap checks with it that the foreign architecture runs
command -v mmdebstrap >/dev/null && command -v arch-test >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y mmdebstrap arch-test

# 2. the root, once: Debian 12's Python 3.11 and a compiler (the managed allocator's extension)
if [ ! -e "$ROOT/.hopperlab-root" ]; then
  say "building the arm64 Debian 12 root in $ROOT"
  rm -rf "$ROOT.part"
  mmdebstrap --arch=arm64 --variant=apt \
    --include=python3,python3-venv,python3-dev,g++,git,ca-certificates,procps \
    bookworm "$ROOT.part" "$MIRROR"
  rm -rf "$ROOT" && mv "$ROOT.part" "$ROOT" && touch "$ROOT/.hopperlab-root"
fi

# 3. this checkout (tracked and untracked-not-ignored files), its results and assets kept
mkdir -p "$ROOT$DEST"
[ "${AARCH64_FRESH:-0}" = 1 ] && rm -rf "$ROOT$DEST/$RESULTS" "$ROOT$DEST/assets"
(cd "$PROJECT" && git ls-files -co --exclude-standard) |
  rsync -a --delete-missing-args --files-from=- "$PROJECT/" "$ROOT$DEST/"

mounted=()
cleanup() { for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[i]}" || true; done; }
trap cleanup EXIT
for m in proc sys dev dev/shm; do
  mkdir -p "$ROOT/$m"
  case $m in proc) mount -t proc proc "$ROOT/proc" ;; *) mount --bind "/$m" "$ROOT/$m" ;; esac
  mounted+=("$ROOT/$m")
done
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# the root trusts what this machine trusts: a site whose HTTPS goes through a proxy with its own
# CA has it in the host's bundle, not in the root's fresh Debian one
cp "${AARCH64_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$ROOT/etc/ssl/certs/host-bundle.crt"

# the root sees none of this machine's pip settings (x86 wheel folders, constraints)
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/host-bundle.crt SSL_CERT_FILE=/etc/ssl/certs/host-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/host-bundle.crt "$@"
}

# 4. Python, torch (PyPI's aarch64 CPU wheel) and the project, in a venv of the root
say "$(in_root uname -m), $(in_root python3 --version)"
[ -x "$ROOT/opt/venv/bin/python" ] || in_root python3 -m venv /opt/venv
in_root pip install -q "$TORCH"
in_root pip install -q -e "$DEST"
in_root python -c 'import torch, platform; print("torch", torch.__version__, "cuda", torch.version.cuda, platform.machine())'

# emulated runs are 20-100x slower (a LoRA smoke step 85 s instead of about 0.05 s): the copy's
# time limits, never the checkout's, are raised to AARCH64_TIME_MIN so that a run ends ok or
# skipped rather than timeout
in_root python - "$DEST/experiments" "${AARCH64_TIME_MIN:-30}" <<'EOF'
import pathlib, sys, yaml
folder, floor = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def lift(node):
    if isinstance(node, dict):
        for k, v in node.items():
            node[k] = max(v, floor) if k == "time_min" and isinstance(v, int) else lift(v)
    elif isinstance(node, list):
        node[:] = [lift(v) for v in node]
    return node
for path in sorted(folder.glob("*.yaml")):
    path.write_text(yaml.safe_dump(lift(yaml.safe_load(path.read_text())), sort_keys=False))
EOF

# 5. the README's first command, on one run of each family
only="only=[$(echo $RUNS | tr ' ' ',')]"
# selftest is not in the default matrix: named here so that every family runs once
FAMILIES="families=[membench,finetune,inference,recommender,database,selftest]"
say "snakemake --cores 2 --config results_dir=$RESULTS $FAMILIES $only"
start=$(date +%s)
set +e
in_root bash -c "cd $DEST && snakemake --cores 2 --config results_dir=$RESULTS '$FAMILIES' '$only'"
rc=$?
set -e
say "snakemake exit $rc after $(( $(date +%s) - start )) s (emulated)"

# 6. what each run recorded: status and reason
for key in $RUNS; do
  in_root python - "$DEST/$RESULTS/$key/metrics.json" "$key" <<'EOF'
import json, sys
path, key = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(path))
except OSError:
    print(f"{key}: no metrics.json")
    sys.exit(0)
print(f"{key}: {m.get('status')}" + (f" ({m['reason']})" if m.get("reason") else ""))
EOF
done
exit $rc
