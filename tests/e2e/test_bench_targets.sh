#!/usr/bin/env bash
# bench/targets.sh (`make bench-targets`): three rounds against a stand-in
# tokamak that prints set figures give the exact table (medians, ranges, each
# verdict: met, met at the probe's median pass only, not met, a probe
# shortfall, the rounds' order); one round on the tiny preset with the real
# binary makes the four models it needs and prints a row per configuration;
# bad arguments are refused (exit 2) and a failing tokamak run stops it with
# a message (exit 1).
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}" "${TK_TMP:?}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/targets.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
T="$TK_SRC/bench/targets.sh"
# the targets set so that Q8_0 and BF16 rows pass and the 4-bit ones fail,
# unless the caller sets them
small() {
    PRESET=tiny STEPS=2 CTX=32 NEW_TOKENS=8 NICE=0 BATCHES="2 4" TARGET_READ=${TARGET_READ:-0} \
        TARGET_READ_4BIT=${TARGET_READ_4BIT:-1000000} TARGET_FLOOR=${TARGET_FLOOR:-1000} bash "$T" "$@"
}

small "$TK_CLI" "$W/models" 1 >"$W/t.md" 2>"$W/t.err" || {
    cat "$W/t.err"
    fail "targets.sh exited $?"
}
cat "$W/t.md"
for t in q8_0 bf16 q4_0 q4_k_m; do
    [ -s "$W/models/tiny-$t.gguf" ] || fail "no tiny-$t.gguf made"
done
grep -q '^# tokamak decode targets$' "$W/t.md" || fail "no title"
[ "$(grep -c '^| batch 1, [a-z0-9_]*: decode read, % of the probe (best pass; median pass) | ' "$W/t.md")" -eq 4 ] ||
    fail "not 4 one-sequence rows"
[ "$(grep -c '^| batch [24], Q8_0, INT8 KV per \(head\|token\): ' "$W/t.md")" -eq 4 ] || fail "not 4 batch rows"
# one round: every cell a number, the round's own figures, the verdicts of the set targets
awk -F'|' '/^\| batch 1, / {
        split($4, m, " "); med = m[1]; gsub(/%/, "", med); each = $6; sub(/^ */, "", each); sub(/%.*/, "", each)
        if (med !~ /^[0-9]+\.[0-9]$/ || m[2] !~ /^\([0-9]+\.[0-9]%\)$/ || med != each) { print "bad row: " $0; bad = 1 }
        # Q8_0 and BF16 against 0%, the 4-bit files against 1000000%
        if ($7 != ($2 ~ /q8_0|bf16/ ? " yes " : " no ") || $3 != ($2 ~ /q8_0|bf16/ ? " >= 0% " : " >= 1000000% ")) { print "bad verdict: " $0; bad = 1 }
    }
    /^\| batch [24], / {
        split($4, m, " "); x = m[1]
        if (x !~ /^[0-9]+\.[0-9][0-9]$/ || x + 0 <= 0 || m[2] !~ /^\([0-9]+\.[0-9][0-9]\)$/) { print "bad ratio: " $0; bad = 1 }
        if ($6 !~ /^ [0-9.]+ ms \(probe [0-9.]+\) $/) { print "bad round: " $0; bad = 1 }
        if ($7 != " yes " || $3 != " <= 1000 ") { print "bad verdict: " $0; bad = 1 }
    }
    END { exit bad }' "$W/t.md" || fail "table rows"

# the run line the table reads: the probe's best pass, and the median pass
# beside it (or a probe shortfall)
"$TK_CLI" run -m "$W/models/tiny-q8_0.gguf" --tokens 1,2 -n 4 --threads 2 --ignore-eos >/dev/null 2>"$W/run.err" ||
    fail "tokamak run exited $?"
grep -Eq 'GB/s = [0-9.]+% of [0-9.]+ GB/s probe \(best of [0-9]+ passes; [0-9.]+% of the median pass, [0-9.]+ GB/s\)|GB/s > the [0-9.]+ GB/s probe \(a probe shortfall' "$W/run.err" ||
    fail "tokamak run: no probe passes in $(cat "$W/run.err")"

