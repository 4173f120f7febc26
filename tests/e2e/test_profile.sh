#!/usr/bin/env bash
# tokamak profile: the per-stage table and its JSON on a tiny model. The
# stage times add up to the step time, thread 0's marks cover its forward
# step (time it spent off its CPU between marks aside), the stage bytes add
# up to the bytes the step reads (the model's decode bytes and the KV at the
# context), barriers are counted, a prefill
# chunk's attention counts every (token, position) pair it reads (its last
# layer past attention the wanted token's alone), --kernels times each kind
# of weight at each token count and the attention kernel over that many
# sequences' KV, and bad options are refused with a message.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_PYTHON:=/usr/bin/python3}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/profile.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

"$TK_CLI" synth --preset tiny --dtype q8_0 --layers 2 -o "$W/m.gguf" 2>/dev/null
"$TK_CLI" info -m "$W/m.gguf" --bw 10 >"$W/info.txt"
for b in 1 4; do
    bw=""
    # the probes once are enough; the stages' CPU clocks at batch 4 only; one sequence past its first
    # block, so that attention reads blocks besides the own one (its records' in kv_store)
    ctx=160
    [ $b -eq 4 ] && bw="--bw 20 --peak-int8 500 --peak-f32 100 --stage-cpu" && ctx=32
    # shellcheck disable=SC2086
    "$TK_CLI" profile -m "$W/m.gguf" --batch $b --ctx $ctx --steps 4 --kv-type int8 --block-size 128 --threads 2 \
        $bw --json "$W/p$b.json" >"$W/p$b.md" || fail "profile --batch $b exited $?"
    grep -q '^| attention | ' "$W/p$b.md" || fail "no attention row (batch $b)"
    grep -q '^| \*\*step\*\* | ' "$W/p$b.md" || fail "no step row (batch $b)"
    grep -q '^- barriers per step: ' "$W/p$b.md" || fail "no barrier count (batch $b)"
    # the paged-read probe runs with the read probe (INT8 per head, blocks of 128, head_dim 128,
    # context 160: a kv head's two blocks, units of K, V and scales of 33 KiB each, side by side)
    if [ $b -eq 1 ]; then
        grep -q '^- paged KV reads (66 KiB runs, a kv head.s blocks of one sequence and part side by side, .*): best [0-9.]* GB/s (median [0-9.]*), [0-9]*% of the streaming probe' "$W/p$b.md" ||
            fail "no paged-read probe line"
        grep -q "^- attention's [0-9.]* MB at the paged-read rate ([0-9.]* GB/s) take [0-9.]* ms: the stage took [0-9.]*x that" "$W/p$b.md" ||
            fail "no attention at the paged-read rate line"
    elif grep -q 'paged' "$W/p$b.md"; then
        fail "a paged-read line with the bandwidth given"
    fi
    # the attention kernel over cached KV: at context 160 the pool holds a block below each query's own
    # block; at 32 nothing but the own block (its record), so no line
    if [ $b -eq 1 ]; then
        grep -q "^- attention's kernel over cached KV (one layer of one sequence, 128 positions, held in cache: its arithmetic alone) reads [0-9.]* GB/s: the stage's [0-9.]* MB in [0-9.]* ms; the stage took [0-9.]*x that (the two times bound the stage" "$W/p$b.md" ||
            fail "no attention kernel over cached KV line"
    elif grep -q "kernel over cached KV" "$W/p$b.md"; then
        fail "an attention kernel line where the pool holds only the own blocks"
    fi
    grep -q '| uneven ms |$' "$W/p$b.md" || fail "no uneven ms column (batch $b)"
    grep -q "^- the output, gate/up, down and vocabulary rows were split by each thread's measured speed; shares after the last step: [0-9.]*% / [0-9.]*%$" "$W/p$b.md" ||
        fail "no row shares line (batch $b)"
done
# contexts spread over the batch: 32 - 12, -4, +4, +13 (--ctx-spread 25); a spread past --ctx and one with
# --prefill are refused
"$TK_CLI" profile -m "$W/m.gguf" --batch 4 --ctx 32 --ctx-spread 25 --steps 2 --kv-type int8 --block-size 128 \
    --threads 2 --bw 20 --peak-int8 500 --peak-f32 100 --json "$W/pr.json" >"$W/pr.md" || fail "profile --ctx-spread exited $?"
