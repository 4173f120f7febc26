# Shared by tests/ref/test_*.sh (sourced; not a test itself).
# Env from CTest: TK_CLI, TK_SRC, TK_TMP, TK_PYTHON, TK_SANITIZE.
set -euo pipefail
: "${TK_CLI:?TK_CLI must point at the tokamak binary}"
: "${TK_SRC:?TK_SRC must point at the repository root}"
TK_PYTHON="${TK_PYTHON:-/usr/bin/python3}"
TK_TMP="${TK_TMP:-/tmp}"
REF="$TK_SRC/tests/ref/reference.py"
# <|im_start|>user\nHello, world! (Qwen3 ids)
PROMPT="151644,872,198,9707,11,1879,0"
N=64
KV="--kv-type f32" # isolate the weights: the KV cache type has its own tests
case "${TK_SANITIZE:-OFF}" in
ON | on | 1 | TRUE | true | YES | yes) SAN=1 N=16 ;;
*) SAN=0 ;;
esac
mkdir -p "$TK_TMP"
WORK=$(mktemp -d "$TK_TMP/ref.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILS=0

# tk_run MODEL DUMP: greedy, ignoring EOS, logits dumped (prompt's last row + one per step);
# $KV and $RUN_EXTRA (word lists) are added to the run's flags.
tk_run() {
    # shellcheck disable=SC2086
    "$TK_CLI" run -m "$1" --tokens "$PROMPT" -n "$N" --temp 0 $KV ${RUN_EXTRA:-} --no-probe --ignore-eos --dump-logits "$2" >"$WORK/run.out" 2>"$WORK/run.err" || {
        echo "FAIL: tokamak run -m $1 exited $?"
        cat "$WORK/run.err"
        return 1
    }
}

# rows_ok DUMP LABEL: the dump holds N rows of 151936 floats (the last prompt
# position, then one per step); else counts a failure.
rows_ok() {
    local rows=$(($(stat -c %s "$1") / (151936 * 4)))
    [ "$rows" -eq "$N" ] && return 0
    echo "FAIL: $2: dump has $rows rows of 151936 floats, expected $N (last prompt position + $((N - 1)) steps)"
    FAILS=$((FAILS + 1))
    return 1
}

# run_compare MODEL DUMP LABEL TOL [reference flags...]: tk_run, then the
# dump's rows and the reference's comparison; each failure counted.
run_compare() {
    local m=$1 d=$2 label=$3 tol=$4
    shift 4
    if ! tk_run "$m" "$d"; then
        FAILS=$((FAILS + 1))
    elif rows_ok "$d" "$label" && ! "$TK_PYTHON" "$REF" compare "$m" --tokens "$PROMPT" --dump "$d" --tol "$tol" "$@"; then
        echo "FAIL: $label (tolerance $tol)"
        FAILS=$((FAILS + 1))
    fi
}

# check_ref ARCH DTYPE TOL [reference flags...]: synthesize, run tokamak, compare with the reference.
check_ref() {
    local arch=$1 dtype=$2 tol=$3
    shift 3
    local m="$WORK/$arch-$dtype.gguf" d="$WORK/$arch-$dtype.f32"
    # --min-distinct guards against a degenerate synthetic model over the
    # 64-token Release run; the sanitizer run's 16 tokens are too few to judge
    # the model by (tiny qwen2 gives 3 distinct there), and the Release run of
    # the same test keeps the check.
    if [ "$SAN" = 1 ]; then
        local args=() skip=0
        for a in "$@"; do
            if [ $skip = 1 ]; then skip=0; continue; fi
            if [ "$a" = --min-distinct ]; then skip=1; continue; fi
            args+=("$a")
        done
        set -- "${args[@]}"
    fi
    if ! "$TK_CLI" synth --preset tiny --arch "$arch" --dtype "$dtype" --seed 7 -o "$m" 2>"$WORK/synth.err"; then
        echo "FAIL: synth $arch $dtype"
        cat "$WORK/synth.err"
        FAILS=$((FAILS + 1))
        return 0
    fi
    run_compare "$m" "$d" "$arch $dtype" "$tol" "$@"
    rm -f "$m" "$d"
}

finish() {
    if [ "$FAILS" -ne 0 ]; then
        echo "$FAILS check(s) failed"
        exit 1
    fi
    echo "all checks passed"
}
