/* Internal to the KV pool and its tests: the kernel interface (kv_geom, the
 * attention and conversion kernel types, in kernels/kvattn.h) plus the
 * pool's own constants and the ISA-level controls. Which kernel runs is the
 * dispatcher's choice (kern_attn_for in kernels/kernels.h, the same place that
 * picks every kernel); the kernels themselves are src/kernels/attn_ref.c and
 * src/kernels/x86/kvattn_*.c. Not part of the public API. */
#ifndef TK_KV_SIMD_H
#define TK_KV_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "kernels/kvattn.h"
#include "kv/kv.h"

/* Floats of scratch any kernel needs for head_dim (independent of the context:
 * softmax is computed online, one block at a time). */
size_t kv_attn_scratch_need(int head_dim, int block_size);

/* Like kv_init but with the ISA level given (tests and benches run every level
 * the CPU has). isa must not exceed cpu_best_isa: TK_ERR_UNSUPPORTED otherwise.
 * The attention kernel is kern_attn_for(isa, head_dim): isa's own, or the next
 * level down that takes the head_dim. */
tk_status kv_init_isa(const tk_kv_opts *o, tk_isa isa, tk_kv **out);
/* The level whose attention kernel the pool actually uses (after fallbacks). */
tk_isa kv_isa(const tk_kv *kv);
/* Tests only: run the pool's attention through fn, part_fn and own_fn from now on
 * (kernels built outside the library, e.g. the shared x86 body at another
 * vector width); they must handle the pool's head_dim. kv_isa is not changed. */
void kv_set_attn(tk_kv *kv, kv_attn_fn fn, kv_attn_part_fn part_fn, kv_attn_own_fn own_fn);
/* Whether the pool's attention dots int8 K against int8-quantised queries
 * (kv_geom.q8: int8 KV at a level whose table says attn_q8). */
bool kv_query_int8(const tk_kv *kv);
/* Tests only: turn that on (int8 KV only) or off, for the reference level or
 * a level that implements it (attn_q8), before the pool hands out its first
 * block (it decides int8 K's layout); head_dim % 4 == 0. */
void kv_set_query_int8(tk_kv *kv, bool on);

#endif
