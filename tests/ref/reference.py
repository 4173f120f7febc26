#!/usr/bin/python3
"""An independent float64 forward pass for tokamak's test models.

It reads GGUF itself (its own strict parser and its own dequantizers, written
from the GGUF / GGML block-format descriptions, not from tokamak's C code) and
implements the qwen3, qwen2 and llama decoders in numpy float64.

  reference.py info MODEL.gguf                 metadata + tensors as JSON
  reference.py logits MODEL.gguf --tokens 1,2,3 [--gen 4,5] [-n N] --out F
      float32 LE rows of n_vocab: the logits after the last prompt token and
      after each fed/generated token but the last (tokamak's --dump-logits
      layout). With -n and no --gen the continuation is greedy.
  reference.py compare MODEL.gguf --tokens 1,2,3 --dump F [--tol X] [--top1]
      reads tokamak's dump, takes the tokens tokamak generated as the argmax of
      each row (greedy), feeds the SAME sequence to the reference and prints
      max|dlogit| / max|logit| over all rows; exit 1 if above --tol, or (with
      --top1) if the reference's argmax differs from tokamak's at any step.

Run with /usr/bin/python3 (needs numpy).
"""
import argparse
import json
import mmap
import struct
import sys

import numpy as np

# ---- GGUF ----------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
# value types: (struct code, size) for scalars
VT_U8, VT_I8, VT_U16, VT_I16, VT_U32, VT_I32, VT_F32, VT_BOOL, VT_STR, VT_ARR, VT_U64, VT_I64, VT_F64 = range(13)
SCALAR = {VT_U8: "<B", VT_I8: "<b", VT_U16: "<H", VT_I16: "<h", VT_U32: "<I", VT_I32: "<i", VT_F32: "<f",
          VT_BOOL: "<B", VT_U64: "<Q", VT_I64: "<q", VT_F64: "<d"}
NP_SCALAR = {VT_U8: "<u1", VT_I8: "<i1", VT_U16: "<u2", VT_I16: "<i2", VT_U32: "<u4", VT_I32: "<i4",
             VT_F32: "<f4", VT_BOOL: "<u1", VT_U64: "<u8", VT_I64: "<i8", VT_F64: "<f8"}

# GGML tensor types: id -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 8: ("Q8_0", 32, 34),
              12: ("Q4_K", 256, 144), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2)}
GGML_MAX_NAME = 64


class GGUFError(Exception):
    pass


