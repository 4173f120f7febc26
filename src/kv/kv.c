/* The paged KV pool: one allocation for every layer's blocks, a free list of
 * block ids, conversion of written K/V vectors to the pool's KV type, and
 * attention through the kernel the dispatcher picked at init. */
#include "kv.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kv_simd.h"

struct tk_kv {
    tk_kv_opts o;
    uint8_t *pool;                /* [n_layer][n_head_kv][n_blocks] units (kv_layout), on huge pages */
    size_t pool_bytes;            /* its size, for tk_free_huge */
    size_t block_stride;          /* bytes of one unit: from a (layer, kv head)'s block b to b + 1 */
    size_t head_stride;           /* bytes from one kv head's blocks to the next one's (see kv_geom) */
    size_t v_off, ks_off, vs_off; /* offsets of a unit's V and scales from its K */
    int32_t *free_ids;            /* [n_blocks] stack of free block ids; top is free_ids[n_free-1] */
    int n_free;
    int32_t *refs; /* [n_blocks] holders of each block; 0 while free (catches double frees) */
    tk_isa isa;    /* level of the attention kernel in use */
    bool q8;       /* int8 K against int8-quantised queries (kv_geom.q8) */
    bool used;     /* a block was handed out (q8 is fixed from then on) */
    kv_attn_fn attn;
    kv_attn_part_fn attn_part;
    kv_attn_own_fn attn_own;
    kv_to_f16_fn to_f16;
    kv_quant_token_fn quant_token;
    kv_quant_chan_fn quant_chan;
    kv_requant_chan_fn requant_chan;
    kv_requant_cols_fn requant_cols;
};

/* Sizes of the pool's regions; false on overflow. The pool is laid out
 * [n_layer][n_head_kv][n_blocks] units, a unit one (layer, kv head, block):
 * its K, its V, and (int8) its K and V scales, rounded up to 64 bytes. So a
 * kv head's blocks of one layer are adjacent, and a sequence whose blocks
 * have consecutive ids is one run per (layer, kv head) for attention. */
typedef struct kv_layout {
    size_t sect;   /* bytes of one head's K (or V) in a block: block_size * head_dim * elem */
    size_t scales; /* bytes of one head's k_scale (or v_scale) in a block; 0 unless int8 */
    size_t exact;  /* n_head_kv * 2 * (sect + scales): the bytes of a (layer, block) that carry data */
    size_t unit;   /* 2 * (sect + scales) rounded up to 64 */
    size_t stride; /* n_head_kv * unit: the bytes of one (layer, block) */
} kv_layout;

static bool layout_of(const tk_kv_opts *o, kv_layout *L) {
    size_t sect, scales = 0, exact, unit, stride;
    if (!tk_mul_size((size_t)o->block_size, (size_t)o->head_dim, &sect) ||
        !tk_mul_size(sect, kv_type_size(o->type), &sect))
        return false;
    if (o->type == TK_KV_INT8)
        scales =
            (o->scale == TK_KV_SCALE_TOKEN ? (size_t)o->block_size : (size_t)o->head_dim) * sizeof(float);
    if (!tk_add_size(sect, scales, &unit) || !tk_mul_size(unit, 2, &unit) ||
        !tk_mul_size(unit, (size_t)o->n_head_kv, &exact) || !tk_add_size(unit, 63, &unit))
        return false;
    unit &= ~(size_t)63;
    if (!tk_mul_size(unit, (size_t)o->n_head_kv, &stride)) return false;
    *L = (kv_layout){.sect = sect, .scales = scales, .exact = exact, .unit = unit, .stride = stride};
    return true;
}

static bool block_size_ok(int bs) { return bs == 16 || bs == 32 || bs == 64 || bs == 128 || bs == 256; }

