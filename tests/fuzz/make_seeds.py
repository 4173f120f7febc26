#!/usr/bin/env python3
"""Writes the small valid seed files for the fuzzers (run from anywhere; stdlib only).

seeds/fuzz_gguf/*.gguf and seeds/fuzz_safetensors/*.safetensors, each < 4 KB;
seeds/fuzz_tokenizer (tokenizer.json, then after a NUL byte tokenizer_config.json),
seeds/fuzz_tokenizer_gguf (GGUF vocabularies) and seeds/fuzz_model ('H' + config.json
for the fuzzer's tiny llama directory, or a tiny GGUF model), each < 16 KB.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
       U64: "<Q", I64: "<q", F64: "<d"}
# tensor types: id -> (block elems, block bytes)
TT = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 12: (256, 144), 14: (256, 210)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(gval(et, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off, datas = 0, []
    for name, ttype, ne in tensors:
        be, bb = TT[ttype]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // be * bb
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ttype, off)
        datas.append(bytes((i * 37 + len(name)) & 0xFF for i in range(nbytes)))
        off += (nbytes + align - 1) // align * align
    out += b"\0" * (-len(out) % align)
    for d in datas:
        out += d + b"\0" * (-len(d) % align)
    return out


def safetensors(tensors, meta=None):
    hdr, off, data = {}, 0, b""
    if meta:
        hdr["__metadata__"] = meta
    size = {"F32": 4, "F16": 2, "BF16": 2}
    for name, dt, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        nb = n * size[dt]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        data += bytes((i * 11 + 3) & 0xFF for i in range(nb))
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def write(sub, name, blob, limit=4096):
    assert len(blob) < limit, (name, len(blob))
    d = os.path.join(HERE, "seeds", sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


def main():
    base_kvs = [("general.architecture", STR, "llama"), ("llama.block_count", U32, 2),
                ("tokenizer.ggml.tokens", ARR, (STR, ["a", "", "\u00e9\u4e2d"]))]
    write("fuzz_gguf", "small.gguf", gguf(base_kvs, [("a", 0, [8, 2]), ("b", 8, [32])]))
    every = [("k.u8", U8, 255), ("k.i8", I8, -1), ("k.u16", U16, 65535), ("k.i16", I16, -2),
             ("k.u32", U32, 7), ("k.i32", I32, -7), ("k.f32", F32, 0.5), ("k.bool", BOOL, 1),
             ("k.str", STR, "x\x01y"), ("k.u64", U64, 2**63), ("k.i64", I64, -2**40), ("k.f64", F64, 1e-9),
             ("a.f32", ARR, (F32, [1.0, 2.0])), ("a.i64", ARR, (I64, [-1, 5])), ("a.bool", ARR, (BOOL, [0, 1])),
             ("a.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["s"])]))]
    write("fuzz_gguf", "every_kv.gguf", gguf(every, [("t.f16", 1, [4, 2]), ("t.bf16", 30, [2, 2, 2])]))
    write("fuzz_gguf", "quants_align64.gguf",
          gguf([("general.alignment", U32, 64)],
               [("q4_0", 2, [32]), ("q4_k", 12, [256]), ("q6_k", 14, [256]), ("q8_0", 8, [32, 1, 1, 2])], align=64))
    write("fuzz_gguf", "v2_no_tensors.gguf", gguf([("general.name", STR, "v2")], [], version=2))
    write("fuzz_safetensors", "small.safetensors",
          safetensors([("w", "F32", [2, 3]), ("b", "BF16", [3]), ("h", "F16", [1, 1, 2, 1])], {"format": "pt"}))
    write("fuzz_safetensors", "scalar_empty.safetensors",
          safetensors([("s", "F32", []), ("e", "F16", [0, 5]), ("model.layers.0.w", "F16", [4, 4])]))
    write("fuzz_safetensors", "empty.safetensors", safetensors([]))


# ---- tokenizers --------------------------------------------------------------

def byte_chars():
    """GPT-2's bytes_to_unicode: the character standing for each byte."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def tokenizer_json(regex, added, nfc=False, ignore_merges=False, string_merges=False):
    """regex None: ByteLevel's own (GPT-2) regex."""
    """A byte-level BPE: the 256 byte characters, a few merged words, then added tokens."""
    bc = byte_chars()
    vocab = {bc[b]: b for b in range(256)}
    words = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("1", "2"), ("12", "3"), ("l", "l"), ("e", "ll")]
    merges = []
    for a, b in words:
        vocab.setdefault(a + b, len(vocab))
        merges.append(a + " " + b if string_merges else [a, b])
    toks = [{"id": len(vocab) + i, "content": c, "special": sp, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False} for i, (c, sp) in enumerate(added)]
    pre = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": regex is None}]
    if regex is not None:
        pre.insert(0, {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False})
    doc = {"version": "1.0", "added_tokens": toks, "normalizer": {"type": "NFC"} if nfc else None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
           "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}
    return json.dumps(doc, separators=(",", ":")).encode()


def tokenizer_gguf_bpe():
    bc = byte_chars()
    toks = [bc[b] for b in range(256)] + ["\u0120t", "he", "\u0120the", "<|endoftext|>", "<|im_start|>",
                                          "<|im_end|>", "<think>"]
    types = [1] * (len(toks) - 4) + [3, 3, 3, 4]
    kvs = [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "qwen2"),
           ("tokenizer.ggml.tokens", ARR, (STR, toks)), ("tokenizer.ggml.token_type", ARR, (I32, types)),
           ("tokenizer.ggml.merges", ARR, (STR, ["\u0120 t", "h e", "\u0120t he"])),
           ("tokenizer.ggml.eos_token_id", U32, len(toks) - 2),
           ("tokenizer.chat_template", STR, "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}")]
    return gguf(kvs, [])