class GGUF:
    """A strict reader: every count, length, offset and the layout rules of
    the spec (alignment, aligned offsets, no overlap, data inside the file,
    zero padding) are checked; any violation raises GGUFError naming it."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = len(self.buf)
        self.pos = 0
        if self._take(4) != GGUF_MAGIC:
            raise GGUFError("bad magic")
        self.version = self._u32()
        if self.version not in (2, 3):
            raise GGUFError("version %d not supported (2 or 3)" % self.version)
        n_tensors, n_kv = self._u64(), self._u64()
        # each kv needs >= 8+1+4 bytes and each tensor info >= 8+1+4+8+4+8
        if n_kv * 13 > self.size or n_tensors * 33 > self.size:
            raise GGUFError("n_kv %d / n_tensors %d impossible for a %d-byte file" % (n_kv, n_tensors, self.size))
        self.kv = {}
        self.kv_types = {}
        for i in range(n_kv):
            key = self._str("kv %d key" % i)
            if not key:
                raise GGUFError("kv %d: empty key" % i)
            if key in self.kv:
                raise GGUFError("duplicate key %r" % key)
            vt = self._u32()
            self.kv_types[key] = vt
            self.kv[key] = self._value(vt, key)
        self.alignment = 32
        if "general.alignment" in self.kv:
            if self.kv_types["general.alignment"] != VT_U32:
                raise GGUFError("general.alignment must be u32")
            a = self.kv["general.alignment"]
            if a == 0 or a & (a - 1):
                raise GGUFError("general.alignment %d is not a power of two" % a)
            self.alignment = a
        self.tensors = {}
        order = []
        for i in range(n_tensors):
            name = self._str("tensor %d name" % i)
            if len(name.encode()) >= GGML_MAX_NAME:
                raise GGUFError("tensor name %r longer than %d bytes" % (name, GGML_MAX_NAME - 1))
            if name in self.tensors:
                raise GGUFError("duplicate tensor %r" % name)
            n_dims = self._u32()
            if not 1 <= n_dims <= 4:
                raise GGUFError("tensor %s: n_dims %d" % (name, n_dims))
            ne = [self._u64() for _ in range(n_dims)]
            if any(n == 0 or n >= 1 << 40 for n in ne):
                raise GGUFError("tensor %s: bad dimension in %s" % (name, ne))
            t = self._u32()
            if t not in GGML_TYPES:
                raise GGUFError("tensor %s: type %d not supported" % (name, t))
            off = self._u64()
            tname, be, bb = GGML_TYPES[t]
            if ne[0] % be:
                raise GGUFError("tensor %s: ne[0] %d not a multiple of the %s block %d" % (name, ne[0], tname, be))
            nel = 1
            for n in ne:
                nel *= n
            nbytes = nel // be * bb
            if off % self.alignment:
                raise GGUFError("tensor %s: offset %d not a multiple of alignment %d" % (name, off, self.alignment))
            self.tensors[name] = {"ne": ne, "type": t, "type_name": tname, "offset": off, "nbytes": nbytes}
            order.append(name)
        self.order = order
        infos_end = self.pos
        self.data_start = (infos_end + self.alignment - 1) // self.alignment * self.alignment
        if self.data_start > self.size:
            raise GGUFError("data section starts past the end of the file")
        if any(b != 0 for b in self.buf[infos_end:self.data_start]):
            raise GGUFError("non-zero padding before the data section")
        spans = sorted((v["offset"], v["offset"] + v["nbytes"], k) for k, v in self.tensors.items())
        end = 0
        for s, e, k in spans:
            if s < end:
                raise GGUFError("tensor %s overlaps the previous tensor" % k)
            if self.data_start + e > self.size:
                raise GGUFError("tensor %s: data [%d, %d) past the end of the file" % (k, s, e))
            if any(b != 0 for b in self.buf[self.data_start + end:self.data_start + s]):
                raise GGUFError("non-zero padding before tensor %s" % k)
            end = e
        # gguf-py pads after every tensor: the file ends at the padded end of the last one
        padded = (end + self.alignment - 1) // self.alignment * self.alignment
        if spans and self.size not in (self.data_start + end, self.data_start + padded):
            raise GGUFError("file size %d: expected %d (data ends at %d)" % (self.size, self.data_start + padded,
                                                                          self.data_start + end))

    def _take(self, n):
        if n < 0 or self.pos + n > self.size:
            raise GGUFError("read of %d bytes at %d past the end of the file (%d)" % (n, self.pos, self.size))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _u32(self):
        return struct.unpack("<I", self._take(4))[0]

    def _u64(self):
        return struct.unpack("<Q", self._take(8))[0]

    def _str(self, what):
        n = self._u64()
        if n > self.size - self.pos:
            raise GGUFError("%s: string length %d past the end of the file" % (what, n))
        b = self._take(n)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError("%s: string is not UTF-8" % what)

    def _value(self, vt, key, depth=0):
        if vt in SCALAR:
            v = struct.unpack(SCALAR[vt], self._take(struct.calcsize(SCALAR[vt])))[0]
            if vt == VT_BOOL:
                if v > 1:
                    raise GGUFError("%s: bool value %d" % (key, v))
                v = bool(v)
            return v
        if vt == VT_STR:
            return self._str(key)
        if vt == VT_ARR:
            if depth > 8:
                raise GGUFError("%s: arrays nested too deeply" % key)
            et, n = self._u32(), self._u64()
            if et in NP_SCALAR:
                sz = np.dtype(NP_SCALAR[et]).itemsize
                if n > (self.size - self.pos) // sz:
                    raise GGUFError("%s: array of %d elements past the end of the file" % (key, n))
                return np.frombuffer(self._take(n * sz), dtype=NP_SCALAR[et]).copy()
            if et in (VT_STR, VT_ARR):
                if n > (self.size - self.pos) // 8:
                    raise GGUFError("%s: array of %d elements past the end of the file" % (key, n))
                return [self._value(et, key, depth + 1) for _ in range(n)]
            raise GGUFError("%s: array element type %d" % (key, et))
        raise GGUFError("%s: value type %d" % (key, vt))

    def raw(self, name):
        t = self.tensors[name]
        s = self.data_start + t["offset"]
        return np.frombuffer(self.buf, dtype=np.uint8, count=t["nbytes"], offset=s)

    def tensor(self, name, rows=None):
        """Dequantized float64 array of shape (ne[1], ne[0]) (or (ne[0],) for 1-D);
        rows: optional row indices (for embeddings)."""
        t = self.tensors[name]
        ne = t["ne"]
        _, be, bb = GGML_TYPES[t["type"]]
        row_bytes = ne[0] // be * bb
        n_rows = t["nbytes"] // row_bytes
        raw = self.raw(name).reshape(n_rows, row_bytes)
        if rows is not None:
            raw = raw[np.asarray(rows)]
        out = dequant(t["type"], raw.reshape(-1), ne[0]).reshape(raw.shape[0], ne[0])
        if len(ne) == 1 and rows is None:
            return out.reshape(ne[0])
        return out


# ---- dequantization (GGML block formats) -----------------------------------------

def _f16(b):  # uint8 (..., 2) -> float64
    return np.ascontiguousarray(b).view("<f2").astype(np.float64)[..., 0]


def dequant(t, raw, k):
    """raw: uint8 bytes of whole rows; returns float64 flat array."""
    if t == 0:
        return raw.view("<f4").astype(np.float64)
    if t == 1:
        return raw.view("<f2").astype(np.float64)
    if t == 30:  # bfloat16: the high half of a float32
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if t == 8:  # Q8_0: f16 d, 32 x int8; x = d * q
        b = raw.reshape(-1, 34)
        d = _f16(b[:, 0:2])
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return (d[:, None] * q).reshape(-1)
    if t == 2:  # Q4_0: f16 d, 16 bytes; low nibbles = elements 0..15, high = 16..31; x = d * (q - 8)
        b = raw.reshape(-1, 18)
        d = _f16(b[:, 0:2])
        qs = b[:, 2:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float64) - 8.0
        return (d[:, None] * q).reshape(-1)
    if t == 12:  # Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        b = raw.reshape(-1, 144)
        d = _f16(b[:, 0:2])
        dmin = _f16(b[:, 2:4])
        s = b[:, 4:16].astype(np.int64)
        qs = b[:, 16:]
        sc = np.empty((b.shape[0], 8), np.int64)
        mn = np.empty((b.shape[0], 8), np.int64)
        for j in range(8):  # 8 sub-blocks of 32: 6-bit scale and min
            if j < 4:
                sc[:, j] = s[:, j] & 63
                mn[:, j] = s[:, j + 4] & 63
            else:
                sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
                mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
        out = np.empty((b.shape[0], 256), np.float64)
        for c in range(4):  # each 32 bytes of qs hold sub-blocks 2c (low nibbles) and 2c+1 (high)
            q = qs[:, 32 * c:32 * c + 32]
            for h, qq in ((0, q & 0xF), (1, q >> 4)):
                j = 2 * c + h
                out[:, 32 * j:32 * j + 32] = (d * sc[:, j])[:, None] * qq - (dmin * mn[:, j])[:, None]
        return out.reshape(-1)
    if t == 14:  # Q6_K: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16] per 16, f16 d
        b = raw.reshape(-1, 210)
        ql = b[:, 0:128].astype(np.int64)
        qh = b[:, 128:192].astype(np.int64)
        sc = b[:, 192:208].view(np.int8).astype(np.float64)
        d = _f16(b[:, 208:210])
        out = np.empty((b.shape[0], 256), np.float64)
        for half in range(2):  # 128 elements each: ql[64], qh[32], scales[8]
            L = ql[:, 64 * half:64 * half + 64]
            H = qh[:, 32 * half:32 * half + 32]
            S = sc[:, 8 * half:8 * half + 8]
            q1 = (L[:, 0:32] & 0xF) | (((H >> 0) & 3) << 4)
            q2 = (L[:, 32:64] & 0xF) | (((H >> 2) & 3) << 4)
            q3 = (L[:, 0:32] >> 4) | (((H >> 4) & 3) << 4)
            q4 = (L[:, 32:64] >> 4) | (((H >> 6) & 3) << 4)
            for i, q in enumerate((q1, q2, q3, q4)):
                # element l of this quarter (l in 0..31) uses scale index l // 16 + 2 * i
                s = np.repeat(S[:, 2 * i:2 * i + 2], 16, axis=1)
                out[:, 128 * half + 32 * i:128 * half + 32 * i + 32] = d[:, None] * s * (q - 32)
        return out.reshape(-1)
    raise GGUFError("no dequantizer for type %d" % t)


# ---- the model -----------------------------------------------------------------

def act_quant(x, wtype):
    """Optional emulation of tokamak's activation formats (kernels.h): Q8_0 rows
    (blocks of 32, f16 scale) for Q8_0/Q4_0 weights, Q8_K (blocks of 256, f32
    scale) for Q4_K/Q6_K; d = absmax / 127, q = round-half-even(x / d) in f32.
    With it the quantized-weight comparisons isolate the weight formats."""
    if wtype in (8, 2):
        blk, f16_scale = 32, True
    elif wtype in (12, 14):
        blk, f16_scale = 256, False
    else:
        return x
    shp = x.shape
    v = x.astype(np.float32).reshape(-1, blk)
    d = (np.abs(v).max(axis=1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.round(v * inv[:, None]), -127, 127)
    if f16_scale:
        d = d.astype(np.float16).astype(np.float32)
    return (q.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(shp)


class Model:
    def __init__(self, g, emulate_act_quant=False):
        self.g = g
        self.aq = emulate_act_quant
        kv = g.kv
        a = kv["general.architecture"]
        if a not in ("qwen3", "qwen2", "llama"):
            raise SystemExit("reference: architecture %s not implemented" % a)
        self.arch = a
        self.n_layer = int(kv[a + ".block_count"])
        self.n_embd = int(kv[a + ".embedding_length"])
        self.n_head = int(kv[a + ".attention.head_count"])
        self.n_head_kv = int(kv.get(a + ".attention.head_count_kv", self.n_head))
        self.head_dim = int(kv.get(a + ".attention.key_length", self.n_embd // self.n_head))
        self.n_ff = int(kv[a + ".feed_forward_length"])
        self.eps = float(kv.get(a + ".attention.layer_norm_rms_epsilon", 1e-6))
        theta = float(kv.get(a + ".rope.freq_base", 10000.0))
        d = self.head_dim
        inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if "rope_freqs.weight" in g.tensors:  # llama3 scaling as llama.cpp stores it: theta / factor
            inv = inv / g.tensor("rope_freqs.weight")
        elif kv.get(a + ".rope.scaling.type") == "llama3":
            inv = llama3_scale(inv, float(kv[a + ".rope.scaling.factor"]),
                               float(kv.get(a + ".rope.scaling.low_freq_factor", 1.0)),
                               float(kv.get(a + ".rope.scaling.high_freq_factor", 4.0)),
                               float(kv[a + ".rope.scaling.original_context_length"]))
        self.inv_freq = inv
        # GGUF llama rows were permuted by the converter: RoPE rotates pairs (2i, 2i+1);
        # qwen2/qwen3 keep the HF layout and rotate halves (i, i + d/2).
        self.interleaved = a == "llama"
        self.L = []
        for i in range(self.n_layer):
            p = "blk.%d." % i
            w = {k: g.tensor(p + k + ".weight") for k in
                 ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                  "ffn_down")}
            for k in ("attn_q", "attn_k", "attn_v"):
                if p + k + ".bias" in g.tensors:
                    w[k + ".bias"] = g.tensor(p + k + ".bias")
            for k in ("attn_q_norm", "attn_k_norm"):
                if p + k + ".weight" in g.tensors:
                    w[k] = g.tensor(p + k + ".weight")
            self.L.append(w)
        self.out_norm = g.tensor("output_norm.weight")
        self.out_name = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
        self.out = g.tensor(self.out_name)
        self.n_vocab = self.out.shape[0]
        self.reset()

    def mm(self, x, w, name):
        """x @ W.T, with the activation quantized as tokamak does when asked."""
        if self.aq:
            x = act_quant(x, self.g.tensors[name]["type"])
        return x @ w.T

    def reset(self):
        self.k = [np.zeros((0, self.n_head_kv, self.head_dim)) for _ in range(self.n_layer)]
        self.v = [np.zeros((0, self.n_head_kv, self.head_dim)) for _ in range(self.n_layer)]
        self.n_past = 0

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x: (T, H, d)
        ang = pos[:, None] * self.inv_freq[None, :]  # (T, d/2)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = np.empty_like(x)
        if self.interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = a * c - b * s
            out[..., 1::2] = b * c + a * s
        else:
            h = self.head_dim // 2
            a, b = x[..., :h], x[..., h:]
            out[..., :h] = a * c - b * s
            out[..., h:] = b * c + a * s
        return out

    def forward(self, tokens):
        """Feed tokens after the cached ones; returns (T, n_vocab) logits."""
        T = len(tokens)
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.float64)
        x = self.g.tensor("token_embd.weight", rows=tokens)
        H, KV, d = self.n_head, self.n_head_kv, self.head_dim
        group = H // KV
        for i, w in enumerate(self.L):
            p = "blk.%d." % i
            h = self.rms(x, w["attn_norm"])
            q = self.mm(h, w["attn_q"], p + "attn_q.weight")
            k = self.mm(h, w["attn_k"], p + "attn_k.weight")
            v = self.mm(h, w["attn_v"], p + "attn_v.weight")
            if "attn_q.bias" in w:
                q, k, v = q + w["attn_q.bias"], k + w["attn_k.bias"], v + w["attn_v.bias"]
            q, k, v = q.reshape(T, H, d), k.reshape(T, KV, d), v.reshape(T, KV, d)
            if "attn_q_norm" in w:
                q, k = self.rms(q, w["attn_q_norm"]), self.rms(k, w["attn_k_norm"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.k[i] = np.concatenate([self.k[i], k])
            self.v[i] = np.concatenate([self.v[i], v])
            K, V = self.k[i], self.v[i]  # (S, KV, d)
            S = K.shape[0]
            att = np.empty((T, H, d))
            mask = np.arange(S)[None, :] <= (self.n_past + np.arange(T))[:, None]  # causal (T, S)
            for hh in range(H):
                sc = q[:, hh, :] @ K[:, hh // group, :].T / np.sqrt(d)
                sc = np.where(mask, sc, -np.inf)
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                att[:, hh, :] = (sc / sc.sum(axis=1, keepdims=True)) @ V[:, hh // group, :]
            x = x + self.mm(att.reshape(T, H * d), w["attn_output"], p + "attn_output.weight")
            h = self.rms(x, w["ffn_norm"])
            gt, up = self.mm(h, w["ffn_gate"], p + "ffn_gate.weight"), self.mm(h, w["ffn_up"], p + "ffn_up.weight")
            x = x + self.mm(gt / (1.0 + np.exp(-gt)) * up, w["ffn_down"], p + "ffn_down.weight")
        self.n_past += T
        return self.mm(self.rms(x, self.out_norm), self.out, self.out_name)


def llama3_scale(inv, factor, low, high, orig):
    """Llama-3 RoPE scaling (HF's _compute_llama3_parameters) on inverse frequencies."""
    wavelen = 2 * np.pi / inv
    lo_w, hi_w = orig / low, orig / high
    smooth = (orig / wavelen - low) / (high - low)
    scaled = np.where(wavelen > lo_w, inv / factor, inv)
    mid = (wavelen >= hi_w) & (wavelen <= lo_w)
    return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)