grep -q "batch 4 at contexts 20-45 (spread evenly)" "$W/pr.md" || fail "profile --ctx-spread: no contexts line"
for bad in "--ctx-spread 64" "--ctx-spread 4 --prefill 8"; do
    set +e
    # shellcheck disable=SC2086
    "$TK_CLI" profile -m "$W/m.gguf" --ctx 32 $bad >/dev/null 2>"$W/bad.err"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "profile $bad exited $rc, want 2"
    [ -s "$W/bad.err" ] || fail "profile $bad printed no message"
done
# the rows in halves on request
"$TK_CLI" profile -m "$W/m.gguf" --batch 4 --ctx 32 --steps 2 --threads 2 --even-rows \
    --bw 20 --peak-int8 500 --peak-f32 100 --json "$W/pe.json" >"$W/pe.md" || fail "profile --even-rows exited $?"
grep -q '^- the output, gate/up, down and vocabulary rows were split evenly (--even-rows): 50.0% / 50.0%$' "$W/pe.md" ||
    fail "profile --even-rows: no even shares line"
cat "$W/p4.md"
# a prefill chunk: 8 tokens after 24 of context
"$TK_CLI" profile -m "$W/m.gguf" --prefill 8 --ctx 24 --steps 2 --kv-type int8 --block-size 128 --threads 2 \
    --bw 20 --peak-int8 500 --peak-f32 100 --json "$W/pp.json" >"$W/pp.md" || fail "profile --prefill exited $?"
# blocks of 16 with per-head (pb) and per-token (pt) scales
for sc in head token; do
    out=pb
    [ $sc = token ] && out=pt
    "$TK_CLI" profile -m "$W/m.gguf" --prefill 8 --ctx 24 --steps 2 --kv-type int8 --kv-scale $sc --block-size 16 \
        --threads 2 --bw 20 --peak-int8 500 --peak-f32 100 --json "$W/$out.json" >/dev/null ||
        fail "profile --prefill --kv-scale $sc exited $?"
done
grep -q "8-token prefill chunk after 24 tokens" "$W/pp.md" || fail "profile --prefill: no chunk line"
grep -q " prefill tok/s" "$W/pp.md" || fail "profile --prefill: no prefill rate"
# a peak far below what the stages compute: a probe shortfall, named, and
# the floors use the fastest stage's rate
"$TK_CLI" profile -m "$W/m.gguf" --batch 4 --ctx 16 --steps 2 --threads 2 --bw 20 --peak-int8 1 --peak-f32 100 \
    --json "$W/ps.json" >"$W/ps.md" || fail "profile --peak-int8 1 exited $?"
grep -q '^- \*\*probe shortfall\*\*: .* int8 GOP/s > probe peak 1;' "$W/ps.md" || fail "no int8 probe shortfall line"

"$TK_PYTHON" - "$W" <<'PY'
import json, re, sys
w = sys.argv[1]
info = open(w + "/info.txt").read()
decode = int(re.search(r"decode bytes/token\s+(\d+)", info).group(1))
kv8 = int(re.search(r"kv bytes/token\s+f16 \d+, int8 (\d+)", info).group(1))
hd = int(re.search(r"head_dim (\d+)", info).group(1))
names = ["plan", "embed", "norm_quant", "qkv", "qk_norm_rope", "kv_store", "attention", "o_proj", "residual",
         "gate_up", "silu_mul_quant", "down", "lm_head", "barrier_wait", "sampling"]
