#!/usr/bin/env bash
# tokamak bench end to end on a tiny synthetic model: the JSON has every field,
# its numbers agree with its own raw samples (numpy percentiles, E2E = TTFT +
# TPOT x (out - 1), exact output lengths), CSV/PNG exist, usage errors exit 2,
# and every ablation rung runs the engine configuration it names.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_PYTHON:=/usr/bin/python3}"
dir="$TK_TMP/e2e_bench.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

model="$TK_TMP/bench_tiny_bf16.gguf"
if [ ! -s "$model" ]; then
  "$TK_CLI" synth --preset tiny --dtype bf16 -o "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

# Usage errors exit 2 with a message, before any model is loaded.
for bad in "--batch 0" "--batch 1,,2" "--requests 0x" "--in x" "--kv-type fp8" "--rate 1 --batch 2" "--bogus"; do
  set +e
  # shellcheck disable=SC2086
  "$TK_CLI" bench -m "$model" $bad >"$dir/out" 2>"$dir/err"
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "bench $bad exited $rc, want 2"
  [ -s "$dir/err" ] || fail "bench $bad printed no message"
done
set +e
"$TK_CLI" bench -m "$dir/missing.gguf" --in 4 --out 2 --batch 1 --warmup 0 -q >"$dir/out" 2>"$dir/err"
rc=$?
set -e
[ $rc -eq 1 ] || fail "missing model exited $rc, want 1"
grep -q "missing.gguf" "$dir/err" || fail "missing model: message does not name the file"

"$TK_CLI" bench --probe --threads 1 >"$dir/probe.md"
grep -q "read bandwidth" "$dir/probe.md" || fail "--probe prints no bandwidth"

# A plain run: two levels, two repeats, every writer.
"$TK_CLI" bench -m "$model" --in 8 --out 6 --batch 1,3 --requests 3 --repeat 2 --warmup 1 --threads 1 -q \
  --json "$dir/r.json" --csv "$dir/r.csv" --plot "$dir/r.png" >"$dir/r.md"
grep -q "| concurrency | TTFT mean" "$dir/r.md" || fail "no markdown table"
grep -q "| roofline % | x floor |" "$dir/r.md" || fail "no x floor column"
grep -q "^x floor at the probe's median pass ([0-9.]* GB/s, what the machine gave most of the run): concurrency 1: " "$dir/r.md" ||
  fail "no x floor at the median pass"
grep -q "commit " "$dir/r.md" || fail "no commit in the report"
[ "$(wc -l <"$dir/r.csv")" -eq 5 ] || fail "csv: want header + 2 levels x 2 repeats"
command -v gnuplot >/dev/null || fail "gnuplot is not installed (scripts/deps.sh installs gnuplot-nox)"
magic=$(head -c 4 "$dir/r.png" | od -An -c)
grep -q "P   N   G" <<<"$magic" || fail "plot is not a PNG"

"$TK_PYTHON" - "$dir/r.json" <<'PY'
import json, math, sys
import numpy as np
r = json.load(open(sys.argv[1]))
for k in ("git_commit", "date", "machine", "model", "options", "series"):
    assert k in r, k
for k in ("cpu", "features", "isa", "n_cores", "probe"):
    assert k in r["machine"], k
assert r["machine"]["probe"]["read_bw_gbs"] > 0
assert r["machine"]["probe"]["peak_gops_int8"] > 0 and r["machine"]["probe"]["peak_gflops_bf16"] >= 0
assert r["model"]["weight_dtype"] == "bf16"
metrics = ["ttft_mean_ms", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p50_ms",
           "tpot_p95_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "e2e_mean_ms", "e2e_p99_ms",
           "output_tok_s", "total_tok_s", "requests_s", "mean_output_len", "kv_peak_blocks", "kv_peak_mb",
           "decode_read_gb_s", "roofline_pct", "decode_x_floor", "duration_s"]
