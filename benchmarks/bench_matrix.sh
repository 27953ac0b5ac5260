#!/usr/bin/env bash
# The seed's bench matrix (section 4.2) against one endpoint, printing the table:
#   prompt 512 tokens, output 256 tokens, concurrency (batch) 1, 4, 8
# at the max-model-len the endpoint is deployed with. The seed also varies max-model-len
# (4096 and 8192): that is a redeploy (host data qwen27b_serve_flags = {"--max-model-len": N}),
# so run this once per deployment and compare the two result files with --ab:
#
#   benchmarks/bench_matrix.sh http://gpu-a:8000 --gpu v100-sxm2-32gb --tp 4 --api-key-file key.env
#   # redeploy with {"--max-model-len": 8192}, then:
#   benchmarks/bench_matrix.sh http://gpu-a:8000 --gpu v100-sxm2-32gb --tp 4 --api-key-file key.env \
#       --ab reports/bench/matrix-<first run>/bench.json
#
# Extra arguments go to `qwen27b bench` (later ones win: --concurrency 1,2 overrides the matrix).
# Environment: OUT (result dir, default reports/bench/matrix-<UTC time>), PYTHON (default python3),
# REQUESTS (requests per level, default 2 x concurrency), WARMUP (default 2).
set -euo pipefail
if [ "$#" -lt 1 ] || [ "${1#http}" = "$1" ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
fi
URL="$1"
shift
cd "$(dirname "$0")/.."
OUT="${OUT:-reports/bench/matrix-$(date -u +%Y%m%dT%H%M%SZ)}"
ARGS=(--url "$URL" --prompt-tokens 512 --output-tokens 256 --concurrency 1,4,8
      --warmup "${WARMUP:-2}" --out "$OUT")
[ -n "${REQUESTS:-}" ] && ARGS+=(--requests-per-level "$REQUESTS")
exec "${PYTHON:-python3}" -m qwen27b.tools.cli bench "${ARGS[@]}" "$@"
