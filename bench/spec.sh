#!/usr/bin/env bash
# Speculative decoding (n-gram prompt lookup, a draft model) on the trained
# reference model.
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
#   (c) the draft model (--draft-model; DRAFT, default MODEL quantized to
#       q4_0 throughout, output layer included) on the free text at batch 1,
#       greedy and at temperature 1, with the draft's TPOT run alone over
#       the target's (its cost per token).
#   (d) the same at batch 16 and 32 (verses 1-16, and 1-16 twice), greedy
#       and at temperature 1.
# Every case runs RUNS times (default 5), the two configurations alternating,
# and reports medians; extra arguments go to every `tokamak run`.
# Environment: RUNS, THREADS (default 0: every core), SPEC_K (default 8),
# DRAFT (a draft model file), CASES (default "a b c d").
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

cases=${CASES:-a b c d}
want() { [[ " $cases " == *" $1 "* ]]; }
draft=${DRAFT:-}
if { want c || want d; } && [ -z "$draft" ]; then
  draft="$dir/draft-q4_0.gguf"
  "$bin" quantize -i "$model" -o "$draft" --type q4_0 --keep none -q >/dev/null 2>"$dir/err" ||
    { cat "$dir/err" >&2; exit 1; }
fi
for ((i = 0; i < 2; i++)); do cat "$dir/free16.txt"; done >"$dir/free32.txt"

# one SPEC ARGS...: prints "tpot tok_s drafted accepted draft_share" of one run
# (SPEC draft: the draft model)
one() {
  local spec=$1
  shift
  local extra=()
  [ "$spec" != draft ] || extra=(--draft-model "$draft")
  "$bin" run -m "$model" --threads "${THREADS:-0}" --spec "$spec" "${extra[@]}" --spec-k "${SPEC_K:-8}" -q "$@" \
    2>"$dir/err" >/dev/null || { cat "$dir/err" >&2; exit 1; }
  awk '/^requests /{for(i=1;i<=NF;i++){if($i=="TPOT")t=$(i+1); if($i=="output"){s=$(i+3); gsub(/\(/,"",s)}}}
       /^speculation (ngram|draft):/{d=$3; a=$5}
       /^draft model:/{sh=$6; gsub(/%/,"",sh)}
       END{printf "%s %s %s %s %s\n", t, s, d+0, a+0, sh+0}' "$dir/err"
}

median() { sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# bench NAME SPEC ARGS...: RUNS alternating runs of off and SPEC; a table row
bench() {
  local name=$1 spec=$2
  shift 2
  : >"$dir/off" && : >"$dir/on"
  for ((r = 0; r < runs; r++)); do
    one off "$@" >>"$dir/off"
    one "$spec" "$@" >>"$dir/on"
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
if want a || want b; then
  echo "| case | TPOT off (ms) | TPOT ngram (ms) | TPOT off/ngram | tok/s off | tok/s ngram | tok/s ngram/off | drafted (all runs) | accepted |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
fi
! want a || bench "(a) copy, batch 1, greedy" ngram --tokens "$copy" --parallel 1 -n 300 --ignore-eos "$@"
! want b || bench "(b) free text, batch 1, temp 1" ngram --prompts "$dir/free1.txt" -n 200 --ignore-eos --temp 1 --seed 7 "$@"
! want b || bench "(b) free text, batch 16, temp 1" ngram --prompts "$dir/free16.txt" -n 200 --ignore-eos --temp 1 --seed 7 "$@"
if want c || want d; then
  echo
  echo "draft model: $draft"
  # The draft's cost per token: its TPOT run alone over the target's, batch 1, greedy.
  : >"$dir/tt" && : >"$dir/td"
  for ((r = 0; r < runs; r++)); do
    one off --prompts "$dir/free1.txt" -n 200 --ignore-eos "$@" | cut -d' ' -f1 >>"$dir/tt"
    m=$model model=$draft
    one off --prompts "$dir/free1.txt" -n 200 --ignore-eos "$@" | cut -d' ' -f1 >>"$dir/td"
    model=$m
  done
  awk -v t="$(median <"$dir/tt")" -v d="$(median <"$dir/td")" \
    'BEGIN{printf "draft alone: TPOT %.2f ms, target alone %.2f ms: the draft costs %.2fx the target per token\n\n", d, t, d/t}'
  echo "| case | TPOT off (ms) | TPOT draft (ms) | TPOT off/draft | tok/s off | tok/s draft | tok/s draft/off | drafted (all runs) | accepted |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
fi
! want c || bench "(c) free text, batch 1, greedy" draft --prompts "$dir/free1.txt" -n 200 --ignore-eos "$@"
! want c || bench "(c) free text, batch 1, temp 1" draft --prompts "$dir/free1.txt" -n 200 --ignore-eos --temp 1 --seed 7 "$@"
! want d || bench "(d) free text, batch 16, greedy" draft --prompts "$dir/free16.txt" -n 300 --ignore-eos "$@"
! want d || bench "(d) free text, batch 32, greedy" draft --prompts "$dir/free32.txt" -n 300 --ignore-eos "$@"
! want d || bench "(d) free text, batch 16, temp 1" draft --prompts "$dir/free16.txt" -n 100 --ignore-eos --temp 1 --seed 7 "$@"
! want d || bench "(d) free text, batch 32, temp 1" draft --prompts "$dir/free32.txt" -n 100 --ignore-eos --temp 1 --seed 7 "$@"