def run_sequence(m, prompt, gen=None, n=0):
    """Logit rows for the last prompt position and after each token of gen but
    the last; gen None: greedy for n tokens. Returns (rows, gen)."""
    m.reset()
    rows = [m.forward(prompt)[-1]]
    if gen is None:
        gen = [int(np.argmax(rows[0]))]
        while len(gen) < n:
            rows.append(m.forward([gen[-1]])[-1])
            gen.append(int(np.argmax(rows[-1])))
    elif len(gen) > 1:
        rows.extend(m.forward(gen[:-1]))
    return np.array(rows), gen


def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t]


def cmd_info(a):
    g = GGUF(a.model)
    meta = {}
    for k, v in g.kv.items():
        if isinstance(v, np.ndarray):
            meta[k] = {"array": str(v.dtype), "n": int(v.size)}
        elif isinstance(v, list):
            meta[k] = {"array": "list", "n": len(v)}
        else:
            meta[k] = v
    out = {"version": g.version, "alignment": g.alignment, "data_start": g.data_start, "metadata": meta,
           "tensors": {n: {"ne": g.tensors[n]["ne"], "type": g.tensors[n]["type_name"]} for n in g.order}}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


def cmd_logits(a):
    m = Model(GGUF(a.model), a.act_quant)
    rows, gen = run_sequence(m, parse_ids(a.tokens), parse_ids(a.gen) if a.gen else None, a.n)
    rows.astype("<f4").tofile(a.out)
    print(",".join(map(str, gen)))