for b in (1, 4):
    j = json.load(open(f"{w}/p{b}.json"))
    st, step = j["stages"], j["step"]
    attn = st[names.index("attention")]
    if b == 1:
        # the stage's bytes at the cached kernel's rate
        pr = j["probe"]
        assert pr["attn_cached_positions"] == 128 and pr["attn_cached_gbs"] > 0, pr
        want = attn["bytes"] / (pr["attn_cached_gbs"] * 1e9) * 1e3
        assert abs(attn["cached_kernel_ms"] - want) <= 1e-9 + 1e-9 * want, (attn, want)
    else:
        assert "attn_cached_gbs" not in j["probe"] and "cached_kernel_ms" not in attn, j["probe"]
    got = [s["stage"] for s in st]
    assert got == names, f"stages {got}"
    ctx = 160 if b == 1 else 32
    assert j["batch"] == b and j["ctx"] == ctx and j["steps"] == 4
    # times: the stages (barrier wait and sampling included) are the step,
    # less what stages between the same two barriers overlapped (their
    # longest threads differ: attention starts as each thread's kv_store ends)
    total = sum(s["mean_ms"] for s in st)
    assert step["overlap_mean_ms"] >= 0 and step["overlap_ms"] >= 0, step
    assert abs(total - step["overlap_mean_ms"] - step["mean_ms"]) <= 0.01 * step["mean_ms"] + 1e-3, f"stages {total} ms less overlap {step['overlap_mean_ms']}, step {step['mean_ms']} ms"
    work = sum(s["mean_ms"] for s in st if s["stage"] not in ("barrier_wait", "sampling"))
    assert 0 < work - step["overlap_mean_ms"] <= step["mean_ms"] * (1 + 1e-9), f"work {work} ms, step {step['mean_ms']} ms"
    assert step["thread0_mark_error"] < 0.05, f"thread 0's marks off its step by {step['thread0_mark_error']}"
    for s in st:
        assert s["ms"] >= 0 and s["bytes"] >= 0 and s["ops"] >= 0, s
        # the stages' CPU times only with --stage-cpu (a system call per mark)
        assert (s["cpu_ms"] >= 0) if b == 4 else "cpu_ms" not in s, s
        # a stage's longest thread minus the threads' mean: between 0 and the longest
        if s["stage"] not in ("barrier_wait", "sampling"):
            assert 0 <= s["uneven_ms"] <= s["ms"] + 1e-9, s
    assert 0 <= step["off_cpu"] <= 1
    # bytes: the forward stages read what the step reads
    fwd = sum(s["bytes"] for s in st if s["stage"] != "sampling")
    assert fwd == step["bytes"], f"stage bytes {fwd} != step bytes {step['bytes']}"
    if b == 1:  # one token: the model's decode bytes, plus the KV of 160 + 2 warm-up + 1 positions
        want = decode + (ctx + 3) * kv8
        assert fwd == want, f"stage bytes {fwd}, model says {decode} + {ctx + 3} x {kv8} = {want}"
    assert step["barriers"] > 0, "no barriers counted"
    # the row shares: one per thread, a split within [1/2, 3/2] of even
    rs = step["row_shares"]
    assert len(rs) == 2 and abs(sum(rs) - 1) < 1e-9 and all(0.25 - 1e-9 <= r <= 0.75 + 1e-9 for r in rs), rs
    assert step["floor_ms"] > 0 and step["x_floor"] > 0
    pr = j["probe"]
    assert pr["read_gbs"] > 0 and pr["read_gbs_min"] <= pr["read_gbs_median"] <= pr["read_gbs"]
    assert pr["floor_gbs"] >= pr["read_gbs"]
    # the floors again at the probe's median pass (raised, as the best, by any
    # stage that read faster): never below the best pass's
    assert pr["read_gbs_median"] <= pr["floor_gbs_median"] <= pr["floor_gbs"], pr
    assert step["floor_ms_median_read"] >= step["floor_ms"] * (1 - 1e-9), step
    assert abs(step["x_floor_median_read"] * step["floor_ms_median_read"] - step["x_floor"] * step["floor_ms"]) <= 1e-6 * step["x_floor"] * step["floor_ms"], step
    attn = next(s for s in st if s["stage"] == "attention")
    if b == 1:  # the paged-read probe: two (block, kv head) units of INT8 K, V and scales, and attention's bytes at its rate
        assert pr["kv_run_bytes"] == 2 * 2 * (128 * hd + 4 * hd), pr
        assert 0 < pr["kv_runs_gbs_min"] <= pr["kv_runs_gbs_median"] <= pr["kv_runs_gbs"], pr
        want = attn["bytes"] / (pr["kv_runs_gbs"] * 1e9) * 1e3
        assert attn["bytes"] > 0 and abs(attn["paged_read_ms"] - want) <= 1e-6 * want, (attn, want)
    else:
        assert "kv_runs_gbs" not in pr and "paged_read_ms" not in attn, (pr, attn)
    if b == 4:
        assert pr["read_gbs"] == 20 and pr["read_passes"] == 0 and pr["peak_gops_int8"] == 500
        # a given bandwidth has no spread: one floor
        assert step["floor_ms_median_read"] == step["floor_ms"], step
    # no stage reading a megabyte or more (from memory, not cache) beats the
    # bandwidth its floor uses: a faster one raises it
    for s in st:
        assert s["bytes"] < 1e6 or s["bw_pct"] <= 100.0 + 1e-6, s
    # nor one of 0.1 GOP or more the peak its floor uses
    assert pr["floor_gops_int8"] >= pr["peak_gops_int8"] and pr["floor_gflops_f32"] >= pr["peak_gflops_f32"], pr
    for s in st:
        assert s["ops"] < 1e8 or s["peak_pct"] <= 100.0 + 1e-6, s
