#!/usr/bin/env bash
# Re-record the sample traces with `whatif record` (CPU, seeded workloads; a few seconds each).
# Usage: sample_traces/regenerate.sh   (from anywhere; uses .venv/bin/python of this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

"$PY" -m whatif.cli record -f -o sample_traces/llm_serve --no-summary \
  examples/llm_serve.py -- --device cpu --seed 0 --num-requests 8 --rate 20 --output-max 48 \
  --log sample_traces/llm_serve/serving.log

"$PY" -m whatif.cli record -f -o sample_traces/dit_serve --no-summary \
  examples/dit_serve.py -- --device cpu --seed 0 --num-requests 4 --steps 6 --rate inf \
  --log sample_traces/dit_serve/serving.log

for backend in math flash; do
  "$PY" -m whatif.cli record -f -o sample_traces/sdpa_memory/$backend --no-summary --memory --record-shapes \
    examples/train.py -- --device cpu --steps 4 --batch-size 4 --seq-len 512 --d-model 256 --heads 4 --layers 2 \
    --autocast bf16 --sdpa $backend
done

"$PY" -m whatif.cli record -f -o sample_traces/sdpa_memory/math_batch2 --no-summary --memory --record-shapes \
  examples/train.py -- --device cpu --steps 4 --batch-size 2 --seq-len 512 --d-model 256 --heads 4 --layers 2 \
  --autocast bf16 --sdpa math

TP_ARGS="--device cpu --steps 3 --batch-size 4 --seq-len 256 --d-model 256 --heads 8 --layers 2 --sdpa math"
"$PY" -m whatif.cli record -f -o sample_traces/tp_memory/tp1 --no-summary --memory --record-shapes \
  examples/train.py -- $TP_ARGS
"$PY" -m whatif.cli record -f -o sample_traces/tp_memory/tp1_bf16 --no-summary --memory --record-shapes \
  examples/train.py -- $TP_ARGS --autocast bf16
"$PY" -m whatif.cli record -f -o sample_traces/tp_memory/tp1_bf16_model --no-summary --memory --record-shapes \
  examples/train.py -- $TP_ARGS --dtype bfloat16
"$PY" -m torch.distributed.run --nproc-per-node 2 -m whatif.cli record -f -o sample_traces/tp_memory/tp2 --no-summary \
  --memory --record-shapes examples/train.py -- $TP_ARGS --tp 2
"$PY" -m torch.distributed.run --nproc-per-node 2 -m whatif.cli record -f -o sample_traces/tp_memory/pp2 --no-summary \
  --memory --record-shapes examples/train.py -- $TP_ARGS --pp 2 --micro-batches 2

SP_ARGS="--device cpu --seed 0 --rate inf --warmup 1 --num-requests 2 --batch 2 --steps 2 --resolution 32 --sdpa math"
"$PY" -m whatif.cli record -f -o sample_traces/sp_memory/sp1 --no-summary --memory --record-shapes \
  examples/dit_serve.py -- $SP_ARGS
"$PY" -m torch.distributed.run --nproc-per-node 2 -m whatif.cli record -f -o sample_traces/sp_memory/sp2 --no-summary \
  --memory --record-shapes examples/dit_serve.py -- $SP_ARGS --sp 2
"$PY" -m torch.distributed.run --nproc-per-node 2 -m whatif.cli record -f -o sample_traces/sp_memory/ring2 --no-summary \
  --memory --record-shapes examples/dit_serve.py -- $SP_ARGS --sp 2 --ring 2

du -sh sample_traces/llm_serve sample_traces/dit_serve sample_traces/sdpa_memory sample_traces/tp_memory \
  sample_traces/sp_memory