def cmd_compare(a):
    m = Model(GGUF(a.model), a.act_quant)
    prompt = parse_ids(a.tokens)
    dump = np.fromfile(a.dump, dtype="<f4")
    if dump.size == 0 or dump.size % m.n_vocab:
        raise SystemExit("compare: %s has %d floats, not a multiple of n_vocab %d" % (a.dump, dump.size, m.n_vocab))
    dump = dump.reshape(-1, m.n_vocab).astype(np.float64)
    if not np.all(np.isfinite(dump)):
        raise SystemExit("compare: tokamak's logits are not all finite")
    gen = [int(i) for i in np.argmax(dump, axis=1)]  # greedy: what tokamak generated
    ref, _ = run_sequence(m, prompt, gen)
    err = np.abs(ref - dump).max(axis=1) / np.abs(ref).max(axis=1)
    ref_top = np.argmax(ref, axis=1)
    agree = int(np.sum(ref_top == np.array(gen)))
    worst = int(np.argmax(err))
    distinct = len(set(gen))
    print("compare %s: %d rows, max|dlogit|/max|logit| = %.3g (row %d), mean %.3g; top-1 agree %d/%d; "
          "%d distinct generated tokens" % (a.model, len(gen), err.max(), worst, err.mean(), agree, len(gen), distinct))
    ok = True
    if a.tol is not None and not err.max() < a.tol:
        print("FAIL: relative logit error %.3g >= %.3g" % (err.max(), a.tol))
        ok = False
    if a.top1 and agree != len(gen):
        bad = [i for i in range(len(gen)) if ref_top[i] != gen[i]]
        print("FAIL: top-1 differs at steps %s" % bad[:10])
        ok = False
    if a.min_agree and agree < a.min_agree * len(gen):
        print("FAIL: top-1 agrees at %d/%d steps, expected >= %.0f%%" % (agree, len(gen), 100 * a.min_agree))
        ok = False
    if a.min_distinct and distinct < a.min_distinct:
        print("FAIL: only %d distinct generated tokens (degenerate model?)" % distinct)
        ok = False
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info")
    p.add_argument("model")
    p = sub.add_parser("logits")
    p.add_argument("model")
    p.add_argument("--tokens", required=True)
    p.add_argument("--gen")
    p.add_argument("-n", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--act-quant", action="store_true", help="emulate tokamak's Q8 activation formats")
    p = sub.add_parser("compare")
    p.add_argument("model")
    p.add_argument("--tokens", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--tol", type=float)
    p.add_argument("--top1", action="store_true")
    p.add_argument("--act-quant", action="store_true", help="emulate tokamak's Q8 activation formats")
    p.add_argument("--min-agree", type=float, default=0.0, help="fraction of steps with the same top-1")
    p.add_argument("--min-distinct", type=int, default=0)
    a = ap.parse_args()
    try:
        if a.cmd == "info":
            return cmd_info(a)
        if a.cmd == "logits":
            return cmd_logits(a)
        return cmd_compare(a)
    except GGUFError as e:
        print("reference: %s: %s" % (a.model, e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main() or 0)