assert json.load(open(w + "/pe.json"))["step"]["row_shares"] == [0.5, 0.5]
# the spread batch reads the KV of its own contexts: one position more in all than the even batch of 4
r4, rs = json.load(open(w + "/p4.json")), json.load(open(w + "/pr.json"))
assert rs["ctx_spread"] == 25 and r4["ctx_spread"] == 0
assert rs["step"]["bytes"] == r4["step"]["bytes"] + kv8, (rs["step"]["bytes"], r4["step"]["bytes"], kv8)
assert sum(s["bytes"] for s in rs["stages"] if s["stage"] != "sampling") == rs["step"]["bytes"]
j = json.load(open(w + "/ps.json"))
pr = j["probe"]
assert pr["peak_gops_int8"] == 1 and pr["floor_gops_int8"] > 1 and pr["int8_shortfall_stage"], pr
top = max(s["ops"] / s["ms"] / 1e6 for s in j["stages"] if s["peak"] == "int8" and s["ops"] >= 1e8)
assert abs(pr["floor_gops_int8"] - top) <= 1e-6 * top, (pr, top)
for s in j["stages"]:
    assert s["ops"] < 1e8 or s["peak_pct"] <= 100.0 + 1e-6, s
# the prefill chunk: its bytes are the step's, its weights read once for all
# 8 tokens, and its attention pairs 8 x 24 + (1 + ... + 8) = 228 against the
# decode step's 35 (batch 1 above) in the first of the model's two layers;
# the last layer's attention, output projection and FFN run for the wanted
# token alone (32 pairs, 1 token)
j, d = json.load(open(w + "/pp.json")), json.load(open(w + "/p1.json"))
assert j["prefill"] == 8 and j["batch"] == 1 and j["ctx"] == 24 and d["prefill"] == 0
st = {s["stage"]: s for s in j["stages"]}
dst = {s["stage"]: s for s in d["stages"]}
assert sum(s["bytes"] for s in j["stages"] if s["stage"] != "sampling") == j["step"]["bytes"]
assert st["qkv"]["bytes"] == dst["qkv"]["bytes"] and st["qkv"]["ops"] == 8 * dst["qkv"]["ops"], st["qkv"]
assert st["lm_head"]["ops"] == dst["lm_head"]["ops"], "one row of logits per chunk"
# (with per-head INT8 KV in blocks of 128 every pair is an own-block record's:
# the kv_store stage's, none the attention stage's)
assert st["attention"]["ops"] == 0 and st["attention"]["bytes"] == 0, st["attention"]
r = st["kv_store"]["ops"] / dst["kv_store"]["ops"]
assert abs(r - (228 + 32) / (2 * 35)) < 1e-9, f"attention ops ratio {r}, want (228 + 32)/70"
# blocks of 16: the chunk's tokens (positions 24..31) are in block 1, whose
# records read positions 16..31 and do 9 + ... + 16 = 100 pairs (16 for the
# last layer's wanted token); the attention stage reads block 0, 16 pairs a
# token (16 in the last layer). Per-token scales: no records.
b16 = {s["stage"]: s for s in json.load(open(w + "/pb.json"))["stages"]}
assert b16["kv_store"]["bytes"] == b16["attention"]["bytes"] > 0, (b16["kv_store"], b16["attention"])
r = b16["kv_store"]["ops"] / b16["attention"]["ops"]
assert abs(r - (100 + 16) / (8 * 16 + 16)) < 1e-9, f"records / attention ops {r}, want 116/144"
tok = {s["stage"]: s for s in json.load(open(w + "/pt.json"))["stages"]}
assert tok["kv_store"]["ops"] == 0 and tok["kv_store"]["bytes"] == 0, tok["kv_store"]
assert tok["attention"]["ops"] == b16["attention"]["ops"] + b16["kv_store"]["ops"], tok["attention"]
for name in ("o_proj", "gate_up", "down"):
    r = st[name]["ops"] / dst[name]["ops"]
    assert abs(r - (8 + 1) / 2) < 1e-9, f"{name} ops ratio {r}, want 9/2"