static tk_status opts_check(const tk_kv_opts *o) {
    if (o->n_layer <= 0) return tk_fail(TK_ERR_INVALID, "kv: n_layer must be > 0, got %d", o->n_layer);
    if (o->n_head_kv <= 0) return tk_fail(TK_ERR_INVALID, "kv: n_head_kv must be > 0, got %d", o->n_head_kv);
    if (o->head_dim <= 0 || o->head_dim > KV_MAX_HEAD_DIM)
        return tk_fail(TK_ERR_INVALID, "kv: head_dim must be in [1, %d], got %d", KV_MAX_HEAD_DIM,
                       o->head_dim);
    if (o->n_blocks <= 0) return tk_fail(TK_ERR_INVALID, "kv: n_blocks must be > 0, got %d", o->n_blocks);
    if (!block_size_ok(o->block_size))
        return tk_fail(TK_ERR_INVALID, "kv: block_size must be 16, 32, 64, 128 or 256, got %d",
                       o->block_size);
    if ((unsigned)o->type > TK_KV_INT8)
        return tk_fail(TK_ERR_INVALID, "kv: type must be f32, f16, bf16 or int8 (0..3), got %d",
                       (int)o->type);
    if ((unsigned)o->scale > TK_KV_SCALE_TOKEN)
        return tk_fail(TK_ERR_INVALID, "kv: scale must be per head or per token (0..1), got %d",
                       (int)o->scale);
    return TK_OK;
}

/* Options are validated by callers of the size functions only loosely (they
 * return 0 for options kv_init would refuse), so they never set a message. */
/* The shape of a block: what the per-block and per-token sizes depend on
 * (n_blocks is not needed; kv_init checks it). */
static bool opts_valid(const tk_kv_opts *o) {
    return o && o->n_layer > 0 && o->n_head_kv > 0 && o->head_dim > 0 && o->head_dim <= KV_MAX_HEAD_DIM &&
           block_size_ok(o->block_size) && (unsigned)o->type <= TK_KV_INT8 &&
           (unsigned)o->scale <= TK_KV_SCALE_TOKEN;
}

size_t kv_block_bytes(const tk_kv_opts *o) {
    kv_layout L;
    size_t n;
    if (!opts_valid(o) || !layout_of(o, &L) || !tk_mul_size(L.stride, (size_t)o->n_layer, &n)) return 0;
    return n;
}

/* One (layer, kv head, block) unit: its K, V and (int8) scales, every type. */
size_t kv_run_bytes(const tk_kv_opts *o) {
    kv_layout L;
    if (!opts_valid(o) || !layout_of(o, &L)) return 0;
    return L.unit;
}

/* Logical bytes (no alignment padding); per-head scales are shared by a block's
 * tokens, so their share is rounded up. */
size_t kv_bytes_per_token(const tk_kv_opts *o) {
    kv_layout L;
    size_t n;
    if (!opts_valid(o) || !layout_of(o, &L) || !tk_mul_size(L.exact, (size_t)o->n_layer, &n)) return 0;
    return n / (size_t)o->block_size + (n % (size_t)o->block_size != 0);
}

size_t kv_attn_scratch_need(int head_dim, int block_size) {
    /* tile state (scores, acc, m, l, q times scales), the folded parts (M,
     * L, A), and the int8 queries (scales, offsets, KV_Q8_BYTES each) */
    return (size_t)KV_ATTN_TILE * ((size_t)block_size + 3 * (size_t)head_dim + 6 + KV_Q8_BYTES(head_dim) / 4);
}

size_t kv_attn_scratch_floats(const tk_kv *kv, int max_ctx) {
    (void)max_ctx; /* online softmax: one block of scores at a time, whatever the context */
    return kv_attn_scratch_need(kv->o.head_dim, kv->o.block_size);
}

static size_t phys_mem_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t n;
    if (pages <= 0 || page <= 0 || !tk_mul_size((size_t)pages, (size_t)page, &n)) return SIZE_MAX;
    return n;
}

