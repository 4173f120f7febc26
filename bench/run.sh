#!/usr/bin/env bash
# `make bench`: a short `tokamak bench` on the default synthetic model.
#   bench/run.sh TOKAMAK_BINARY MODEL
# Prints the markdown report; writes JSON, CSV and a PNG next to the build
# (BENCH_OUT, default <build>/bench). Sized to finish well within 5 minutes on
# 2 cores with qwen3-0.6b Q8_0 (about 1.5 minutes when the machine is quiet):
# 64-token prompts, 64 output tokens, one request per slot (--requests 1x) at
# concurrency 1, 4 and 8. Extra arguments go to bench
# (e.g. bench/run.sh build/bin/tokamak models/x.gguf --repeat 3).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TOKAMAK_BINARY MODEL [bench options]" >&2
  exit 2
fi
bin=$1
model=$2
shift 2
out=${BENCH_OUT:-$(cd "$(dirname "$bin")/.." && pwd)/bench}
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
"$bin" bench -m "$model" --in 64 --out 64 --batch 1,4,8 --requests 1x --warmup 1 --repeat 1 \
  --json "$out/bench-$stamp.json" --csv "$out/bench-$stamp.csv" --plot "$out/bench-$stamp.png" "$@"
echo
echo "bench: raw samples in $out/bench-$stamp.json, plot $out/bench-$stamp.png"
