#!/usr/bin/env python3
"""Writes the small valid seed files for the fuzzers (run from anywhere; stdlib only).

seeds/fuzz_gguf/*.gguf and seeds/fuzz_safetensors/*.safetensors, each < 4 KB.
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


def write(sub, name, blob):
    assert len(blob) < 4096, (name, len(blob))
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


if __name__ == "__main__":
    main()