tk_status kv_init_isa(const tk_kv_opts *o, tk_isa isa, tk_kv **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "kv: out is NULL");
    *out = NULL;
    if (!o) return tk_fail(TK_ERR_INVALID, "kv: options are NULL");
    tk_status st = opts_check(o);
    if (st != TK_OK) return st;
    tk_cpu cpu;
    cpu_detect(&cpu);
    /* not just up to the best: an AVX-512 CPU may lack AVX-VNNI */
    if (!cpu_has_isa(&cpu, isa))
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "kv: ISA level %d asked for, which this CPU does not run (its best: %s)", (int)isa,
                       cpu_isa_name(cpu_best_isa(&cpu)));

    kv_layout L;
    size_t total;
    if (!layout_of(o, &L) || !tk_mul_size(L.stride, (size_t)o->n_blocks, &total) ||
        !tk_mul_size(total, (size_t)o->n_layer, &total))
        return tk_fail(TK_ERR_NOMEM,
                       "kv: pool size overflows (%d layers x %d blocks x %d heads x %d slots x %d dims)",
                       o->n_layer, o->n_blocks, o->n_head_kv, o->block_size, o->head_dim);
    /* The pool is touched at init, so more than the machine's memory
     * can never work; refuse it before the allocator (or the OOM killer) does. */
    size_t phys = phys_mem_bytes();
    if (total > phys)
        return tk_fail(TK_ERR_NOMEM,
                       "kv: pool needs %zu bytes (%d blocks x %zu bytes), more than the %zu bytes of memory",
                       total, o->n_blocks, L.stride * (size_t)o->n_layer, phys);

    tk_kv *kv = tk_calloc(1, sizeof *kv);
    if (!kv) return tk_fail(TK_ERR_NOMEM, "kv: %zu bytes for the pool header", sizeof *kv);
    kv->o = *o;
    kv->block_stride = L.unit;
    kv->head_stride = L.unit * (size_t)o->n_blocks;
    kv->v_off = L.sect;
    kv->ks_off = 2 * L.sect;
    kv->vs_off = 2 * L.sect + L.scales;
    /* On huge pages: attention reads every block of a sequence each step, and
     * with 4 KiB pages each 4 KiB of it costs a TLB walk. */
    kv->pool = tk_alloc_huge(total, 1);
    kv->pool_bytes = total;
    kv->free_ids = tk_calloc((size_t)o->n_blocks, sizeof *kv->free_ids);
    kv->refs = tk_calloc((size_t)o->n_blocks, sizeof *kv->refs);
    if (!kv->pool || !kv->free_ids || !kv->refs) {
        kv_free(kv);
        return tk_fail(TK_ERR_NOMEM, "kv: cannot allocate the pool (%zu bytes, %d blocks)", total,
                       o->n_blocks);
    }
    /* Stack order hands out 0, 1, 2, ... first: low ids, predictable tests,
     * and a sequence's blocks side by side (blocks freed last first come
     * back in their order). */
    for (int i = 0; i < o->n_blocks; i++) kv->free_ids[i] = o->n_blocks - 1 - i;
    kv->n_free = o->n_blocks;

    /* The dispatcher picks the kernels (and the level below isa that takes an odd head_dim). */
    kv->attn = kern_attn_for(isa, o->head_dim, &kv->isa);
    kv->attn_part = kernels_get(kv->isa)->attn_part;
    kv->attn_own = kernels_get(kv->isa)->attn_own;
    kv->q8 = o->type == TK_KV_INT8 && kernels_get(kv->isa)->attn_q8;
    kv->to_f16 = kernels_get(isa)->kv_to_f16;
    kv->quant_token = kernels_get(isa)->kv_quant_token;
    kv->quant_chan = kernels_get(isa)->kv_quant_chan;
    kv->requant_chan = kernels_get(isa)->kv_requant_chan;
    kv->requant_cols = kernels_get(isa)->kv_requant_cols;
    *out = kv;
    return TK_OK;
}

tk_status kv_init(const tk_kv_opts *o, tk_kv **out) {
    tk_cpu cpu;
    cpu_detect(&cpu);
    return kv_init_isa(o, cpu_isa_from_env(&cpu), out);
}

