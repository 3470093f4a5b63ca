#!/usr/bin/env bash
# The engine on one CUDA GPU in at most 8 minutes (issue 33), for a 0.5B and a 1.5B random-init
# Qwen2-shaped model (Qwen2.5-0.5B's and -1.5B's shapes, written in bf16: bench/qwen2_model.py):
#  1. decode tokens/s of each engine's sampler (reference, fast, fast-eager) at 64 rows x 128
#     tokens, beside the memory-bandwidth bound of the card (bench/decode_engines.py);
#  2. seconds per GRPO step, synchronous (grpo.max_off_policy_steps 0) and one step off-policy
#     (1), engine auto (fast, its decode a CUDA graph), bf16 autocast, 8 prompts x 8, 64 new
#     tokens, full training, beside TRL's GRPOTrainer on the same settings, generating with transformers (no
#     vLLM unless VLLM=1) (bench/vs_trl.py).
# Each part runs under its own timeout, so a slow one costs its share only.
#
#   bash bench/gpu.sh                                   # from the repository root
#   SIZES=1.5b STEPS=3 bash bench/gpu.sh                # one size, shorter
#   SIZES=qwen2-3m DEVICE=cpu STEPS=2 BATCH=16 NEW=8 STEP_PROMPTS=2 STEP_TOKENS=8 \
#     T_DECODE=300 T_STEPS=600 bash bench/gpu.sh         # a dry run of this script on a CPU
#
# No network on the GPU machine: packages it lacks come as wheels in $WHEELS (default .whl/,
# made by bench/gpu_wheels.sh), installed beside the image's. Nothing is fetched.
# Figures go to stdout and, when $OUT is set, to $OUT/decode_<size>.json, $OUT/steps_<size>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SIZES=${SIZES:-qwen2-0.5b 1.5b}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-64}              # decode rows
NEW=${NEW:-128}                 # decode tokens per row
STEPS=${STEPS:-4}               # GRPO steps per run (the first includes warm-up)
STEP_PROMPTS=${STEP_PROMPTS:-8} # prompts per step (x 8 completions)
STEP_TOKENS=${STEP_TOKENS:-64}  # max_new_tokens of a step
ENGINE=${ENGINE:-auto}
T_DECODE=${T_DECODE:-100}       # seconds for part 1, per size
T_STEPS=${T_STEPS:-130}         # seconds for part 2, per size
# USE_HUB_KERNELS=0: transformers >= 5.2x loads Hub kernels by default, which needs the network
export HF_HUB_OFFLINE=1 USE_HUB_KERNELS=0 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SITE=${SITE:-/tmp/gpu-site}    # where the carried wheels are installed
# decode engines of part 1; fast-graph: fast without its compiled layers; fast-eager: fast without
# its CUDA graphs; paged-graphs: paged with
# transformers' CUDA graphs
ENGINES=${ENGINES:-reference,fast,fast-graph,fast-eager,paged}

if [ -d "$WHEELS" ]; then
  # beside the image's packages, not over them: every wheel as made by bench/gpu_wheels.sh
  echo "== installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE (no index)"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl 2>&1 | tail -5
  export PYTHONPATH=$PYTHONPATH:$SITE
fi

echo "== environment"
$PY - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "accelerate", "pydantic", "safetensors", "tokenizers",
             "peft", "trl", "datasets", "flash_attn", "kernels", "vllm"):
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
extra=(--engine "$ENGINE" --prompts "$STEP_PROMPTS" --new-tokens "$STEP_TOKENS")
[ "$DEVICE" = cuda ] && extra+=(--bf16)
[ "${VLLM:-0}" = 1 ] && extra+=(--vllm)
[ -n "${LORA:-}" ] && extra+=(--lora "$LORA")
if ! $PY -c "import trl, datasets" 2>/dev/null; then
  echo "!! TRL or datasets missing: carry trl, datasets, dill, multiprocess wheels; this engine alone"
  extra+=(--only ours)
fi
# K = 1 where this engine has grpo.max_off_policy_steps (issue 33, item 2)
if $PY -c "from workers.grpo.config import GRPOParams as G; assert 'max_off_policy_steps' in G.model_fields" 2>/dev/null; then
  lags=0,1
else
  lags=0; echo "   (no grpo.max_off_policy_steps in this engine: synchronous steps only)"
fi

rc=0
for size in $SIZES; do
  json=(); [ -n "${OUT:-}" ] && json=(--json "$OUT/decode_$size.json")
  echo "== 1. decode: $size on $DEVICE"
  timeout "$T_DECODE" $PY bench/decode_engines.py --size "$size" --device "$DEVICE" \
    --batch "$BATCH" --new-tokens "$NEW" --engines "$ENGINES" "${json[@]}"
  code=$?; [ $code -eq 124 ] && echo "!! decode of $size timed out after $T_DECODE s"
  [ $code -ne 0 ] && rc=$code

  json=(); [ -n "${OUT:-}" ] && json=(--json "$OUT/steps_$size.json")
  echo "== 2. GRPO steps: $size on $DEVICE, $STEPS steps, K in {$lags} vs TRL"
  timeout "$T_STEPS" $PY bench/vs_trl.py --sizes "$size" --device "$DEVICE" --steps "$STEPS" \
    --reps 1 --off-policy "$lags" "${extra[@]}" "${json[@]}"
  code=$?; [ $code -eq 124 ] && echo "!! steps of $size timed out after $T_STEPS s: STEPS=3?"
  [ $code -ne 0 ] && rc=$code
done
exit $rc
