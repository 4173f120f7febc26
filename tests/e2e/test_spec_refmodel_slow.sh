#!/usr/bin/env bash
# Speculative decoding on the trained reference model (docs/reference-model.md):
# `tokamak run` with --spec ngram prints the same tokens as --spec off, greedy
# and seeded, at batch 1 and 8, with F16 and per-token INT8 KV, on a held-out
# prompt and on that prompt twice over (so drafts are accepted), and
# drafts were verified. With --draft-model (the BF16 file of the same model,
# which shares the tokenizer) the greedy tokens are the same as --spec off too.
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}"
source "$TK_SRC/tests/e2e/refmodel.sh"
refmodel_setup
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
D=$(mktemp -d "$TK_TMP/spec_refmodel.XXXXXX")
trap 'rm -rf "$D"' EXIT
M=$(refmodel_gguf q8_0)
DM=$(refmodel_gguf bf16)
fails=0 drafted=0 drafted_dm=0
n=0
while IFS=$'\t' read -r title ids; do
    p=${ids//,/ }
    for prompt in "$p" "$p $p"; do
        for par in 1 8; do
            for kv in "--kv-type f16" "--kv-type int8 --kv-scale token"; do
                for smp in "" "--temp 0.8 --seed 3"; do
                    n=$((n + 1))
                    # shellcheck disable=SC2086
                    args=(-m "$M" --tokens "$prompt" --parallel $par -n 48 --ignore-eos --threads 2 --block-size 16 $kv $smp)
                    "$TK_CLI" run "${args[@]}" --spec off >"$D/off" 2>"$D/off.err"
                    "$TK_CLI" run "${args[@]}" --spec ngram >"$D/on" 2>"$D/on.err"
                    d=$(awk '/^speculation ngram:/{print $3}' "$D/on.err")
                    drafted=$((drafted + ${d:-0}))
                    if ! cmp -s "$D/off" "$D/on"; then
                        echo "FAIL: $title (${#prompt} chars) --parallel $par $kv $smp: outputs differ"
                        diff "$D/off" "$D/on" | head -5
                        fails=$((fails + 1))
                    fi
                    # Speculative sampling keeps the distribution, not the tokens: greedy only.
                    [ -z "$smp" ] || continue
                    "$TK_CLI" run "${args[@]}" --draft-model "$DM" >"$D/dm" 2>"$D/dm.err" || {
                        cat "$D/dm.err"
                        exit 1
                    }
                    d=$(awk '/^speculation draft:/{print $3}' "$D/dm.err")
                    drafted_dm=$((drafted_dm + ${d:-0}))
                    if ! cmp -s "$D/off" "$D/dm"; then
                        echo "FAIL: $title (${#prompt} chars) --parallel $par $kv --draft-model: outputs differ"
                        diff "$D/off" "$D/dm" | head -5
                        fails=$((fails + 1))
                    fi
                done
            done
        done
    done
done < <(head -1 "$RM_PROMPTS")
echo "$n configurations, $drafted n-gram and $drafted_dm draft-model tokens verified"
[ "$drafted" -gt 0 ] || { echo "FAIL: nothing was drafted"; exit 1; }
[ "$drafted_dm" -gt 0 ] || { echo "FAIL: the draft model drafted nothing"; exit 1; }
[ $fails = 0 ] || exit 1
echo "spec refmodel: ok"