void kv_free(tk_kv *kv) {
    if (!kv) return;
    tk_free_huge(kv->pool, kv->pool_bytes);
    tk_free(kv->free_ids);
    tk_free(kv->refs);
    tk_free(kv);
}

const tk_kv_opts *kv_opts(const tk_kv *kv) { return &kv->o; }
tk_isa kv_isa(const tk_kv *kv) { return kv->isa; }
void kv_set_attn(tk_kv *kv, kv_attn_fn fn, kv_attn_part_fn part_fn, kv_attn_own_fn own_fn) {
    kv->attn = fn;
    kv->attn_part = part_fn;
    kv->attn_own = own_fn;
}
bool kv_query_int8(const tk_kv *kv) { return kv->q8; }
void kv_set_query_int8(tk_kv *kv, bool on) {
    TK_ASSERT(!kv->used && (!on || kv->o.head_dim % 4 == 0)); /* it decides int8 K's layout (kv_k_cols) */
    kv->q8 = on && kv->o.type == TK_KV_INT8;
}

int kv_block_alloc(tk_kv *kv) {
    if (kv->n_free == 0) return -1;
    int b = kv->free_ids[--kv->n_free];
    TK_ASSERT(kv->refs[b] == 0);
    kv->refs[b] = 1;
    kv->used = true;
    return b;
}

void kv_block_ref(tk_kv *kv, int block) {
    TK_ASSERT(block >= 0 && block < kv->o.n_blocks);
    TK_ASSERT(kv->refs[block] > 0 &&
              kv->refs[block] < INT32_MAX); /* a free block has no holder to share it */
    kv->refs[block]++;
}

void kv_block_free(tk_kv *kv, int block) {
    TK_ASSERT(block >= 0 && block < kv->o.n_blocks);
    TK_ASSERT(kv->refs[block] > 0); /* double free */
    if (--kv->refs[block] > 0) return;
    kv->free_ids[kv->n_free++] = block;
}

int kv_block_refs(const tk_kv *kv, int block) {
    TK_ASSERT(block >= 0 && block < kv->o.n_blocks);
    return kv->refs[block];
}

int kv_blocks_free(const tk_kv *kv) { return kv->n_free; }
int kv_blocks_total(const tk_kv *kv) { return kv->o.n_blocks; }

static kv_geom geom_of(const tk_kv *kv, int l) {
    return (kv_geom){
        .layer = kv->pool + (size_t)l * (size_t)kv->o.n_head_kv * kv->head_stride,
        .block_stride = kv->block_stride,
        .head_stride = kv->head_stride,
        .v_off = kv->v_off,
        .ks_off = kv->ks_off,
        .vs_off = kv->vs_off,
        .n_blocks = kv->o.n_blocks,
        .n_head_kv = kv->o.n_head_kv,
        .head_dim = kv->o.head_dim,
        .block_size = kv->o.block_size,
        .type = kv->o.type,
        .scale = kv->o.scale,
        .q8 = kv->q8,
    };
}

void kv_block_copy(tk_kv *kv, int dst, int src, int n_slots) {
    TK_ASSERT(dst >= 0 && dst < kv->o.n_blocks && kv->refs[dst] > 0);
    TK_ASSERT(src >= 0 && src < kv->o.n_blocks && kv->refs[src] > 0);
    TK_ASSERT(n_slots >= 0 && n_slots <= kv->o.block_size);
    if (dst == src || n_slots == 0) return;
    const size_t row = (size_t)kv->o.head_dim * kv_type_size(kv->o.type);
    const bool whole = n_slots == kv->o.block_size;
    /* K by columns keeps slots in groups of KV_KT: the groups up to n_slots */
    const int nk =
        kv_k_cols(kv->o.type, kv->q8, kv->o.block_size) ? (n_slots + KV_KT - 1) / KV_KT * KV_KT : n_slots;
    for (int l = 0; l < kv->o.n_layer; l++) {
        kv_geom g = geom_of(kv, l);
        for (int h = 0; h < kv->o.n_head_kv; h++) {
            uint8_t *d = (uint8_t *)kv_geom_k(&g, dst, h);
            const uint8_t *s = kv_geom_k(&g, src, h);
            if (whole) {
                memcpy(d, s, kv->block_stride);
                continue;
            }
            memcpy(d, s, (size_t)nk * row);
            memcpy(d + g.v_off, s + g.v_off, (size_t)n_slots * row);
            if (kv->o.type != TK_KV_INT8) continue;
            /* per token: the slots' own scales; per head: the channels' (every slot's) */
            const bool tok = kv->o.scale == TK_KV_SCALE_TOKEN;
            const size_t per = (size_t)kv_scales_per_head(&g);
            memcpy(d + g.ks_off, s + g.ks_off, (tok ? (size_t)nk : per) * sizeof(float));
            memcpy(d + g.vs_off, s + g.vs_off, (tok ? (size_t)n_slots : per) * sizeof(float));
        }
    }
}

