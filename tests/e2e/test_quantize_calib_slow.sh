#!/usr/bin/env bash
# Calibrated 4-bit against round-to-nearest 4-bit, measured by `tokamak eval`
# against the float weights on held-out text:
# - on the trained reference model (docs/reference-model.md; calibration text
#   from the training split, evaluation text held out): lower activation-
#   weighted error, lower mean KL and higher top-1 agreement, for q4_0 and
#   q4_k (on 1,024 held-out tokens: fewer and top-1 is within noise);
# - on a synthetic model with planted outlier channels (synth --outliers):
#   lower activation-weighted error and lower KL (top-1 is not asserted there:
#   a random model's next-token distributions are full of near-ties).
# Every layer is quantized to 4 bits (--keep none), the embedding at q8_0.
# Also: eval's JSON, INT8 KV through eval, and the per-tensor report.
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}"
source "$TK_SRC/tests/e2e/refmodel.sh"
refmodel_setup
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/quantize_calib.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
CALIB="$TK_SRC/tests/data/refmodel/calib.txt"
HELD="$TK_SRC/tests/data/refmodel/heldout.txt"
KEEP=(--keep none --keep token_embd.weight=q8_0)
EVAL=(-f "$HELD" --max-tokens 1024 --ctx 256 --gen 2 --threads 2 --json -q)

# json FILE KEY: a number from eval's one-line JSON
json() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }
# lt A B: A < B (floats)
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# compare NAME SOURCE TYPE REF_MODEL TOP1: quantize SOURCE both ways, eval against REF_MODEL
compare() {
    local name=$1 src=$2 t=$3 ref=$4 top1=$5 m
    for m in rtn cal; do
        local extra=()
        [ $m = rtn ] && extra=(--rtn)
        "$TK_CLI" quantize -i "$src" -o "$W/$m.gguf" --type "$t" "${KEEP[@]}" --calib "$CALIB" --threads 2 \
            "${extra[@]}" >"$W/$m.q" 2>"$W/$m.err" || { cat "$W/$m.err"; fail "$name: quantize $m"; }
        "$TK_CLI" eval -m "$W/$m.gguf" --ref "$ref" "${EVAL[@]}" >"$W/$m.json" 2>"$W/$m.eerr" ||
            { cat "$W/$m.eerr"; fail "$name: eval $m"; }
    done
    grep -q "blk.0.attn_q.weight *$t *act-weighted err" "$W/cal.err" || fail "$name: no per-tensor line for blk.0.attn_q"
    local er ec kr kc tr tc
    er=$(sed -n 's/^activation-weighted error (all layers): //p' "$W/rtn.q")
    ec=$(sed -n 's/^activation-weighted error (all layers): //p' "$W/cal.q")
    kr=$(json "$W/rtn.json" kl_mean) kc=$(json "$W/cal.json" kl_mean)
    tr=$(json "$W/rtn.json" top1_pct) tc=$(json "$W/cal.json" top1_pct)
    echo "$name $t: act-weighted error $er -> $ec, KL $kr -> $kc, top-1 $tr% -> $tc%"
    lt "$ec" "$er" || fail "$name $t: calibrated activation-weighted error $ec not below $er"
    lt "$kc" "$kr" || fail "$name $t: calibrated KL $kc not below $kr"
    if [ "$top1" = 1 ]; then lt "$tr" "$tc" || fail "$name $t: calibrated top-1 $tc% not above $tr%"; fi
}

compare refmodel "$RM_HF" q4_0 "$RM_HF" 1
compare refmodel "$RM_HF" q4_k "$RM_HF" 1
"$TK_CLI" synth --preset tiny --layers 2 --dtype bf16 --outliers 4 -o "$W/outliers.gguf" 2>/dev/null
compare synth-outliers "$W/outliers.gguf" q4_0 "$W/outliers.gguf" 0

# INT8 KV through eval: same weights, only the KV differs
for s in head token; do
    "$TK_CLI" eval -m "$RM_HF" --ref "$RM_HF" --kv-type int8 --kv-scale $s "${EVAL[@]}" >"$W/kv.json" ||
        fail "eval --kv-type int8 --kv-scale $s"
    k=$(json "$W/kv.json" kl_mean) t=$(json "$W/kv.json" top1_pct)
    echo "int8 KV per $s: KL $k, top-1 $t%"
    lt "$k" 1e-3 || fail "int8 KV per $s: KL $k"
    lt 99 "$t" || fail "int8 KV per $s: top-1 $t%"
done
echo "quantize calibration: ok"
