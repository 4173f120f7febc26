#!/usr/bin/env bash
# Speculative decoding (n-gram prompt lookup) on the trained reference model.
#   bench/spec.sh TOKAMAK_BINARY MODEL [run options]
# MODEL: the reference model (docs/reference-model.md), e.g.
# build/refmodel/qwen3-kjv-q8_0.gguf; its held-out text is Genesis 13, taken
# from the `bible` program of Debian's bible-kjv (scripts/deps.sh) in the
# training format (a title line, then one numbered verse a line).
#   (a) copy: the prompt holds the first 400 tokens of the passage and then
#       its first 20 tokens again; greedy, 300 tokens at batch 1 (the model
#       copies). Median TPOT with --spec ngram and --spec off.
#   (b) free text: verses 1.. of the passage as prompts (one each), sampled
#       at temperature 1 (acceptance is low); 200 tokens at batch 1 and 16.
#       Output tokens/s with and without speculation.
# Every case runs RUNS times (default 5), the two configurations alternating,
# and reports medians; extra arguments go to every `tokamak run`.
# Environment: RUNS, THREADS (default 0: every core), SPEC_K (default 8).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TOKAMAK_BINARY MODEL [run options]" >&2
  exit 2
fi
bin=$1
model=$2
shift 2
[ -x "$bin" ] || { echo "spec.sh: $bin is not an executable" >&2; exit 2; }
[ -f "$model" ] || { echo "spec.sh: model $model does not exist" >&2; exit 2; }
command -v bible >/dev/null || { echo "spec.sh: no bible program (apt-get install bible-kjv)" >&2; exit 2; }
runs=${RUNS:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

verses() { bible -f "Gen13:1-18" | sed -E 's/^[A-Za-z0-9]+:([0-9]+) /\1 /'; }
{ echo "Genesis 13"; verses; } >"$dir/passage.txt"
read -r -a ids <<<"$("$bin" tokenize -m "$model" "$dir/passage.txt")"
[ "${#ids[@]}" -ge 420 ] || { echo "spec.sh: the passage has only ${#ids[@]} tokens" >&2; exit 1; }
copy="${ids[*]:0:400} ${ids[*]:0:20}"
verses | head -16 >"$dir/free16.txt"
head -1 "$dir/free16.txt" >"$dir/free1.txt"

# one CASE SPEC ARGS...: prints "tpot tok_s drafted accepted" of one run
one() {
  local spec=$1
  shift
  "$bin" run -m "$model" --threads "${THREADS:-0}" --spec "$spec" --spec-k "${SPEC_K:-8}" -q "$@" \
    2>"$dir/err" >/dev/null || { cat "$dir/err" >&2; exit 1; }
  awk '/^requests /{for(i=1;i<=NF;i++){if($i=="TPOT")t=$(i+1); if($i=="output"){s=$(i+3); gsub(/\(/,"",s)}}}
       /^speculation ngram:/{d=$3; a=$5}
       END{printf "%s %s %s %s\n", t, s, d+0, a+0}' "$dir/err"
}

median() { sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# bench NAME ARGS...: RUNS alternating runs of off and ngram; a table row
bench() {
  local name=$1
  shift
  : >"$dir/off" && : >"$dir/on"
  for ((r = 0; r < runs; r++)); do
    one off "$@" >>"$dir/off"
    one ngram "$@" >>"$dir/on"
  done
  local t0 t1 s0 s1 d a
  t0=$(cut -d' ' -f1 "$dir/off" | median)
  t1=$(cut -d' ' -f1 "$dir/on" | median)
  s0=$(cut -d' ' -f2 "$dir/off" | median)
  s1=$(cut -d' ' -f2 "$dir/on" | median)
  d=$(awk '{d+=$3} END{print d}' "$dir/on")
  a=$(awk '{a+=$4} END{print a}' "$dir/on")
  awk -v n="$name" -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" -v d="$d" -v a="$a" 'BEGIN{
    printf "| %s | %.2f | %.2f | %.2fx | %.1f | %.1f | %.3f | %d | %s |\n", n, t0, t1, t0/t1, s0, s1, s1/s0, d,
      d ? sprintf("%.1f%%", 100*a/d) : "-" }'
}

echo "model: $model, $runs runs each (medians), threads ${THREADS:-0}, spec-k ${SPEC_K:-8}"
echo
echo "| case | TPOT off (ms) | TPOT ngram (ms) | TPOT off/ngram | tok/s off | tok/s ngram | tok/s ngram/off | drafted (all runs) | accepted |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
bench "(a) copy, batch 1, greedy" --tokens "$copy" --parallel 1 -n 300 --ignore-eos "$@"
bench "(b) free text, batch 1, temp 1" --prompts "$dir/free1.txt" -n 200 --ignore-eos --temp 1 --seed 7 "$@"
bench "(b) free text, batch 16, temp 1" --prompts "$dir/free16.txt" -n 200 --ignore-eos --temp 1 --seed 7 "$@"