kv_geom kv_layer_geom(const tk_kv *kv, int l) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer);
    return geom_of(kv, l);
}

/* The block holding position pos; ids come from the engine, so a bad one is a bug. */
static int32_t block_at(const tk_kv *kv, const int32_t *bt, int pos) {
    int32_t b = bt[pos / kv->o.block_size];
    TK_ASSERT(b >= 0 && b < kv->o.n_blocks && kv->refs[b] > 0);
    return b;
}

/* Slot `slot` of int8 K stored by columns (kv_k8_index): 4 channels at a time. */
static void put_k8(int8_t *rows, int slot, int hd, const int8_t *y) {
    int8_t *d = rows + kv_k8_index(hd, slot, 0);
    for (int c = 0; c < hd; c += 4, d += 4 * KV_KT) memcpy(d, y + c, 4);
}

/* Per-head int8: one scale per (block, head, channel), which only grows. The
 * first vector of a block (slot 0) starts it afresh, which also forgets a
 * reused block's old scales; so a block's slots must be written in order from
 * 0, as the engine does. When a channel's value does not fit, that channel's
 * scale becomes max(|x| / 127, KV_INT8_MIN_GROWTH * old) and its slots
 * [0, slot) are requantized to it with round-to-nearest.
 *
 * Why per channel: K and V channels differ in magnitude (norm weights, RoPE
 * pairs, and the outlier channels of real models' K), and a short block's
 * absmax per channel is smaller than one token's absmax over its channels.
 * Relative RMS error on the tiny synthetic qwen3's K and V (16 / 128 slots):
 * one scale per (block, head) 9.8e-3 / 1.2e-2, per token 6.5e-3, per channel
 * 4.7e-3 / 7.5e-3; on gaussian data whose channels vary in scale, two of them
 * 6x (like real models' K): per (block, head) 3.4e-2 / 4.4e-2, per token
 * 1.4e-2, per channel 5.4e-3 / 7.9e-3. docs/engine.md has the study.
 *
 * Why a minimum growth of 1.125: each requantization adds up to half a step
 * of error to the values already there. If a channel that grows a little with
 * every token were rescaled to fit exactly, its first values would drift by
 * up to a step per token; growing by at least 1.125 bounds what old values
 * carry at s/2 * (1 + 1/1.125 + 1/1.125^2 + ...) = 4.5 s (s the final scale).
 * Random data rescales a channel only on new maxima, and mostly by more than
 * 1.125, so it costs nothing there, unlike headroom added to every new scale
 * (1.25 of headroom: +20% error at 16 slots).
 *
 * x goes to y (slot's row, or with kt, K by columns, a buffer the caller puts
 * in place); the rescales apply to the slots already in rows. */
static void write_int8_chan(const tk_kv *kv, int8_t *rows, float *scales, int slot, int hd, const float *x,
                            int8_t *y, bool kt) {
    if (slot == 0)
        for (int c = 0; c < hd; c++) scales[c] = 0.0f;
    /* quant_chan grows the scales x needs; the slots already stored follow
     * (K by columns: the groups up to slot's, whose later slots are written
     * over when their turn comes) */
    float r[KV_MAX_HEAD_DIM];
    if (!kv->quant_chan(x, scales, y, r, hd)) return;
    if (kt)
        kv->requant_cols(rows, (slot - 1) / KV_KT + 1, hd, r);
    else
        kv->requant_chan(rows, slot, hd, r);
}