def tokenizer_gguf_spm():
    words = ["\u2581", "h", "e", "l", "o", "\u2581h", "ll", "\u2581he", "llo", "\u2581hello"]
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0] * 259 + [-10.0] * 5 + [-1.0, -2.0, -3.0, -4.0, -5.0]
    kvs = [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, toks)),
           ("tokenizer.ggml.scores", ARR, (F32, scores)), ("tokenizer.ggml.token_type", ARR, (I32, types)),
           ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
           ("tokenizer.ggml.unknown_token_id", U32, 0)]
    return gguf(kvs, [])


# ---- models ---------------------------------------------------------------------

def tiny_model_gguf(arch, tied, extra_kvs=()):
    """A 1-layer model of width 16 (2 heads of 8, 1 KV head, FFN 32, vocab 32), f16 weights."""
    e, ff, v, hd = 16, 32, 32, 8
    kvs = [("general.architecture", STR, arch), (arch + ".block_count", U32, 1),
           (arch + ".context_length", U32, 64), (arch + ".embedding_length", U32, e),
           (arch + ".feed_forward_length", U32, ff), (arch + ".attention.head_count", U32, 2),
           (arch + ".attention.head_count_kv", U32, 1), (arch + ".attention.key_length", U32, hd),
           (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-6), (arch + ".rope.freq_base", F32, 10000.0)]
    kvs += list(extra_kvs)
    t = [("token_embd.weight", 1, [e, v]), ("output_norm.weight", 0, [e]),
         ("blk.0.attn_norm.weight", 0, [e]), ("blk.0.attn_q.weight", 1, [e, 2 * hd]),
         ("blk.0.attn_k.weight", 1, [e, hd]), ("blk.0.attn_v.weight", 1, [e, hd]),
         ("blk.0.attn_output.weight", 1, [2 * hd, e]), ("blk.0.ffn_norm.weight", 0, [e]),
         ("blk.0.ffn_gate.weight", 1, [e, ff]), ("blk.0.ffn_up.weight", 1, [e, ff]),
         ("blk.0.ffn_down.weight", 1, [ff, e])]
    if arch == "qwen2":
        t += [("blk.0.attn_q.bias", 0, [2 * hd]), ("blk.0.attn_k.bias", 0, [hd]), ("blk.0.attn_v.bias", 0, [hd])]
    if arch == "qwen3":
        t += [("blk.0.attn_q_norm.weight", 0, [hd]), ("blk.0.attn_k_norm.weight", 0, [hd])]
    if not tied:
        t.append(("output.weight", 1, [e, v]))
    return gguf(kvs, t)


def tiny_model_config(**over):
    """config.json of the tiny llama whose weights fuzz_model writes itself."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
           "intermediate_size": 32, "vocab_size": 32, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
           "bos_token_id": 1, "eos_token_id": [2, 3], "rope_scaling": None}
    cfg.update(over)
    return b"H" + json.dumps(cfg, separators=(",", ":")).encode()


def more_seeds():
    big = 16384
    chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n'}}{% endfor %}")
    qwen_cfg = json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
                           "chat_template": chatml + "<think>"}).encode()
    write("fuzz_tokenizer", "qwen2_nfc_chatml.bin",
          tokenizer_json(QWEN2_RE, [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                                    ("<think>", False), ("</think>", False)], nfc=True) + b"\0" + qwen_cfg, big)
    llama_cfg = json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"},
                            "chat_template": "<|start_header_id|>{{ role }}<|end_header_id|>"}).encode()
    write("fuzz_tokenizer", "llama3.bin",
          tokenizer_json(LLAMA3_RE, [("<|begin_of_text|>", True), ("<|start_header_id|>", True),
                                     ("<|end_header_id|>", True), ("<|eot_id|>", True)],
                         ignore_merges=True, string_merges=True) + b"\0" + llama_cfg, big)
    write("fuzz_tokenizer", "gpt2_no_config.json", tokenizer_json(None, [("<|endoftext|>", True)]), big)
    write("fuzz_tokenizer_gguf", "bpe_qwen2.gguf", tokenizer_gguf_bpe(), big)
    write("fuzz_tokenizer_gguf", "spm.gguf", tokenizer_gguf_spm(), big)
    write("fuzz_model", "hf_llama.json", tiny_model_config(), big)
    write("fuzz_model", "hf_llama3_rope.json",
          tiny_model_config(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), big)
    write("fuzz_model", "hf_linear_rope.json", tiny_model_config(rope_scaling={"type": "linear", "factor": 2}), big)
    write("fuzz_model", "llama.gguf", tiny_model_gguf("llama", False), big)
    write("fuzz_model", "qwen2_tied.gguf", tiny_model_gguf("qwen2", True), big)
    write("fuzz_model", "qwen3_linear.gguf",
          tiny_model_gguf("qwen3", False, [("qwen3.rope.scaling.type", STR, "linear"),
                                           ("qwen3.rope.scaling.factor", F32, 2.0)]), big)


if __name__ == "__main__":
    main()
    more_seeds()
