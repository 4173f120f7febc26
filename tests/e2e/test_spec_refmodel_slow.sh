#!/usr/bin/env bash
# Speculative decoding on the trained reference model (docs/reference-model.md):
# `tokamak run` with --spec ngram prints the same tokens as --spec off, greedy
# and seeded, at batch 1 and 8, with F16 and INT8 KV (per-head scales, whose
# blocks later tokens rescale; per-token INT8 runs in unit_test_spec*), on a held-out
# prompt and on that prompt twice over (so drafts are accepted), and
# drafts were verified. With --draft-model (the BF16 file of the same model,
# which shares the tokenizer) the greedy tokens are the same as --spec off too,
# and seeded tokens with --spec-fixed (INT8 per-head KV) are the same at batch
# 1 and 8.
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
            for kv in "--kv-type f16" "--kv-type int8"; do
                for smp in "" "--temp 0.8 --seed 3"; do
                    n=$((n + 1))
                    # shellcheck disable=SC2086
                    args=(-m "$M" --tokens "$prompt" --parallel $par -n 48 --ignore-eos --threads 2 --block-size 16 $kv $smp)
                    # Lines come out as requests produce them; a request's own lines keep their order.
                    "$TK_CLI" run "${args[@]}" --spec off 2>"$D/off.err" | sort -s -t']' -k1,1 >"$D/off"
                    "$TK_CLI" run "${args[@]}" --spec ngram 2>"$D/on.err" | sort -s -t']' -k1,1 >"$D/on"
                    d=$(awk '/^speculation ngram:/{print $3}' "$D/on.err")
                    drafted=$((drafted + ${d:-0}))
                    if ! cmp -s "$D/off" "$D/on"; then
                        echo "FAIL: $title (${#prompt} chars) --parallel $par $kv $smp: outputs differ"
                        diff "$D/off" "$D/on" | head -5
                        fails=$((fails + 1))
                    fi
                    # Speculative sampling keeps the distribution, not the tokens of a run without
                    # drafts; with every draft verified (--spec-fixed) a seeded run's tokens do not
                    # depend on the batch.
                    if [ -n "$smp" ] && [ "$kv" = "--kv-type int8" ]; then
                        key=${#prompt}
                        # request 0 alone, and among 8 (the copies run beside it)
                        "$TK_CLI" run "${args[@]}" --draft-model "$DM" --spec-fixed 2>"$D/fx.err" |
                            grep '^\[0\]' >"$D/fixed.$par.$key" || true
                        [ -s "$D/fixed.$par.$key" ] || { cat "$D/fx.err"; exit 1; }
                        if [ "$par" = 8 ] && ! cmp -s "$D/fixed.1.$key" "$D/fixed.8.$key"; then
                            echo "FAIL: $title (${#prompt} chars) $kv $smp --spec-fixed: batch 1 and 8 differ"
                            diff "$D/fixed.1.$key" "$D/fixed.8.$key" | head -5
                            fails=$((fails + 1))
                        fi
                    fi
                    [ -z "$smp" ] || continue
                    "$TK_CLI" run "${args[@]}" --draft-model "$DM" >"$D/dm.raw" 2>"$D/dm.err" || {
                        cat "$D/dm.err"
                        exit 1
                    }
                    sort -s -t']' -k1,1 "$D/dm.raw" >"$D/dm"
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