assert j["step"]["prefill_tok_s"] > 0 and "output_tok_s" not in j["step"]
print("ok: profile JSON")
PY

# BF16 pairs with rounded activations (--bf16-dot): their matmuls are judged
# by the vdpbf16ps peak where they run it (the CPU has AVX512-BF16 and the
# instruction measured faster), which is then probed; else by the fp32 one
"$TK_CLI" synth --preset tiny --dtype bf16 --layers 2 -o "$W/b.gguf" 2>/dev/null
"$TK_CLI" profile -m "$W/b.gguf" --bf16-dot --batch 4 --ctx 16 --steps 2 --threads 2 --bw 20 --peak-int8 500 \
    --peak-f32 100 --json "$W/pb16.json" >"$W/pb16.md" || fail "profile --bf16-dot exited $?"
"$TK_CLI" profile -m "$W/b.gguf" --bf16-dot --kernels --tokens 1,4 --rounds 1 --threads 2 --bw 20 \
    --peak-int8 500 --peak-f32 100 --json "$W/pkb16.json" >/dev/null || fail "profile --bf16-dot --kernels exited $?"
"$TK_PYTHON" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
j = json.load(open(w + "/pb16.json"))
pr, hw = j["probe"], j["probe"]["peak_gflops_bf16"] > 0
want = "bf16" if hw else "fp32"
proj = [s for s in j["stages"] if s["stage"] in ("qkv", "o_proj", "gate_up", "down", "lm_head")]
assert all(s["peak"] == want for s in proj), (want, proj)
assert pr["floor_gflops_bf16"] >= pr["peak_gflops_bf16"], pr
for s in j["stages"]:
    assert s["ops"] < 1e8 or s["peak_pct"] <= 100.0 + 1e-6, s
k = json.load(open(w + "/pkb16.json"))
assert (k["peak_bf16_gflops"] > 0) == hw, k
assert all(r["layout"] == "p16r" and r["peak"] == want and not r["int8"] for r in k["kernels"]), k["kernels"]
print("ok: profile --bf16-dot JSON (%s)" % ("vdpbf16ps" if hw else "two FMAs"))
PY
grep -q "peak bf16 dot [0-9]* GFLOP/s (probed now)" "$W/pb16.md" ||
    "$TK_PYTHON" -c 'import json, sys; assert json.load(open(sys.argv[1]))["probe"]["peak_gflops_bf16"] == 0' "$W/pb16.json" ||
    fail "profile --bf16-dot: a BF16 dot peak in the JSON but not in the report"

# placement: both threads on CPU 0 (the list cycles), --numa (on one node it says so)
"$TK_CLI" profile -m "$W/m.gguf" --batch 2 --ctx 16 --steps 2 --threads 2 --cpus 0 --numa --bw 20 \
    --peak-int8 500 --peak-f32 100 \
    --json "$W/pc.json" >"$W/pc.md" 2>"$W/pc.err" || fail "profile --cpus 0 --numa exited $?"
grep -q '"threads":	2' "$W/pc.json" || fail "profile --cpus 0 --threads 2: not 2 threads"
# two threads on one CPU take turns: each is off the CPU while the other runs
"$TK_PYTHON" -c 'import json, sys; o = json.load(open(sys.argv[1]))["step"]["off_cpu"]; assert 0.2 < o < 0.9, o' "$W/pc.json" ||
    fail "profile --cpus 0 --threads 2: the threads' time off the CPU not seen"
grep -q "numa" "$W/pc.err" || grep -q . "$W/pc.md" || fail "--numa: no output"

# --kernels: the weight kernels alone, each kind at each count, streamed and cached; attention over
# INT8 per-head KV at context 300 (blocks of 128: each query reads the pool up to its own block, 256)
"$TK_CLI" profile -m "$W/m.gguf" --kernels --tokens 1,3,8 --rounds 2 --threads 2 --bw 20 --peak-int8 500 \
    --peak-f32 100 --kv-type int8 --ctx 300 --json "$W/pk.json" >"$W/pk.md" || fail "profile --kernels exited $?"
grep -q '^| q8_0 x16 | 3 | ' "$W/pk.md" || fail "profile --kernels: no q8_0 x16 row at 3 tokens"
grep -q '^## attention, KV int8 per head, context 300, blocks of 128' "$W/pk.md" ||
    fail "profile --kernels: no attention table"
