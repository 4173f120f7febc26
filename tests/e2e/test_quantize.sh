#!/usr/bin/env bash
# tokamak quantize: from a GGUF file and from a Hugging Face directory, every
# architecture, to the same tensors `tokamak synth` writes for that type
# (identical logits: the converter rounds the same F32 values the same way,
# and restores GGUF's llama Q/K row order from HF's); clear errors on bad input.
set -euo pipefail
: "${TK_CLI:?}"
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/quantize.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
P="151644,872,198,9707,11,1879,0"
logits() { "$TK_CLI" run -m "$1" --tokens "$P" -n 6 --temp 0 --kv-type f32 --no-probe --ignore-eos --dump-logits "$2" >/dev/null 2>"$W/run.err" || { cat "$W/run.err"; fail "run $1"; }; }

# check ARCH TYPE SOURCE_DTYPE [synth options]: quantize synth's SOURCE_DTYPE model
# (GGUF and HF directory) to TYPE; the logits equal those of synth's TYPE model.
check() {
    local arch=$1 t=$2 from=$3
    shift 3
    local S="--preset tiny --arch $arch --layers 1 --seed 3 $*"
    # shellcheck disable=SC2086
    "$TK_CLI" synth $S --dtype $t -o "$W/want.gguf" 2>/dev/null
    # shellcheck disable=SC2086
    "$TK_CLI" synth $S --dtype $from -o "$W/src.gguf" 2>/dev/null
    # shellcheck disable=SC2086
    "$TK_CLI" synth $S --dtype $from --format hf -o "$W/hf" 2>/dev/null
    logits "$W/want.gguf" "$W/want.f32"
    for src in "$W/src.gguf" "$W/hf"; do
        "$TK_CLI" quantize -i "$src" -o "$W/got.gguf" --type $t 2>/dev/null || fail "$arch: quantize $src --type $t"
        logits "$W/got.gguf" "$W/got.f32"
        cmp -s "$W/want.f32" "$W/got.f32" || fail "$arch $t from $from $(basename "$src"): logits differ from synth's"
    done
    echo "quantize $arch $from -> $t ($*): GGUF and HF sources give synth --dtype $t's logits"
    rm -rf "$W/hf" "$W"/*.gguf
}
# (synth rounds a bf16 model's norms through bf16 too, so bf16 starts from bf16)
check qwen3 q8_0 f32
check qwen3 bf16 bf16 --tied
check qwen2 f32 f32 --tied
check llama f32 f32 --tied

# bad usage: exit 2 naming the problem; bad input: exit 1 and no output file
"$TK_CLI" synth --preset tiny --layers 1 --dtype f32 -o "$W/m.gguf" 2>/dev/null
for args in "--type q3_k" "--bogus" "-o" ""; do
    set +e
    # shellcheck disable=SC2086
    "$TK_CLI" quantize -i "$W/m.gguf" -o "$W/x.gguf" $args >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$args" = "" ] && { [ "$rc" -eq 0 ] && fail "quantize without --type succeeded"; }
    [ "$rc" -eq 2 ] || fail "quantize $args exited $rc, expected 2"
    grep -q "tokamak quantize:" "$W/err.txt" || fail "quantize $args: no message"
done
head -c 4096 "$W/m.gguf" >"$W/cut.gguf"
for in in "$W/missing.gguf" "$W/cut.gguf" "$W"; do
    set +e
    "$TK_CLI" quantize -i "$in" -o "$W/x.gguf" --type bf16 >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$rc" -eq 1 ] || fail "quantize -i $in exited $rc, expected 1"
    grep -q "tokamak quantize:" "$W/err.txt" || fail "quantize -i $in: no message"
    [ ! -e "$W/x.gguf" ] || fail "quantize -i $in left $W/x.gguf"
done
# calibration and eval: bad input is a clear error and leaves no file
printf '1 In the beginning God created the heaven and the earth.\n\n2 And the earth was without form.\n' >"$W/text.txt"
: >"$W/empty.txt"
bad() { # WANT_RC ARGS...: the command exits WANT_RC with a message and writes no $W/x.gguf
    local want=$1 rc
    shift
    set +e
    "$TK_CLI" "$@" >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$rc" -eq "$want" ] || fail "$* exited $rc, expected $want"
    grep -q "tokamak $1:" "$W/err.txt" || fail "$*: no message"
    [ ! -e "$W/x.gguf" ] || fail "$* left $W/x.gguf"
}
bad 1 quantize -i "$W/m.gguf" -o "$W/x.gguf" --type q4_0 --calib "$W/missing.txt"
bad 1 quantize -i "$W/m.gguf" -o "$W/x.gguf" --type q4_0 --calib "$W/empty.txt"
bad 2 quantize -i "$W/m.gguf" -o "$W/x.gguf" --type q4_0 --keep "blk.*=q3_k"
bad 2 quantize -i "$W/m.gguf" -o "$W/x.gguf" --type q4_0 --rtn
bad 2 eval -m "$W/m.gguf"
bad 1 eval -m "$W/m.gguf" -f "$W/missing.txt"
bad 1 eval -m "$W/m.gguf" -f "$W/empty.txt"
bad 1 eval -m "$W/m.gguf" -f "$W/text.txt" --ref "$W/missing.gguf"
# a model against itself: no divergence, full agreement, no length drift
"$TK_CLI" eval -q -m "$W/m.gguf" --ref "$W/m.gguf" -f "$W/text.txt" --ctx 16 --gen 2 --gen-prompt 4 --gen-len 8 --json >"$W/self.json" ||
    fail "eval against itself"
grep -q '"kl_mean":0.000000e+00,"kl_p99":0.000000e+00,"top1_pct":100.0000' "$W/self.json" || fail "eval against itself: $(cat "$W/self.json")"
grep -q '"len_drift":0.0000' "$W/self.json" || fail "eval against itself: length drift: $(cat "$W/self.json")"
# calibrated quantization runs on the tiny model and reports each matrix
"$TK_CLI" quantize -i "$W/m.gguf" -o "$W/c.gguf" --type q4_0 --calib "$W/text.txt" >"$W/c.out" 2>"$W/c.err" || { cat "$W/c.err"; fail "quantize --calib"; }
grep -q "^activation-weighted error (all layers): " "$W/c.out" || fail "quantize --calib: no total error"
grep -q "blk.0.ffn_down.weight *q6_k *act-weighted err" "$W/c.err" || fail "quantize --calib: no per-tensor line (layer 0 one step up)"
# the conversion's rows split over the threads: the same file and the same printed errors on one thread as on three
"$TK_CLI" quantize -i "$W/m.gguf" -o "$W/c1.gguf" --type q4_0 --calib "$W/text.txt" --threads 1 >"$W/c1.out" 2>"$W/c1.err" ||
    { cat "$W/c1.err"; fail "quantize --calib --threads 1"; }
"$TK_CLI" quantize -i "$W/m.gguf" -o "$W/c3.gguf" --type q4_0 --calib "$W/text.txt" --threads 3 >"$W/c3.out" 2>"$W/c3.err" ||
    { cat "$W/c3.err"; fail "quantize --calib --threads 3"; }
cmp -s "$W/c1.gguf" "$W/c3.gguf" || fail "quantize --calib: the file differs between 1 and 3 threads"
cmp -s "$W/c1.out" "$W/c3.out" || fail "quantize --calib: the total error differs between 1 and 3 threads"
grep "err " "$W/c1.err" >"$W/c1.lines"
grep "err " "$W/c3.err" >"$W/c3.lines"
cmp -s "$W/c1.lines" "$W/c3.lines" || fail "quantize --calib: the per-tensor errors differ between 1 and 3 threads"
"$TK_CLI" quantize -i "$W/m.gguf" -o "$W/r1.gguf" --type q4_k_m --threads 1 >/dev/null 2>&1 || fail "quantize --threads 1"
"$TK_CLI" quantize -i "$W/m.gguf" -o "$W/r3.gguf" --type q4_k_m --threads 3 >/dev/null 2>&1 || fail "quantize --threads 3"
cmp -s "$W/r1.gguf" "$W/r3.gguf" || fail "quantize: the file differs between 1 and 3 threads"
echo "quantize: ok"
