#!/usr/bin/env bash
# Cross-check `qwen27b bench` against `vllm bench serve` on one endpoint, back to back, at the
# seed's shape (prompt 512, output 256) and concurrency 1 and 4. Prints both tools' summaries.
#
#   benchmarks/crosscheck_vllm_bench.sh URL TOKENIZER_DIR [SERVED_NAME]
#
# VLLM (default ~/.cache/qwen27b/check/venv/bin/vllm, the CPU smoke venv) runs `vllm bench serve`;
# OUT (default reports/bench/crosscheck-<UTC time>) receives both tools' results.
# Each vllm run gets its own --seed and no warm-up: its warm-up re-sends the dataset's first
# prompt, which the first timed request then finds in the prefix cache (docs/bench.md).
set -euo pipefail
if [ "$#" -lt 2 ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
fi
URL="$1" TOK="$2" NAME="${3:-smollm2-135m}"
cd "$(dirname "$0")/.."
VLLM="${VLLM:-$HOME/.cache/qwen27b/check/venv/bin/vllm}"
OUT="${OUT:-reports/bench/crosscheck-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ours() {  # concurrency requests tag
    python3 -m qwen27b.tools.cli bench --url "$URL" --model "$NAME" --prompt-tokens 512 --output-tokens 256 \
        --concurrency "$1" --requests-per-level "$2" --warmup 0 --out "$OUT/qwen27b-$3"
}
theirs() {  # concurrency requests seed tag
    "$VLLM" bench serve --backend openai-chat --base-url "$URL" --endpoint /v1/chat/completions \
        --model "$NAME" --tokenizer "$TOK" --dataset-name random --random-input-len 512 \
        --random-output-len 256 --ignore-eos --max-concurrency "$1" --num-prompts "$2" --seed "$3" \
        --num-warmups 0 --save-result --save-detailed --result-dir "$OUT" --result-filename "vllm-$4.json" \
        2>&1 | sed -n '/Serving Benchmark Result/,/^=====*$/p'
}
python3 -m qwen27b.tools.cli bench --url "$URL" --model "$NAME" --prompt-tokens 64 --output-tokens 16 \
    --concurrency 1 --requests-per-level 1 --warmup 1 --out "$OUT/warm" >/dev/null  # one warm-up for both
theirs 1 2 21 c1-a; ours 1 2 c1-a
theirs 1 2 22 c1-b; ours 1 2 c1-b
theirs 4 8 23 c4;   ours 4 8 c4
echo "results in $OUT"
