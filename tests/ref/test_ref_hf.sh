#!/usr/bin/env bash
# The same weights through --format hf (safetensors, HF row order, config.json)
# and GGUF (llama q/k rows permuted, rope_freqs.weight) give bit-identical
# logits (cmp on the dump files) for qwen3 and llama, including a sharded HF
# checkpoint (--shard-mb, so the index loader runs). Also: the reference agrees
# with the GGUF run, so both are right, not merely equal.
source "$(dirname "$0")/common.sh"
N=16
hf_vs_gguf() { # arch dtype "hf-only flags" [synth flags...]
    # shellcheck disable=SC2086 # hf_flags is a word list
    local arch=$1 dtype=$2 hf_flags=$3
    shift 3
    local g="$WORK/$arch.gguf" h="$WORK/$arch-hf"
    "$TK_CLI" synth --preset tiny --arch "$arch" --dtype "$dtype" --seed 11 "$@" -o "$g" 2>"$WORK/synth.err" &&
        "$TK_CLI" synth --preset tiny --arch "$arch" --dtype "$dtype" --seed 11 "$@" $hf_flags --format hf -o "$h" \
            2>>"$WORK/synth.err" || {
        echo "FAIL: synth $arch $dtype $* $hf_flags"
        cat "$WORK/synth.err"
        FAILS=$((FAILS + 1))
        return 0
    }
    [ -z "$hf_flags" ] || [ -f "$h/model.safetensors.index.json" ] || {
        echo "FAIL: $hf_flags wrote no index"
        FAILS=$((FAILS + 1))
    }
    if tk_run "$g" "$WORK/g.f32" && tk_run "$h" "$WORK/h.f32"; then
        if cmp -s "$WORK/g.f32" "$WORK/h.f32"; then
            echo "ok: $arch $dtype $* $hf_flags: GGUF and HF logits are bit-identical ($(stat -c %s "$WORK/g.f32") bytes)"
        else
            echo "FAIL: $arch $dtype $* $hf_flags: GGUF and HF logits differ"
            cmp "$WORK/g.f32" "$WORK/h.f32" | head -1
            FAILS=$((FAILS + 1))
        fi
        "$TK_PYTHON" "$REF" compare "$g" --tokens "$PROMPT" --dump "$WORK/g.f32" --tol 1e-4 --top1 ||
            FAILS=$((FAILS + 1))
    else
        FAILS=$((FAILS + 1))
    fi
    rm -rf "$g" "$h" "$WORK/g.f32" "$WORK/h.f32"
}
hf_vs_gguf qwen3 bf16 ""
hf_vs_gguf llama f32 ""
hf_vs_gguf llama bf16 "--shard-mb 40"
hf_vs_gguf qwen3 f16 "--shard-mb 20" --tied
finish