# a stand-in tokamak: each configuration's k-th call prints its k-th figures
cat >"$W/fake" <<'SH'
#!/usr/bin/env bash
set -euo pipefail
d=$(dirname "$0")
cmd=$1
shift
case "$cmd" in
synth)
    while [ $# -gt 0 ]; do [ "$1" = -o ] && echo model >"$2"; shift; done
    exit 0
    ;;
run)
    key=$(basename "$2" .gguf)
    ;;
profile)
    key=$(echo "$*" | sed 's/.*--batch \([0-9]*\).*--kv-scale \([a-z]*\).*/b\1\2/')
    ;;
esac
echo "$key" >>"$d/calls"
k=$(($(cat "$d/n.$key" 2>/dev/null || echo 0) + 1))
echo $k >"$d/n.$key"
# run: decode GB/s, best pass, % of the median pass (none: a probe shortfall)
# profile: step ms, floor ms at the best pass, at the median pass
case "$key" in
tiny-q8_0) set -- 52.00 65.00 95.0 55.25 65.00 97.0 55.25 65.00 91.0 ;;
tiny-bf16) set -- 59.15 65.00 99.0 61.75 65.00 99.0 60.45 65.00 99.0 ;;
tiny-q4_0) set -- 45.50 65.00 80.0 46.80 65.00 82.0 46.15 65.00 81.0 ;;
tiny-q4_k_m) set -- 90.00 80.00 - 90.00 80.00 - 90.00 80.00 - ;;
b2head) set -- 32.000 20.000 22.857 34.000 20.000 23.448 36.000 20.000 24.000 ;;
b2token) set -- 24.000 20.000 20.000 26.000 20.000 20.000 22.000 20.000 20.000 ;;
b4head) set -- 40.000 20.000 22.222 38.000 20.000 22.353 42.000 20.000 22.105 ;;
b4token) set -- 30.000 20.000 20.000 30.000 20.000 20.000 30.000 20.000 21.000 ;;
esac
shift $((3 * (k - 1)))
if [ "$cmd" = run ]; then
    if [ "$3" = - ]; then
        echo "prefill 8 tok | decode 7 tok, TPOT 1 ms | $1 GB/s > the $2 GB/s probe (a probe shortfall: the decode read faster) | 2 threads" >&2
    else
        echo "prefill 8 tok | decode 7 tok, TPOT 1 ms | $1 GB/s = $(awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", 100 * a / b }')% of $2 GB/s probe (best of 9 passes; $3% of the median pass, 50.00 GB/s) | 2 threads" >&2
    fi
else
    echo "- probe (2 threads): read 6$k.0 GB/s (best of 9 passes; min 50.0, median 55.0)"
    echo "| **step** | **$1** | - | 100 | 1.0 | 1.0 | 1 | | | | **$2** | **1.0** | - | |"
    echo "- at the probe's median pass (55.0 GB/s) the floors sum to $3 ms: the step is 1.0x that"