/* Converts one vector of head_dim floats into slot `slot` of a head's rows;
 * kt: K stored by columns (kv_k_cols), where the slot is a column (kv_k_index,
 * kv_k8_index). */
static void write_vec(const tk_kv *kv, uint8_t *rows, float *scales, int slot, const float *x, bool kt) {
    int hd = kv->o.head_dim;
    size_t off = (size_t)slot * (size_t)hd;
    if (kt && kv->o.type != TK_KV_INT8) {
        const size_t i0 = kv_k_index(hd, slot, 0);
        if (kv->o.type == TK_KV_F16) {
            tk_f16 h[KV_MAX_HEAD_DIM]; /* kv_init checked hd */
            kv->to_f16(x, h, hd);
            for (int c = 0; c < hd; c++) ((tk_f16 *)rows)[i0 + (size_t)c * KV_KT] = h[c];
        } else if (kv->o.type == TK_KV_BF16) {
            for (int c = 0; c < hd; c++) ((tk_bf16 *)rows)[i0 + (size_t)c * KV_KT] = tk_f32_to_bf16(x[c]);
        } else {
            for (int c = 0; c < hd; c++) ((float *)rows)[i0 + (size_t)c * KV_KT] = x[c];
        }
        return;
    }
    switch (kv->o.type) {
    case TK_KV_F32:
        memcpy((float *)rows + off, x, (size_t)hd * sizeof(float));
        break;
    case TK_KV_F16:
        kv->to_f16(x, (tk_f16 *)rows + off, hd);
        break;
    case TK_KV_BF16:
        for (int i = 0; i < hd; i++) ((tk_bf16 *)rows)[off + i] = tk_f32_to_bf16(x[i]);
        break;
    case TK_KV_INT8: {
        /* K by columns: quantized here, then put in place */
        int8_t tmp[KV_MAX_HEAD_DIM]; /* kv_init checked hd */
        int8_t *y = kt ? tmp : (int8_t *)rows + off;
        if (kv->o.scale == TK_KV_SCALE_TOKEN)
            scales[slot] = kv->quant_token(x, y, hd);
        else
            write_int8_chan(kv, (int8_t *)rows, scales, slot, hd, x, y, kt);
        if (kt) put_k8((int8_t *)rows, slot, hd, tmp);
        break;
    }
    }
}

void kv_write_heads(tk_kv *kv, int l, const int32_t *bt, int pos, const float *k, const float *v, int kvh0,
                    int kvh1) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && pos >= 0);
    TK_ASSERT(0 <= kvh0 && kvh0 <= kvh1 && kvh1 <= kv->o.n_head_kv);
    kv_geom g = geom_of(kv, l);
    int32_t b = block_at(kv, bt, pos);
    int slot = pos % kv->o.block_size;
    for (int h = kvh0; h < kvh1; h++) {
        const float *kx = k + (size_t)h * kv->o.head_dim, *vx = v + (size_t)h * kv->o.head_dim;
        /* The geometry hands out const pointers for the kernels; the pool is ours to write. */
        write_vec(kv, (uint8_t *)kv_geom_k(&g, b, h), (float *)kv_geom_ks(&g, b, h), slot, kx,
                  kv_k_cols(kv->o.type, kv->q8, kv->o.block_size));
        write_vec(kv, (uint8_t *)kv_geom_v(&g, b, h), (float *)kv_geom_vs(&g, b, h), slot, vx, false);
    }
}

void kv_write(tk_kv *kv, int l, const int32_t *bt, int pos, const float *k, const float *v) {
    kv_write_heads(kv, l, bt, pos, k, v, 0, kv->o.n_head_kv);
}

