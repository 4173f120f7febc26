#!/usr/bin/env bash
# INT8 KV on the trained reference model (docs/reference-model.md): top-1
# agreement with F32 KV over 5 x 256 teacher-forced greedy positions, as
# `tokamak kvcheck` measures it, at least 99% with per-head and with per-token
# scales, and the KL of each below 1e-3.
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}"
source "$TK_SRC/tests/e2e/refmodel.sh"
refmodel_setup
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
OUT=$(mktemp "$TK_TMP/refmodel_kvcheck.XXXXXX")
trap 'rm -f "$OUT"' EXIT
"$TK_CLI" kvcheck -m "$RM_HF" --seeds 99,1,2,3,4 --prompt 32 --gen 256 --threads 2 >"$OUT" || {
    echo "FAIL: kvcheck exited $?"
    exit 1
}
cat "$OUT"
all=$(grep '^| all | ' "$OUT") || { echo "FAIL: no total row"; exit 1; }
# | all | | ties | int8-head % | KL | int8-token % | KL | bf16 % | KL | f16 % | KL |
fails=0
for col in 5:int8-head 7:int8-token; do
    f=${col%%:*} name=${col#*:}
    pct=$(echo "$all" | awk -F'|' -v f="$f" '{ v = $f; gsub(/[ %]/, "", v); print v }')
    kl=$(echo "$all" | awk -F'|' -v f="$((f + 1))" '{ v = $f; gsub(/ /, "", v); print v }')
    if awk -v p="$pct" -v k="$kl" 'BEGIN { exit !(p >= 99 && k >= 0 && k < 1e-3) }'; then
        echo "$name: $pct% top-1 agreement, mean KL $kl"
    else
        echo "FAIL: $name: $pct% top-1 agreement (want >= 99%), mean KL $kl (want < 1e-3)"
        fails=$((fails + 1))
    fi
done
[ $fails = 0 ] || exit 1
echo "refmodel kvcheck: ok"