fi
SH
chmod +x "$W/fake"
small "$W/fake" "$W/fm" 3 >"$W/f.md" 2>"$W/f.err" || {
    cat "$W/f.err"
    fail "targets.sh with the stand-in exited $?"
}
cat >"$W/want.md" <<'MD'
| batch 1, q8_0: decode read, % of the probe (best pass; median pass) | >= 0% | 85.0% (95.0%) | 80.0–85.0% (91.0–97.0%) | 80.0% (52.00 of 65.00 GB/s), 85.0% (55.25 of 65.00 GB/s), 85.0% (55.25 of 65.00 GB/s) | yes |
| batch 1, bf16: decode read, % of the probe (best pass; median pass) | >= 0% | 93.0% (99.0%) | 91.0–95.0% (99.0–99.0%) | 91.0% (59.15 of 65.00 GB/s), 95.0% (61.75 of 65.00 GB/s), 93.0% (60.45 of 65.00 GB/s) | yes |
| batch 1, q4_0: decode read, % of the probe (best pass; median pass) | >= 1000000% | 71.0% (81.0%) | 70.0–72.0% (80.0–82.0%) | 70.0% (45.50 of 65.00 GB/s), 72.0% (46.80 of 65.00 GB/s), 71.0% (46.15 of 65.00 GB/s) | no |
| batch 1, q4_k_m: decode read, % of the probe (best pass; median pass) | >= 1000000% | 112.5% (112.5%) | 112.5–112.5% (112.5–112.5%) | 112.5% (90.00 of 80.00 GB/s), 112.5% (90.00 of 80.00 GB/s), 112.5% (90.00 of 80.00 GB/s) | no |
| batch 2, Q8_0, INT8 KV per head: step / floor (best pass; median pass) | <= 1000 | 1.70 (1.45) | 1.60–1.80 (1.40–1.50) | 32.000 ms (probe 61.0), 34.000 ms (probe 62.0), 36.000 ms (probe 63.0) | yes |
| batch 2, Q8_0, INT8 KV per token: step / floor (best pass; median pass) | <= 1000 | 1.20 (1.20) | 1.10–1.30 (1.10–1.30) | 24.000 ms (probe 61.0), 26.000 ms (probe 62.0), 22.000 ms (probe 63.0) | yes |
| batch 4, Q8_0, INT8 KV per head: step / floor (best pass; median pass) | <= 1000 | 2.00 (1.80) | 1.90–2.10 (1.70–1.90) | 40.000 ms (probe 61.0), 38.000 ms (probe 62.0), 42.000 ms (probe 63.0) | yes |
| batch 4, Q8_0, INT8 KV per token: step / floor (best pass; median pass) | <= 1000 | 1.50 (1.50) | 1.50–1.50 (1.43–1.50) | 30.000 ms (probe 61.0), 30.000 ms (probe 62.0), 30.000 ms (probe 63.0) | yes |
MD
grep '^| batch' "$W/f.md" >"$W/got.md" || true
diff "$W/want.md" "$W/got.md" || fail "the table from set figures"
# each round runs every configuration once, every other round in reverse
fwd="tiny-q8_0 tiny-bf16 tiny-q4_0 tiny-q4_k_m b2head b2token b4head b4token"
rev=$(echo "$fwd" | tr ' ' '\n' | tac | tr '\n' ' ')
[ "$(tr '\n' ' ' <"$W/calls")" = "$fwd $rev$fwd " ] || fail "the order of the calls: $(tr '\n' ' ' <"$W/calls")"
# the verdicts against targets between the figures: met at the best pass,
# at the median pass only, not at all
rm -f "$W"/n.* "$W/calls"
TARGET_READ=90 TARGET_READ_4BIT=85 TARGET_FLOOR=1.5 small "$W/fake" "$W/fm2" 3 >"$W/f2.md" 2>"$W/f2.err" ||
    fail "targets.sh with the stand-in, real targets"
got=$(awk -F'|' '/^\| batch/ { gsub(/^ | $/, "", $7); printf "%s;", $7 }' "$W/f2.md")
[ "$got" = "at the median pass;yes;no;yes;at the median pass;yes;no;yes;" ] || fail "verdicts: $got"

# bad arguments
for args in "" "$TK_CLI" "$TK_CLI $W/models 0" "$TK_CLI $W/models x" "$W/nope $W/models 1" "$TK_CLI $W/models 1 2"; do
    set +e
    # shellcheck disable=SC2086
    small $args >/dev/null 2>"$W/err.txt"
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "targets.sh $args exited $rc, expected 2"
    [ -s "$W/err.txt" ] || fail "targets.sh $args: no message"
done
# a model tokamak cannot load: the run's error, exit 1
mkdir -p "$W/bad"
cp "$W/models/"tiny-{bf16,q4_0,q4_k_m}.gguf "$W/bad/"
echo "not a model" >"$W/bad/tiny-q8_0.gguf"
set +e
small "$TK_CLI" "$W/bad" 1 >"$W/bad.md" 2>"$W/err.txt"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "a bad model: exited $rc, expected 1"
grep -q "targets: tokamak run -m $W/bad/tiny-q8_0.gguf failed" "$W/err.txt" || fail "a bad model: no message"
[ ! -s "$W/bad.md" ] || fail "a bad model: a table printed"
echo "ok: bench/targets.sh"