grep -q '^| 8 | 256 | ' "$W/pk.md" || fail "profile --kernels: no attention row for 8 sequences"
"$TK_PYTHON" - "$W/pk.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["kernels"]
assert j["threads"] == 2 and j["rounds"] == 2, j
kinds = {}
for r in rows:
    kinds.setdefault((r["type"], r["layout"]), []).append(r)
# every matmul weight once: 7 per layer (2 layers) and the output matrix
assert sum(v[0]["matrices"] for v in kinds.values()) == 15, kinds.keys()
for k, v in kinds.items():
    assert [r["tokens"] for r in v] == [1, 3, 8], (k, v)
    assert v[0]["x_first"] == 1.0, (k, v[0])
    for r in v:
        assert r["bytes"] == v[0]["bytes"] > 0 and r["cached_bytes"] > 0, r
        assert r["ops"] == v[0]["ops"] * r["tokens"], r
        for f in ("gbs", "gops", "x_first", "cached_gbs", "cached_gops"):
            assert r[f] > 0, (f, r)
        # the same bytes over the same seconds: the rates agree
        assert abs(r["gops"] / r["gbs"] - r["ops"] / r["bytes"]) < 1e-6 * r["ops"] / r["bytes"], r
a = j["attention"]
assert (a["kv_type"], a["kv_scale"], a["ctx"], a["block_size"]) == ("int8", "head", 300, 128), a
assert [r["sequences"] for r in a["rows"]] == [1, 3, 8], a
for r in a["rows"]:
    pairs = r["sequences"] * r["positions"]
    # tiny: 2 layers, 4 heads over 2 kv heads, head_dim 128; INT8 KV 1,056 bytes a token (tokamak info)
    assert r["positions"] == 256 and r["bytes"] == pairs * 1056, r
    assert r["ops"] == 4 * pairs * 2 * 4 * 128, r
    # one layer of one sequence, whole blocks, no more than the streamed context
    assert 0 < r["cached_positions"] <= 256 and r["cached_positions"] % 128 == 0, r
    assert r["cached_bytes"] == r["cached_positions"] * 1056 // 2, r
    for f in ("gbs", "gops", "ns_per_position", "cached_gbs", "cached_ns_per_position"):
        assert r[f] > 0, (f, r)
    assert abs(r["gops"] / r["gbs"] - r["ops"] / r["bytes"]) < 1e-6 * r["ops"] / r["bytes"], r
print("ok: profile --kernels JSON")
PY

# attention over F16 KV (no own-block records): each query reads its whole context
"$TK_CLI" profile -m "$W/m.gguf" --kernels --tokens 2 --rounds 1 --threads 2 --bw 20 --peak-int8 500 \
    --peak-f32 100 --ctx 200 --json "$W/pkf.json" >"$W/pkf.md" || fail "profile --kernels (f16) exited $?"
"$TK_PYTHON" - "$W/pkf.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["attention"]
assert (a["kv_type"], a["ctx"]) == ("f16", 200), a
r, = a["rows"]
assert r["sequences"] == 2 and r["positions"] == 200 and r["bytes"] == 2 * 200 * 2048, r
assert r["cached_positions"] == 128 and r["cached_gbs"] > 0, r
print("ok: profile --kernels attention over F16 KV")
PY

for args in "--kernels --batch 2" "--kernels --steps 2" "--kernels --stage-cpu" "--tokens 4" "--rounds 2" \
    "--kernels --tokens 0" "--kernels --tokens 1,,2" "--kernels --tokens 1," "--kernels --tokens 257" \
    "--kernels --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17" "--kernels --rounds 0" \
    "--kernels --kv-type int8 --ctx 128" "--kernels --block-size 48" \
    "--batch 0" "--steps 0" "--ctx 0" "--bw 0" "--prefill 0" "--prefill 4 --batch 2" "--cpus 0,0" "--cpus x" "--cpus 3-1" "--kv-mem 64" "--bogus"; do
    set +e
    # shellcheck disable=SC2086
    "$TK_CLI" profile -m "$W/m.gguf" $args >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "profile $args exited $rc, expected 2"
    grep -q "tokamak profile:" "$W/err.txt" || fail "profile $args: no message"
done
set +e
"$TK_CLI" profile >/dev/null 2>"$W/err.txt"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "profile without -m exited $rc"
echo "ok: tokamak profile"
