#!/usr/bin/env bash
# tokamak over HTTP against tokamak in-process, on one machine, in one run:
#   bench/http.sh TOKAMAK_BINARY MODEL [overhead|mixed|all]
# overhead: `tokamak bench` and `tokamak loadgen` against `tokamak serve`, the same
#   engine options, at concurrency 1, 8 and 32 (64 in / 64 out, one request a slot), alternated
#   REPS times (default 3) so that a drifting machine moves both alike; prints
#   per level the medians and the loadgen/bench ratios of TPOT, TTFT and throughput.
# mixed: 16 decoding streams while three 2,048-token prompts arrive (Poisson,
#   0.05/s), `bench --background 16` and then loadgen against serve with the
#   same load; prints the background ITL P50/P99, the longest stall and the
#   decode throughput of both.
# Reports (markdown and JSON) go to BENCH_OUT (default <build>/bench/http-<stamp>).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TOKAMAK_BINARY MODEL [overhead|mixed|all]" >&2
  exit 2
fi
bin=$1
model=$2
what=${3:-all}
reps=${REPS:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_OUT:-$(cd "$(dirname "$bin")/.." && pwd)/bench/http-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
py=${TK_PYTHON:-/usr/bin/python3}
srv_pid=""
trap '[ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; true' EXIT

# serve LOG ENGINE-OPTIONS...: start a server on a free port; sets $url and $srv_pid.
serve() {
  local log=$1
  shift
  "$bin" serve -m "$model" --port 0 -q "$@" >"$log" 2>&1 &
  srv_pid=$!
  url=""
  for _ in $(seq 600); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -n 1)
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
      url="http://127.0.0.1:$port"
      return 0
    fi
    sleep 0.2
  done
  echo "http.sh: the server did not come up:" >&2
  cat "$log" >&2
  exit 1
}

stop() {
  kill "$srv_pid"
  wait "$srv_pid" || true
  srv_pid=""
}

if [ "$what" = overhead ] || [ "$what" = all ]; then
  eng=(--threads 2 --ctx 256 --max-batch 32)
  load=(--concurrency 1,8,32 --in 64 --out 64 --requests 1x --warmup 1 -q)
  serve "$out/serve-overhead.log" "${eng[@]}"
  for r in $(seq "$reps"); do
    "$bin" bench -m "$model" "${eng[@]}" "${load[@]}" --seed "$r" --json "$out/bench-$r.json" >"$out/bench-$r.md"
    "$bin" loadgen --url "$url" "${load[@]}" --seed "$r" --json "$out/loadgen-$r.json" >"$out/loadgen-$r.md"
    echo "http.sh: overhead repeat $r/$reps done" >&2
  done
  stop
  "$py" - "$out" "$reps" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def points(path):
    r = json.load(open(path))
    return {p["concurrency"]: p["median"] for p in r["series"][0]["points"]}
b = [points("%s/bench-%d.json" % (out, i)) for i in range(1, reps + 1)]
l = [points("%s/loadgen-%d.json" % (out, i)) for i in range(1, reps + 1)]
med = lambda xs: statistics.median(xs)
print("| concurrency | bench TPOT P50 | loadgen TPOT P50 | TPOT ratio | bench TTFT P50 | loadgen TTFT P50 | "
      "TTFT ratio | bench out tok/s | loadgen out tok/s | throughput ratio | loadgen errors |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in sorted(b[0]):
    tb = [x[c]["tpot_p50_ms"] for x in b]; tl = [x[c]["tpot_p50_ms"] for x in l]
    fb = [x[c]["ttft_p50_ms"] for x in b]; fl = [x[c]["ttft_p50_ms"] for x in l]
    ob = [x[c]["output_tok_s"] for x in b]; ol = [x[c]["output_tok_s"] for x in l]
    ratio = lambda xl, xb: med([a / z for a, z in zip(xl, xb)])
    print("| %d | %.2f | %.2f | **%.3f** | %.1f | %.1f | %.2f | %.1f | %.1f | %.3f | %d |" % (
        c, med(tb), med(tl), ratio(tl, tb), med(fb), med(fl), ratio(fl, fb), med(ob), med(ol), ratio(ol, ob),
        sum(x[c]["errors"] for x in l)))
print("\nMedians over %d alternated repeats; ratios are medians of the per-repeat loadgen/bench ratios." % reps)
PY
fi

if [ "$what" = mixed ] || [ "$what" = all ]; then
  eng=(--threads 2 --ctx 4225 --max-batch 32 --kv-mem 4000)
  load=(--background 16 --bg-in 128 --bg-out 4096 --rate 0.05 --requests 3 --in 2048 --out 8 --warmup 0 -q)
  "$bin" bench -m "$model" "${eng[@]}" "${load[@]}" --json "$out/mixed-bench.json" >"$out/mixed-bench.md"
  serve "$out/serve-mixed.log" "${eng[@]}"
  "$bin" loadgen --url "$url" "${load[@]}" --json "$out/mixed-loadgen.json" >"$out/mixed-loadgen.md"
  stop
  "$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| measured by | bg ITL P50 | bg ITL P99 | longest stall | bg decode tok/s | prompts' TTFT P50 | errors |")
print("|---|---:|---:|---:|---:|---:|---:|")
res = {}
for tool in ("bench", "loadgen"):
    r = json.load(open("%s/mixed-%s.json" % (out, tool)))
    run = r["series"][0]["points"][0]["runs"][0]
    m, b = run["metrics"], run["background"]
    w = b["window_end_s"] - b["window_start_s"]
    # Decode throughput of the streams inside the window: their gaps that ended in it.
    tok_s = sum(s["n_window"] for s in b["streams"]) / w
    res[tool] = m
    print("| %s | %.1f ms | %.1f ms | %.2f s | %.1f | %.1f s | %d |" % (
        "tokamak bench --background 16 (in-process)" if tool == "bench" else "tokamak loadgen -> tokamak serve",
        m["bg_itl_p50_ms"], m["bg_itl_p99_ms"], m["bg_itl_max_ms"] / 1e3, tok_s, m["ttft_p50_ms"] / 1e3, m["errors"]))
print("\nbg ITL P99 loadgen/bench: **%.2f**; longest stall over HTTP: **%.2f s**" % (
    res["loadgen"]["bg_itl_p99_ms"] / res["bench"]["bg_itl_p99_ms"], res["loadgen"]["bg_itl_max_ms"] / 1e3))
PY
fi
echo "http.sh: reports in $out" >&2
