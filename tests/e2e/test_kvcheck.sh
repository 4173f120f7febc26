#!/usr/bin/env bash
# tokamak kvcheck: the table it prints (per seed and over all seeds, every KV
# type), that f16 KV tracks f32 KV closely on a tiny model, and clear errors
# on bad options.
set -euo pipefail
: "${TK_CLI:?}"
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/kvcheck.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

"$TK_CLI" synth --preset tiny --dtype f32 --layers 2 -o "$W/m.gguf" 2>/dev/null
"$TK_CLI" kvcheck -m "$W/m.gguf" --seeds 5,6 --prompt 8 --gen 24 --threads 2 >"$W/out.txt" ||
    fail "kvcheck exited $?"
cat "$W/out.txt"
grep -q '^| 5 | ' "$W/out.txt" || fail "no row for seed 5"
grep -q '^| 6 | ' "$W/out.txt" || fail "no row for seed 6"
all=$(grep '^| all | ' "$W/out.txt") || fail "no total row"
for k in int8-head int8-token bf16 f16; do grep -q " $k agree " "$W/out.txt" || fail "no $k column"; done
# columns: | all | | ties | int8-head % | KL | int8-token % | KL | bf16 % | KL | f16 % | KL |
f16_kl=$(echo "$all" | awk -F'|' '{gsub(/ /, "", $12); print $12}')
awk -v k="$f16_kl" 'BEGIN { exit !(k >= 0 && k < 1e-6) }' || fail "f16 KV mean KL $f16_kl, expected < 1e-6"
int8_kl=$(echo "$all" | awk -F'|' '{gsub(/ /, "", $6); print $6}')
awk -v k="$int8_kl" -v f="$f16_kl" 'BEGIN { exit !(k > f && k < 1e-3) }' ||
    fail "int8 KV mean KL $int8_kl: expected above f16's $f16_kl and below 1e-3"

# bad options: exit 2 with a message naming the option
for args in "--seeds x" "--gen 0" "--block-size 24" "--prompt -1" "--bogus"; do
    set +e
    # shellcheck disable=SC2086
    "$TK_CLI" kvcheck -m "$W/m.gguf" $args >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "kvcheck $args exited $rc, expected 2"
    grep -q "tokamak kvcheck:" "$W/err.txt" || fail "kvcheck $args: no message"
done
set +e
"$TK_CLI" kvcheck -m "$W/missing.gguf" >/dev/null 2>"$W/err.txt"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "missing model exited $rc, expected 1"
echo "kvcheck: ok"
