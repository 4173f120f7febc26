#!/usr/bin/env bash
# Files `tokamak quantize` writes, for every type: the numpy GGUF reader
# (tests/ref/reference.py, GGML's block definitions written out independently)
# dequantizes every tensor to the same floats tokamak reads back (its f32
# re-export), the model runs, the same input gives the same bytes twice, and a
# round-to-nearest q4_0 file has the logits of synth's q4_0 model.
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}"
TK_PYTHON="${TK_PYTHON:-/usr/bin/python3}"
"$TK_PYTHON" -c "import numpy" 2>/dev/null || { echo "SKIP: no numpy for $TK_PYTHON"; exit 77; }
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/quantize_layout.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
S=(--preset tiny --layers 4 --seed 5)
"$TK_CLI" synth "${S[@]}" --dtype f32 -o "$W/f32.gguf" 2>/dev/null
# layout NAME FILE WANT_TYPES: numpy's reading of FILE equals tokamak's; the GGML type ids in WANT_TYPES occur
layout() {
    "$TK_CLI" quantize -q -i "$2" -o "$W/back.gguf" --type f32 --keep none 2>/dev/null || fail "$1: read back"
    "$TK_PYTHON" - "$TK_SRC/tests/ref" "$2" "$W/back.gguf" "$1" "$3" <<'PY' || fail "$1: layout"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import reference as R
q, f, name = R.GGUF(sys.argv[2]), R.GGUF(sys.argv[3]), sys.argv[4]
types = {}
for t in q.tensors:
    a, b = q.tensor(t), f.tensor(t)
    if a.shape != b.shape or not np.array_equal(a.astype(np.float32), b.astype(np.float32)):
        sys.exit("%s: %s differs from tokamak's reading (max %g)" % (name, t, np.abs(a - b).max()))
    types[q.tensors[t]["type"]] = types.get(q.tensors[t]["type"], 0) + 1
for w in map(int, sys.argv[5].split(",")):
    if w not in types:
        sys.exit("%s: no tensor of GGML type %d (types %s)" % (name, w, sorted(types.items())))
print("%s: %d tensors, GGML types %s, numpy reading = tokamak's" % (name, len(q.tensors), sorted(types.items())))
PY
    "$TK_CLI" run -m "$2" --tokens 1,2,3 -n 4 --temp 0 --no-probe --ignore-eos >/dev/null 2>"$W/err" ||
        { cat "$W/err"; fail "$1: run"; }
}
for tt in q8_0:8 q6_k:14 q4_k:12 q4_0:2; do
    t=${tt%%:*}
    "$TK_CLI" quantize -q -i "$W/f32.gguf" -o "$W/$t.gguf" --type $t --keep none 2>"$W/err" || { cat "$W/err"; fail "quantize $t"; }
    layout "$t" "$W/$t.gguf" "${tt#*:}"
done
# the defaults: q4_k_m mixes Q4_K and Q6_K, the embedding stays Q8_0; same input, same bytes
"$TK_CLI" quantize -q -i "$W/f32.gguf" -o "$W/m.gguf" --type q4_k_m 2>/dev/null || fail "quantize q4_k_m"
"$TK_CLI" quantize -q -i "$W/f32.gguf" -o "$W/m2.gguf" --type q4_k_m 2>/dev/null || fail "quantize q4_k_m again"
cmp -s "$W/m.gguf" "$W/m2.gguf" || fail "q4_k_m: two runs wrote different bytes"
layout q4_k_m "$W/m.gguf" 8,12,14
"$TK_CLI" synth "${S[@]}" --dtype q4_0 -o "$W/synth-q4_0.gguf" 2>/dev/null
"$TK_CLI" quantize -q -i "$W/f32.gguf" -o "$W/rtn-q4_0.gguf" --type q4_0 --keep none 2>/dev/null
P=(--tokens 151644,872,198,9707 -n 6 --temp 0 --kv-type f32 --no-probe --ignore-eos)
"$TK_CLI" run -m "$W/synth-q4_0.gguf" "${P[@]}" --dump-logits "$W/a.f32" >/dev/null 2>&1
"$TK_CLI" run -m "$W/rtn-q4_0.gguf" "${P[@]}" --dump-logits "$W/b.f32" >/dev/null 2>&1
cmp -s "$W/a.f32" "$W/b.f32" || fail "quantize --type q4_0 --keep none: logits differ from synth --dtype q4_0"
echo "quantize layout: ok"
