#!/usr/bin/env bash
# The wheels the lent GPU machines' image lacks (Python 3.12, manylinux x86_64), for the
# benchmarks' calls to carry (`.whl-wf`, ~42 MB): snakemake, submitit, mlflow, torchao,
# jsonschema, spython and what they need, minus every package the image already holds
# (/work/.library/device/KINDS.md lists them) and minus pulp (snakemake's optional ILP
# scheduler: the benchmarks pass --scheduler greedy). Pins: this machine's installed versions,
# so the GPU run uses what the tests ran with. Run from the repository root:
#   bash scripts/gpu_wheels.sh [.whl-wf]
set -euo pipefail
DEST=${1:-.whl-wf}
pins=()
for p in snakemake submitit mlflow torchao jsonschema spython; do
  v=$(python3 -m pip show "$p" 2>/dev/null | sed -n 's/^Version: //p')
  pins+=("$p${v:+==$v}")
done
# in the GPU image already (KINDS.md, 'Python packages already there'); never carried
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
certifi charset-normalizer click cloudpickle colorama contourpy cuda-bindings cuda-core
cuda-pathfinder cycler filelock fonttools frozenlist fsspec grpcio h11 httpcore httpx
huggingface-hub idna jinja2 joblib kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl
msgpack multidict networkx numpy packaging pandas pathspec pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pygments pyparsing python-dateutil pyyaml
regex requests rich safetensors scikit-learn scipy setuptools six sympy tabulate tokenizers torch
tqdm transformers triton typing-extensions urllib3 werkzeug wheel wrapt xxhash yarl zipp
typing-inspect mypy-extensions tensorboard peft sentencepiece"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# connection_pool (a snakemake need) is an sdist only: build it into a wheel first
python3 -m pip wheel -q --no-deps -w "$tmp/local" connection_pool
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --find-links "$tmp/local" -d "$tmp/all" "${pins[@]}"
mkdir -p "$DEST"
for w in "$tmp"/all/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr '_A-Z' '-a-z')
  case " $(echo $IMAGE) pulp " in *" $name "*) continue ;; esac
  cp "$w" "$DEST/"
done
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
du -sh "$DEST"; ls "$DEST" | wc -l
