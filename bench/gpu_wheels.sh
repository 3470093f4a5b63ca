#!/usr/bin/env bash
# The wheels bench/gpu.sh needs on a GPU machine with no network, downloaded here into .whl/
# (cp312, manylinux x86-64), at the versions this checkout's .venv runs, so both machines run
# the same libraries. The device image of 2026-12 has torch, numpy, pandas, pyarrow and the
# CUDA stack; it lacks or holds other versions of these. Run from the repository root:
#
#   bash bench/gpu_wheels.sh && echo /.whl/ >> .git/info/exclude   # then carry .whl
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${WHEELS:-.whl}
PACKAGES=(transformers huggingface_hub hf-xet httpx2 httpcore2 truststore anyio h11 idna
  click tomlkit kernels tokenizers regex safetensors accelerate peft trl datasets dill
  multiprocess fsspec pydantic pydantic_core annotated-types typing-inspection
  typing_extensions google-re2 jsonschema jsonschema-specifications referencing rpds-py)
mkdir -p "$DEST"
for name in "${PACKAGES[@]}"; do
  version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST" \
    "$name==$version" 2>&1 | grep -v '^WARNING' || true
done
du -sh "$DEST"