static void read_vec(const tk_kv *kv, const uint8_t *rows, const float *scales, int slot, float *x, bool kt) {
    int hd = kv->o.head_dim;
    size_t off = (size_t)slot * (size_t)hd;
    if (kt && kv->o.type != TK_KV_INT8) {
        const size_t i0 = kv_k_index(hd, slot, 0);
        for (int c = 0; c < hd; c++) x[c] = kv_float_at(kv->o.type, rows, i0 + (size_t)c * KV_KT);
        return;
    }
    switch (kv->o.type) {
    case TK_KV_F32:
        memcpy(x, (const float *)rows + off, (size_t)hd * sizeof(float));
        break;
    case TK_KV_F16:
        for (int i = 0; i < hd; i++) x[i] = tk_f16_to_f32(((const tk_f16 *)rows)[off + i]);
        break;
    case TK_KV_BF16:
        for (int i = 0; i < hd; i++) x[i] = tk_bf16_to_f32(((const tk_bf16 *)rows)[off + i]);
        break;
    case TK_KV_INT8: /* K by columns: kv_k8_index */
        for (int i = 0; i < hd; i++)
            x[i] = (float)((const int8_t *)rows)[kt ? kv_k8_index(hd, slot, i) : off + (size_t)i] *
                   (kv->o.scale == TK_KV_SCALE_TOKEN ? scales[slot] : scales[i]);
        break;
    }
}

void kv_read(const tk_kv *kv, int l, const int32_t *bt, int pos, float *k, float *v) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && pos >= 0);
    kv_geom g = geom_of(kv, l);
    int32_t b = block_at(kv, bt, pos);
    int slot = pos % kv->o.block_size;
    for (int h = 0; h < kv->o.n_head_kv; h++) {
        read_vec(kv, kv_geom_k(&g, b, h), kv_geom_ks(&g, b, h), slot, k + (size_t)h * kv->o.head_dim,
                 kv_k_cols(kv->o.type, kv->q8, kv->o.block_size));
        read_vec(kv, kv_geom_v(&g, b, h), kv_geom_vs(&g, b, h), slot, v + (size_t)h * kv->o.head_dim, false);
    }
}

float kv_read_scale(const tk_kv *kv, int l, const int32_t *bt, int pos, int head, int chan, bool v) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && pos >= 0 && head >= 0 && head < kv->o.n_head_kv);
    TK_ASSERT(chan >= 0 && chan < kv->o.head_dim);
    if (kv->o.type != TK_KV_INT8) return 0.0f;
    kv_geom g = geom_of(kv, l);
    int32_t b = block_at(kv, bt, pos);
    const float *s = v ? kv_geom_vs(&g, b, head) : kv_geom_ks(&g, b, head);
    return kv->o.scale == TK_KV_SCALE_TOKEN ? s[pos % kv->o.block_size] : s[chan];
}

bool kv_attn_own_block(const tk_kv *kv) {
    return kv->o.type == TK_KV_INT8 && kv->o.scale == TK_KV_SCALE_HEAD;
}

int kv_attn_end(const tk_kv *kv, int pos) {
    return kv_attn_own_block(kv) ? pos - pos % kv->o.block_size : pos + 1;
}

void kv_attention(const tk_kv *kv, int l, const int32_t *bt, int pos0, int n_q, const float *q, int n_head,
                  int h0, int h1, float scale, const float *own, float *out, float *scratch,
                  const int32_t *next_bt, int next_kvh) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && pos0 >= 0 && n_q >= 0);
    TK_ASSERT(n_head > 0 && n_head % kv->o.n_head_kv == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head);
    TK_ASSERT((own != NULL) == kv_attn_own_block(kv));
    if (n_q == 0 || h0 == h1) return;
    /* One compare per block read: cheap next to the block itself. */
    for (int p = 0; p < kv_attn_end(kv, pos0 + n_q - 1); p += kv->o.block_size) (void)block_at(kv, bt, p);
    kv_geom g = geom_of(kv, l);
    TK_ASSERT(!next_bt || (next_kvh >= 0 && next_kvh < kv->o.n_head_kv));
    kv->attn(&g, bt, pos0, n_q, q, n_head, h0, h1, scale, own, out, scratch,
             next_bt ? block_at(kv, next_bt, 0) : -1, next_kvh);
}

