/* AVX2 + FMA + F16C attention over the paged KV cache: the shared body in
 * kvattn_body.h with 8-lane vectors (kvattn_256.h). Int8 K is dotted in
 * floats at this level: int8 queries by vpmaddubsw (|k| against q with k's
 * sign, then vpmaddwd) cut attention 5% and cost kv_store as much in
 * scattered column writes (docs/notes.md). */
#define KFN(name) name##_avx2
#include "kernels/x86/kvattn_256.h"

#include "kernels/x86/kvattn_body.h"
