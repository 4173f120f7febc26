#!/usr/bin/env bash
# tokamak bench --background (mixed load) end to end on a tiny synthetic model:
# the background streams are measured inside the foreground window, the JSON
# summaries agree with their own raw gaps (numpy), the stream TPOTs are the
# means of their gaps, every stream was cancelled (none ran out), --no-chunking
# reaches the engine, and bad options exit 2.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_PYTHON:=/usr/bin/python3}"
dir="$TK_TMP/e2e_bench_mixed.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

model="$TK_TMP/bench_mixed_tiny_f32.gguf"
if [ ! -s "$model" ]; then
  "$TK_CLI" synth --preset tiny --dtype f32 -o "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

for bad in "--background -1" "--background x" "--bg-out 1" "--bg-in 0" "--background 2 --ablation"; do
  set +e
  # shellcheck disable=SC2086
  "$TK_CLI" bench -m "$model" $bad >"$dir/out" 2>"$dir/err"
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "bench $bad exited $rc, want 2"
  [ -s "$dir/err" ] || fail "bench $bad printed no message"
done

# Chunked (a small step budget so a prompt takes several steps) and whole-prompt prefill.
"$TK_CLI" bench -m "$model" --background 3 --bg-in 8 --bg-out 400 --rate 20 --requests 3 --in 96 --out 4 \
  --step-tokens 32 --warmup 0 --threads 1 -q --json "$dir/c.json" --csv "$dir/c.csv" >"$dir/c.md"
"$TK_CLI" bench -m "$model" --background 3 --bg-in 8 --bg-out 400 --batch 2 --requests 2 --in 96 --out 4 \
  --no-chunking --warmup 0 --threads 1 -q --json "$dir/n.json" >"$dir/n.md"
for f in c n; do
  grep -q "Background decode: 3 streams" "$dir/$f.md" || fail "$f: no background table"
  grep -q "mixed load: --background 3" "$dir/$f.md" || fail "$f: no mixed-load options line"
done
grep -q "bg_itl_p99_ms" "$dir/c.csv" || fail "csv has no background columns"

"$TK_PYTHON" - "$dir/c.json" "$dir/n.json" <<'PY'
import json, math, sys
import numpy as np
close = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
for path, no_chunking in ((sys.argv[1], False), (sys.argv[2], True)):
    r = json.load(open(path))
    assert r["options"]["background"] == 3 and r["options"]["bg_in"] == 8 and r["options"]["bg_out"] == 400
    assert r["options"]["ctx"] >= 8 + 400 + 1, r["options"]["ctx"]
    (s,) = r["series"]
    assert s["engine"]["no_chunking"] == no_chunking, s["engine"]
    assert s["engine"]["max_batch"] >= 3 + 2
    for p in s["points"]:
        assert p["median"]["bg_itl_p99_ms"] is not None
        for run in p["runs"]:
            b = run["background"]
            m = run["metrics"]
            assert b["n_streams"] == 3 and b["n_prompt"] == 8
            assert not b["exhausted"], "a stream ran out inside the window"
            assert b["window_start_s"] == 0 and close(b["window_end_s"], run["duration_s"])
            gaps, tpots = [], []
            for st in b["streams"]:
                assert st["finish"] == "cancelled", st["finish"]
                assert st["n_window"] > 0 and st["n_window"] == len(st["itl_s"])
                assert st["n_output"] > st["n_window"]  # the first token came before the window
                assert all(g > 0 for g in st["itl_s"])
                assert close(st["tpot_s"], np.mean(st["itl_s"]))
                gaps += st["itl_s"]; tpots.append(st["tpot_s"])
            itl, tp = b["itl_s"], b["tpot_s"]
            assert itl["n"] == len(gaps) > 0 and tp["n"] == 3
            assert 0 < itl["p50"] <= itl["p95"] <= itl["p99"] <= itl["max"]
            assert 0 < tp["p50"] <= tp["p99"] <= tp["max"]
            assert close(itl["p99"], np.percentile(gaps, 99)) and close(itl["max"], max(gaps))
            assert close(tp["p50"], np.percentile(tpots, 50)) and close(tp["p99"], np.percentile(tpots, 99))
            assert close(m["bg_itl_p50_ms"], 1e3 * itl["p50"]) and close(m["bg_itl_max_ms"], 1e3 * itl["max"])
            assert close(m["bg_itl_p99_over_p50"], itl["p99"] / itl["p50"])
            assert close(m["bg_tpot_p99_over_p50"], tp["p99"] / tp["p50"])
            # The foreground is measured as before.
            for q in run["requests"]:
                assert q["n_output"] == 4 and q["finish"] == "length", q
print("mixed json ok")
PY

# Without --background there is no background section and its metrics are null.
"$TK_CLI" bench -m "$model" --in 8 --out 3 --batch 1 --requests 1 --warmup 0 --threads 1 -q --json "$dir/p.json" >"$dir/p.md"
! grep -q "Background decode" "$dir/p.md" || fail "plain run printed a background table"
"$TK_PYTHON" - "$dir/p.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
run = r["series"][0]["points"][0]["runs"][0]
assert "background" not in run and run["metrics"]["bg_itl_p50_ms"] is None
print("plain json ok")
PY
echo "test_bench_mixed: ok"