(s,) = r["series"]
assert s["engine"]["n_threads"] == 1, s["engine"]
# the engine (and its KV pool) sized for the largest level, not the default 32
assert s["engine"]["max_batch"] == 3, s["engine"]
assert [p["concurrency"] for p in s["points"]] == [1, 3]
for p in s["points"]:
    assert len(p["runs"]) == 2
    assert not p["output_length_mismatch"]
    for k in metrics:
        assert k in p["median"] and k in p["min"] and k in p["max"], k
    vals = sorted(run["metrics"]["output_tok_s"] for run in p["runs"])
    assert abs(p["median"]["output_tok_s"] - (vals[0] + vals[1]) / 2) < 1e-6 * vals[1]
    for run in p["runs"]:
        m = run["metrics"]
        for k in metrics:
            assert k in m, k
        reqs = run["requests"]
        assert len(reqs) == 3
        ttft, tpot, e2e, itl = [], [], [], []
        for q in reqs:
            assert q["n_output"] == 6 and q["n_prompt"] == 8, q
            assert q["finish"] == "length", q["finish"]
            assert len(q["itl_s"]) == 5
            assert q["ttft_s"] > 0 and q["tpot_s"] > 0
            assert abs(q["e2e_s"] - (q["ttft_s"] + q["tpot_s"] * 5)) < 1e-9, q
            assert abs(np.mean(q["itl_s"]) - q["tpot_s"]) < 1e-9
            ttft.append(q["ttft_s"]); tpot.append(q["tpot_s"]); e2e.append(q["e2e_s"]); itl += q["itl_s"]
        close = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
        assert close(m["ttft_p50_ms"], 1e3 * np.percentile(ttft, 50))
        assert close(m["ttft_p99_ms"], 1e3 * np.percentile(ttft, 99))
        assert close(m["tpot_mean_ms"], 1e3 * np.mean(tpot))
        assert close(m["tpot_p95_ms"], 1e3 * np.percentile(tpot, 95))
        assert close(m["itl_p99_ms"], 1e3 * np.percentile(itl, 99))
        assert close(m["e2e_p99_ms"], 1e3 * np.percentile(e2e, 99))
        assert m["mean_output_len"] == 6
        assert close(m["output_tok_s"], 18 / m["duration_s"])
        assert close(m["total_tok_s"], (18 + 24) / m["duration_s"])
        assert m["duration_s"] >= max(q["t_last_s"] for q in reqs) - 1e-9
        assert m["kv_peak_blocks"] >= 1
        # The roofline's samples are real decode steps; it is taken over those
        # that decode the whole level (all when none does).
        for st in run["decode_steps"]:
            assert st["bytes"] > 0 and st["time_s"] > 0 and st["running"] >= 1
        assert run["max_decoding"] == max([st["running"] for st in run["decode_steps"]] or [0])
        full = [st for st in run["decode_steps"] if st["running"] >= p["concurrency"]] or run["decode_steps"]
        if full:
            b = sum(st["bytes"] for st in full); t = sum(st["time_s"] for st in full)
            assert close(m["decode_read_gb_s"], b / t / 1e9)
            # capped at 100: a run faster than its probe is the probe's shortfall
            assert close(m["roofline_pct"], min(100.0, 100 * b / t / 1e9 / run["read_bw_gbs"]))
            # each step's floor: at least its bytes at the run's bandwidth; the
            # ratio over the same steps, at least 1 the same way
            for st in full:
                assert st["floor_s"] >= st["bytes"] / run["read_bw_gbs"] / 1e9 * (1 - 1e-9), st
            fl = sum(st["floor_s"] for st in full)
            assert close(m["decode_x_floor"], max(1.0, t / fl)), (m["decode_x_floor"], t, fl)
            # at the probe's median pass (no faster than its best) the floors are no lower
            assert 0 < run["read_bw_median_gbs"] <= run["read_bw_gbs"]
            assert 1.0 <= m["decode_x_floor_median_read"] <= m["decode_x_floor"] * (1 + 1e-9), m
print("json ok")
PY

# The model options reach the benchmarked model: --q8-coarse's layout reads fewer bytes per token.
for opt in "" "--q8-coarse"; do
  # shellcheck disable=SC2086
  "$TK_CLI" bench -m "$model" --repack q8_0 $opt --in 4 --out 2 --batch 1 --requests 1 --warmup 0 --threads 1 -q \
    --json "$dir/q8$opt.json" >/dev/null
