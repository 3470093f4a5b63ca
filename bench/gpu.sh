#!/usr/bin/env bash
# This engine vs TRL's GRPOTrainer on a CUDA GPU, full training and LoRA (rank 16), on the same
# GPU one run at a time: by default a 1.54B random-init Qwen2-shaped model (Qwen2.5-1.5B's shape,
# written in bf16: bench/qwen2_model.py), bf16 autocast, the digit task, 2 prompts x 8, 32 new
# tokens, beta 0.04, lr 1e-3, token_mean / "dapo"; TRL generates with vLLM when it imports.
# Prints per mode: seconds per step, completion tokens/s, peak GPU memory (torch's
# max_memory_allocated), RSS, and ours/TRL. SIZE=0.5b: the earlier Llama-shaped 0.46B model.
#
#   bash bench/gpu.sh                     # from the repository root
#   MODES=lora STEPS=8 REPS=1 bash bench/gpu.sh    # one mode, shorter
#   SIZE=3m DEVICE=cpu STEPS=2 bash bench/gpu.sh   # a dry run of this script on a CPU
#   SIZE=qwen2-3m DEVICE=cpu STEPS=2 bash bench/gpu.sh   # ... through the Qwen2 builder
#
# No network on the GPU machine: packages it lacks come as wheels in $WHEELS (default .whl/),
# installed with `pip install --no-index --find-links`. Nothing is fetched from the internet.
# Figures go to stdout and to $OUT/gpu_bench.json when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SIZE=${SIZE:-1.5b}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-10}
REPS=${REPS:-1}
MODES=${MODES:-full lora}
LORA_R=${LORA_R:-16}
TIMEOUT=${TIMEOUT:-270}   # seconds per mode
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if [ -d "$WHEELS" ]; then
  echo "== installing from $WHEELS (no index): pydantic, trl, datasets"
  $PY -m pip install -q --no-index --find-links "$WHEELS" pydantic trl datasets 2>&1 | tail -5 \
    || echo "!! pip could not install everything from $WHEELS (see above)"
fi

echo "== environment"
$PY - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "accelerate", "pydantic", "safetensors", "tokenizers",
             "peft", "trl", "datasets", "pyarrow", "vllm"):
    try:
        print(f"  {name:13} {importlib.import_module(name).__version__}")
    except Exception as exc:  # noqa: BLE001
        print(f"  {name:13} MISSING ({type(exc).__name__}: {str(exc)[:80]})")
import torch
print("  cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

need_ok=$($PY -c "import torch, transformers, pydantic, safetensors; print('ok')" 2>/dev/null)
if [ "$need_ok" != "ok" ]; then
  echo "!! this engine needs torch, transformers, pydantic, safetensors: carry the missing wheels"
  exit 1
fi
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "!! no CUDA device visible"; exit 1
fi
if ! $PY -c "import trl, datasets" 2>/dev/null; then
  echo "!! TRL or datasets missing: carry trl, datasets, dill, multiprocess wheels (and pyarrow"
  echo "   >= 24 if the machine's is older); running this engine alone for its figures"
  ONLY=ours
fi
extra=()
[ "$DEVICE" = cuda ] && extra+=(--bf16)
if $PY -c "import vllm" 2>/dev/null; then extra+=(--vllm); else echo "   (vLLM not installed: TRL generates with transformers)"; fi
[ -n "${ONLY:-}" ] && extra+=(--only "$ONLY")

rc=0
for mode in $MODES; do
  args=("${extra[@]}")
  [ "$mode" = lora ] && args+=(--lora "$LORA_R")
  [ -n "${OUT:-}" ] && args+=(--json "$OUT/gpu_bench_$mode.json")
  echo "== benchmark ($mode training): $SIZE on $DEVICE, $STEPS steps x $REPS repetitions, alternating"
  timeout "$TIMEOUT" $PY bench/vs_trl.py --sizes "$SIZE" --device "$DEVICE" --steps "$STEPS" \
    --reps "$REPS" "${args[@]}"
  code=$?
  [ $code -eq 124 ] && echo "!! $mode timed out after $TIMEOUT s: rerun with STEPS=5 or MODES=$mode"
  [ $code -ne 0 ] && rc=$code
done
exit $rc
