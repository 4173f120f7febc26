#!/usr/bin/env bash
# tokamak synth: deterministic bytes, the documented preset shapes, --layers,
# the embedded vocabulary, HF sharding, and clear errors on bad options.
set -euo pipefail
: "${TK_CLI:?}" "${TK_SRC:?}"
TK_PYTHON="${TK_PYTHON:-/usr/bin/python3}"
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/synth.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
py() { "$TK_PYTHON" -c "import sys; sys.path.insert(0, '$TK_SRC/tests/ref'); import reference as R; $1"; }

# ---- determinism: same seed, same bytes; another seed, other bytes -------------
"$TK_CLI" synth --preset tiny --dtype q4_k_m --seed 3 -o "$W/a.gguf" 2>/dev/null
"$TK_CLI" synth --preset tiny --dtype q4_k_m --seed 3 -o "$W/b.gguf" 2>/dev/null
cmp -s "$W/a.gguf" "$W/b.gguf" || fail "same seed gave different GGUF bytes"
"$TK_CLI" synth --preset tiny --dtype q4_k_m --seed 4 -o "$W/b.gguf" 2>/dev/null
cmp -s "$W/a.gguf" "$W/b.gguf" && fail "seeds 3 and 4 gave the same bytes"
# rows are generated on every CPU the process may use: on one, the same bytes
ONE_CPU=$("$TK_PYTHON" -c 'import os; print(min(os.sched_getaffinity(0)))')
if [ "$("$TK_PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')" -ge 2 ] && command -v taskset >/dev/null; then
    taskset -c "$ONE_CPU" "$TK_CLI" synth --preset tiny --dtype q4_k_m --seed 3 -o "$W/one.gguf" 2>/dev/null
    cmp -s "$W/a.gguf" "$W/one.gguf" || fail "one CPU gave other GGUF bytes than all of them"
else
    echo "synth: one CPU (or no taskset): the one-CPU bytes not compared"
fi
# the strict parser accepts the mixed Q4_K/Q6_K file, with llama.cpp's Q4_K_M recipe
py "
g = R.GGUF('$W/a.gguf')
t = {n: g.tensors[n]['type_name'] for n in g.order}
assert g.kv['general.file_type'] == 15, g.kv['general.file_type']
assert t['blk.0.attn_q.weight'] == 'Q4_K' and t['blk.1.ffn_gate.weight'] == 'Q4_K', t
assert t['blk.0.attn_v.weight'] == 'Q6_K' and t['blk.1.ffn_down.weight'] == 'Q6_K', t
assert t['output.weight'] == 'Q6_K' and t['token_embd.weight'] == 'Q4_K', t
assert t['blk.0.attn_norm.weight'] == 'F32' and t['blk.0.attn_q_norm.weight'] == 'F32', t
" || fail "q4_k_m tensor types"
rm -f "$W"/*.gguf
"$TK_CLI" synth --preset tiny --dtype f16 --format hf --seed 5 -o "$W/h1" 2>/dev/null
if command -v taskset >/dev/null; then
    taskset -c "$ONE_CPU" "$TK_CLI" synth --preset tiny --dtype f16 --format hf --seed 5 -o "$W/h2" 2>/dev/null
else
    "$TK_CLI" synth --preset tiny --dtype f16 --format hf --seed 5 -o "$W/h2" 2>/dev/null
fi
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    cmp -s "$W/h1/$f" "$W/h2/$f" || fail "hf $f differs between identical runs (the second on one CPU)"
done
rm -rf "$W/h1" "$W/h2"

# ---- preset shapes (the published Qwen3 configs) ----------------------------------
expect() { # preset "layers embd heads kv_heads head_dim ff vocab tied" params
    local got
    got=$("$TK_CLI" synth --preset "$1" --dry-run | awk 'NR == 1 {print $6, $8, $10, $12, $14, $16, $18, $22, $24}')
    [ "$got" = "$2 $3" ] || fail "preset $1: got '$got', expected '$2 $3'"
}
expect tiny "2 256 4 2 128 768 151936 0" 79759104
expect qwen3-0.6b "28 1024 16 8 128 3072 151936 1" 596049920
expect qwen3-1.7b "28 2048 16 8 128 6144 151936 1" 1720574976
expect qwen3-4b "36 2560 32 8 128 9728 151936 1" 4022468096
expect qwen3-8b "36 4096 32 8 128 12288 151936 0" 8190735360
expect qwen3-14b "40 5120 40 8 128 17408 151936 0" 14768307200
expect qwen3-32b "64 5120 64 8 128 25600 151936 0" 32762123264
# the layout overrides: a Qwen2.5-0.5B shape from the tiny qwen2 preset
got=$("$TK_CLI" synth --preset tiny --arch qwen2 --layers 24 --embd 896 --heads 14 --kv-heads 2 --head-dim 64 \
    --ff 4864 --tied --dry-run)
[ "$(awk 'NR == 1 {print $6, $8, $10, $12, $14, $16, $22, $24}' <<<"$got")" = "24 896 14 2 64 4864 1 494032768" ] ||
    fail "layout overrides: $(head -n 1 <<<"$got")"
for line in "tensor blk.23.attn_q.weight f32 896 896" "tensor blk.23.attn_k.weight f32 896 128" \
    "tensor blk.0.attn_q.bias f32 896 0" "tensor blk.0.ffn_down.weight f32 4864 896"; do
    grep -qx "$line" <<<"$got" || fail "layout overrides: the plan lacks '$line'"
done
# tensor shapes of the plan (GGML order: ne0 = input features)
plan=$("$TK_CLI" synth --preset qwen3-8b --dtype bf16 --dry-run)
for line in "tensor token_embd.weight bf16 4096 151936" "tensor output.weight bf16 4096 151936" \
    "tensor blk.35.attn_q.weight bf16 4096 4096" "tensor blk.35.attn_k.weight bf16 4096 1024" \
    "tensor blk.35.attn_output.weight bf16 4096 4096" "tensor blk.0.ffn_down.weight bf16 12288 4096" \
    "tensor blk.0.attn_q_norm.weight f32 128 0"; do
    grep -qx "$line" <<<"$plan" || fail "qwen3-8b plan lacks '$line'"
done
grep -q "blk.36" <<<"$plan" && fail "qwen3-8b plan has a 37th layer"
plan=$("$TK_CLI" synth --preset qwen3-4b --dry-run)
grep -q "^tensor output.weight" <<<"$plan" && fail "qwen3-4b must be tied"

# ---- a real-shaped file: qwen3-0.6b, q8_0, 2 layers ---------------------------------
"$TK_CLI" synth --preset qwen3-0.6b --dtype q8_0 --layers 2 -o "$W/s.gguf" 2>/dev/null
py "
g = R.GGUF('$W/s.gguf')
kv, T = g.kv, g.tensors
assert kv['general.architecture'] == 'qwen3' and kv['general.alignment'] == 32 and g.alignment == 32
assert kv['general.file_type'] == 7
for k, v in {'block_count': 2, 'embedding_length': 1024, 'feed_forward_length': 3072, 'context_length': 40960,
             'attention.head_count': 16, 'attention.head_count_kv': 8, 'attention.key_length': 128,
             'attention.value_length': 128}.items():
    assert kv['qwen3.' + k] == v, (k, kv['qwen3.' + k])
assert kv['qwen3.rope.freq_base'] == 1e6 and abs(kv['qwen3.attention.layer_norm_rms_epsilon'] - 1e-6) < 1e-12
assert sorted({n.split('.')[1] for n in T if n.startswith('blk.')}) == ['0', '1']
assert 'output.weight' not in T, 'qwen3-0.6b is tied'
def shape(n, ne, ty):
    assert T[n]['ne'] == ne and T[n]['type_name'] == ty, (n, T[n])
shape('token_embd.weight', [1024, 151936], 'Q8_0')
shape('blk.1.attn_q.weight', [1024, 2048], 'Q8_0')
shape('blk.1.attn_k.weight', [1024, 1024], 'Q8_0')
shape('blk.1.attn_v.weight', [1024, 1024], 'Q8_0')
shape('blk.1.attn_output.weight', [2048, 1024], 'Q8_0')
shape('blk.1.ffn_gate.weight', [1024, 3072], 'Q8_0')
shape('blk.1.ffn_down.weight', [3072, 1024], 'Q8_0')
shape('blk.1.attn_k_norm.weight', [128], 'F32')
shape('output_norm.weight', [1024], 'F32')
# the vocabulary, as llama.cpp's converter lays it out
assert kv['tokenizer.ggml.model'] == 'gpt2' and kv['tokenizer.ggml.pre'] == 'qwen2'
toks, types = kv['tokenizer.ggml.tokens'], kv['tokenizer.ggml.token_type']
assert len(toks) == 151936 and len(types) == 151936 and len(kv['tokenizer.ggml.merges']) == 151387
assert toks[151645] == '<|im_end|>' and types[151645] == 3
assert toks[151667] == '<think>' and types[151667] == 4
assert toks[151700] == '[PAD151700]' and types[151700] == 5
assert toks[9707] == 'Hello' and types[9707] == 1, toks[9707]
assert kv['tokenizer.ggml.merges'][0] == '\u0120 \u0120', kv['tokenizer.ggml.merges'][0]
assert kv['tokenizer.ggml.eos_token_id'] == 151645 and kv['tokenizer.ggml.bos_token_id'] == 151643
assert kv['tokenizer.ggml.padding_token_id'] == 151643 and kv['tokenizer.ggml.add_bos_token'] is False
assert kv['tokenizer.chat_template'].startswith('{%- if tools %}')
# weights: seeded gaussian std 0.02, norms near 1
e = g.tensor('token_embd.weight', rows=list(range(0, 151936, 97)))
assert 0.018 < e.std() < 0.022 and abs(e.mean()) < 1e-3, e.std()
n = g.tensor('blk.0.attn_norm.weight')
assert 0.08 < n.std() < 0.12 and abs(n.mean() - 1) < 0.02, (n.mean(), n.std())
" || fail "qwen3-0.6b --layers 2 file"
"$TK_CLI" info -m "$W/s.gguf" --bw 20 >"$W/info.txt" 2>&1 || fail "tokamak info on the synthesized file: $(cat "$W/info.txt")"
grep -q "layers 2, embd 1024, heads 16, kv heads 8, head_dim 128, ff 3072, vocab 151936" "$W/info.txt" ||
    fail "tokamak info shows other shapes: $(cat "$W/info.txt")"
grep -q "parameters *187045376 " "$W/info.txt" || fail "tokamak info parameter count: $(cat "$W/info.txt")"
rm -f "$W/s.gguf"

# ---- HF sharding: --shard-mb gives shards + an index that covers them exactly ---------
"$TK_CLI" synth --preset tiny --arch llama --dtype bf16 --format hf --shard-mb 16 -o "$W/hf" 2>/dev/null
py "
import json, os, struct
d = '$W/hf'
idx = json.load(open(os.path.join(d, 'model.safetensors.index.json')))
cfg = json.load(open(os.path.join(d, 'config.json')))
assert cfg['model_type'] == 'llama' and cfg['rope_scaling']['rope_type'] == 'llama3' and cfg['head_dim'] == 64
shards = sorted(set(idx['weight_map'].values()))
assert len(shards) >= 3 and shards[0] == 'model-00001-of-%05d.safetensors' % len(shards), shards
total, names = 0, set()
for s in shards:
    b = open(os.path.join(d, s), 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    assert n % 8 == 0, 'header not padded to 8'
    h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None)
    spans = sorted(tuple(v['data_offsets']) for v in h.values())
    pos = 0
    for a, e in spans:
        assert a == pos, 'gap or overlap'
        pos = e
    assert 8 + n + pos == len(b), 'data does not end the file'
    for k, v in h.items():
        assert idx['weight_map'][k] == s
        n_el = 1
        for x in v['shape']:
            n_el *= x
        assert v['dtype'] == 'BF16' and n_el * 2 == v['data_offsets'][1] - v['data_offsets'][0]
        names.add(k)
    total += pos
assert names == set(idx['weight_map']) and idx['metadata']['total_size'] == total
assert 'lm_head.weight' in names and 'model.layers.1.self_attn.q_proj.weight' in names
assert not any('rope_freqs' in n for n in names)
" || fail "hf shards"
rm -rf "$W/hf"

# ---- errors: one clear line, usage errors exit 2 ------------------------------------
err() { # expected-exit pattern args...
    local code=$1 pat=$2
    shift 2
    local rc=0
    "$TK_CLI" synth "$@" >"$W/err.out" 2>&1 || rc=$?
    [ "$rc" = "$code" ] || fail "synth $*: exit $rc, expected $code ($(cat "$W/err.out"))"
    grep -q -- "$pat" "$W/err.out" || fail "synth $*: message lacks '$pat': $(cat "$W/err.out")"
}
err 2 "qwen3-0.6b" --preset qwen9 -o "$W/x.gguf"
err 2 "only for preset tiny" --preset qwen3-0.6b --arch llama -o "$W/x.gguf"
err 2 "expected qwen3, qwen2 or llama" --preset tiny --arch gpt2 -o "$W/x.gguf"
err 2 "q4_k_m" --preset tiny --dtype q5_0 -o "$W/x.gguf"
err 2 "f32, f16 or bf16" --preset tiny --dtype q8_0 --format hf -o "$W/x"
err 2 "-o" --preset tiny
err 2 "--layers" --preset tiny --layers 0 -o "$W/x.gguf"
err 1 "outside the model vocabulary" --preset tiny --vocab 1000 -o "$W/x.gguf"
err 2 "6 query heads are not a multiple of 4 KV heads" --preset tiny --heads 6 --kv-heads 4 -o "$W/x.gguf"
err 2 "4 query heads are not a multiple of 8 KV heads" --preset tiny --kv-heads 8 -o "$W/x.gguf"
err 2 "--head-dim 63 is odd" --preset tiny --head-dim 63 -o "$W/x.gguf"
err 2 "--embd" --preset tiny --embd 0 -o "$W/x.gguf"
err 2 "not a multiple of the q8_0 block" --preset tiny --dtype q8_0 --embd 100 -o "$W/x.gguf"
TOKAMAK_TOKENIZER_DIR="$W/none" err 2 "TOKAMAK_TOKENIZER_DIR" --preset tiny -o "$W/x.gguf"
[ ! -e "$W/x.gguf" ] || fail "a failed synth left a file behind"
echo "synth: all checks passed"