done
"$TK_PYTHON" - "$dir/q8.json" "$dir/q8--q8-coarse.json" <<'PY'
import json, sys
a, b = (json.load(open(f))["model"]["decode_bytes"] for f in sys.argv[1:3])
assert 0 < b < a, (a, b)
print("model options ok")
PY

# A run with no decode step to time (one output token) says so in its
# progress line instead of printing a roofline of nan.
"$TK_CLI" bench -m "$model" --in 4 --out 1 --batch 1 --requests 1 --warmup 0 --threads 1 >/dev/null 2>"$dir/err1"
grep -q "rep 1/1: .*roofline - (no decode step sampled)" "$dir/err1" || fail "no-decode run: $(cat "$dir/err1")"
if grep -qi "nan" "$dir/err1"; then fail "nan in the progress line: $(cat "$dir/err1")"; fi

# The ablation: each rung must run (and report through engine stats) what it
# names, in three rounds by default, the rungs' order reversed every other
# round, its speed-ups the medians of the rounds' ratios.
"$TK_CLI" bench -m "$model" --ablation --in 8 --out 4 --batch 1,2 --requests 2 --warmup 0 --threads 1 \
  --json "$dir/a.json" >"$dir/a.md" 2>"$dir/a.err"
grep -q "## Ablation" "$dir/a.md" || fail "no ablation table"
"$TK_PYTHON" - "$dir/a.json" "$dir/a.err" <<'PY'
import json, re, statistics, sys
r = json.load(open(sys.argv[1]))
assert r["options"]["repeat"] == 3, r["options"]["repeat"]
for s in r["series"]:
    assert [len(p["runs"]) for p in s["points"]] == [3, 3], s["label"]
# the order the rungs ran in, round by round (progress lines on stderr)
order = {}
for line in open(sys.argv[2]):
    m = re.match(r"bench: (\d) .* concurrency 1 rep (\d)/3:", line)
    if m:
        order.setdefault(int(m.group(2)), []).append(int(m.group(1)))
assert order == {1: [1, 2, 3, 4, 5, 6], 2: [6, 5, 4, 3, 2, 1], 3: [1, 2, 3, 4, 5, 6]}, order
def ratios(s, level, key, lower_better):
    base = r["series"][0]["points"][level]["runs"]
    runs = r["series"][s]["points"][level]["runs"]
    return [(b["metrics"][key] / x["metrics"][key]) if lower_better else (x["metrics"][key] / b["metrics"][key])
            for b, x in zip(base, runs)]
for s, a in enumerate(r["ablation"]):
    assert abs(a["tpot_p50_lo_speedup"] - statistics.median(ratios(s, 0, "tpot_p50_ms", True))) < 1e-9
    assert abs(a["output_tok_s_hi_speedup"] - statistics.median(ratios(s, 1, "output_tok_s", False))) < 1e-9
    assert abs(a["tpot_p99_hi_speedup"] - statistics.median(ratios(s, 1, "tpot_p99_ms", True))) < 1e-9
want = [  # weights, kv, unfused, static, no_chunking
    ("bf16", "bf16", True, True, True),
    ("q8_0", "bf16", True, True, True),
    ("q8_0", "int8", True, True, True),
    ("q8_0", "int8", False, True, True),
    ("q8_0", "int8", False, False, False),
    ("q4_0", "int8", False, False, False),
]
got = [(s["engine"]["weight_dtype"], s["engine"]["kv_type"], s["engine"]["unfused"], s["engine"]["static_batching"],
        s["engine"]["no_chunking"]) for s in r["series"]]
assert got == want, got
assert len(r["ablation"]) == 6
assert [s["repack_output"] for s in r["series"]] == ["keep"] * 5 + ["q8_0"]
assert abs(r["ablation"][0]["output_tok_s_hi_speedup"] - 1) < 1e-9
for a in r["ablation"]:
    assert a["lo_concurrency"] == 1 and a["hi_concurrency"] == 2
    assert a["tpot_p50_lo_ms"] > 0 and a["output_tok_s_hi"] > 0
    assert 0 < a["roofline_pct_lo"] <= 100
print("ablation ok")
PY
echo "test_bench: ok"