void kv_attention_own(const tk_kv *kv, int l, const int32_t *bt, int pos, const float *q, int n_head, int h0,
                      int h1, float scale, float *rec, float *scratch, const int32_t *next_bt, int next_pos,
                      int next_kvh) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && pos >= 0);
    TK_ASSERT(n_head > 0 && n_head % kv->o.n_head_kv == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head);
    if (h0 == h1) return;
    (void)block_at(kv, bt, pos);
    kv_geom g = geom_of(kv, l);
    TK_ASSERT(!next_bt || (next_kvh >= 0 && next_kvh < kv->o.n_head_kv));
    kv->attn_own(&g, bt, pos, q, n_head, h0, h1, scale, rec, scratch,
                 next_bt ? block_at(kv, next_bt, next_pos) : -1, next_kvh);
}

void kv_prefetch_write(const tk_kv *kv, int l, const int32_t *bt, int pos, int kvh0, int kvh1) {
    const kv_geom g = geom_of(kv, l);
    const int32_t b = block_at(kv, bt, pos);
    const size_t row = (size_t)kv->o.head_dim * kv_type_size(kv->o.type);
    const int slot = pos % kv->o.block_size;
    const size_t sc = (size_t)kv_scales_per_head(&g) * sizeof(float);
    /* a K slot stored by columns is spread through its group of KV_KT slots */
    const bool kt = kv_k_cols(kv->o.type, kv->q8, kv->o.block_size);
    const size_t k0 = kt ? (size_t)(slot / KV_KT) * KV_KT * row : (size_t)slot * row;
    const size_t k1 = kt ? k0 + KV_KT * row : k0 + row;
    for (int h = kvh0; h < kvh1; h++) {
        const uint8_t *k = kv_geom_k(&g, b, h), *v = kv_geom_v(&g, b, h);
        for (size_t o = k0; o < k1; o += 64) __builtin_prefetch(k + o, 1, 3);
        for (size_t o = (size_t)slot * row; o < (size_t)(slot + 1) * row; o += 64)
            __builtin_prefetch(v + o, 1, 3);
        for (size_t o = 0; o < sc; o += 64) {
            __builtin_prefetch((const uint8_t *)kv_geom_ks(&g, b, h) + o, 1, 3);
            __builtin_prefetch((const uint8_t *)kv_geom_vs(&g, b, h) + o, 1, 3);
        }
    }
}

int kv_attn_parts(int len) { return len <= 0 ? 0 : (len - 1) / KV_ATTN_PART + 1; }

void kv_attention_part(const tk_kv *kv, int l, const int32_t *bt, int end, int part, const float *q,
                       int n_head, int h0, int h1, float scale, float *part_out, float *scratch) {
    TK_ASSERT(l >= 0 && l < kv->o.n_layer && end > 0 && part >= 0 && part < kv_attn_parts(end));
    TK_ASSERT(n_head > 0 && n_head % kv->o.n_head_kv == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head);
    if (h0 == h1) return;
    const int p1 = (part + 1) * KV_ATTN_PART < end ? (part + 1) * KV_ATTN_PART : end;
    for (int p = part * KV_ATTN_PART; p < p1; p += kv->o.block_size) (void)block_at(kv, bt, p);
    kv_geom g = geom_of(kv, l);
    kv->attn_part(&g, bt, end, part, q, n_head, h0, h1, scale, part_out, scratch);
}

void kv_attention_merge(const tk_kv *kv, const float *parts, int n_parts, size_t part_stride, int n_heads,
                        const float *own, float *out) {
    TK_ASSERT(n_parts >= 0 && n_heads >= 0 && (n_parts > 0 || own));
    kv_attn_merge(parts, n_parts, part_stride, n_heads, kv->o.head_dim, own, out);
}
