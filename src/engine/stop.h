/* Stop strings over a stream of text: text that could still be the start of a
 * stop string is held back until it can no longer match, and a matched stop
 * string (and everything after it) is never emitted. Matches may span any
 * number of pushes (tokens). One matcher per request; not thread-safe. */
#ifndef TK_ENGINE_STOP_H
#define TK_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "tokamak.h"

typedef struct stop_matcher stop_matcher;

/* stops: n strings (copied; n may be 0, then text passes straight through).
 * max_push: the most bytes one stop_push will be given. An empty stop string
 * is TK_ERR_INVALID. */
tk_status stop_init(const char *const *stops, int n, size_t max_push, stop_matcher **out);
void stop_free(stop_matcher *m);

/* The most bytes one stop_push or stop_flush can write to out. */
size_t stop_out_bound(const stop_matcher *m);

/* Append len bytes of text (len <= max_push). Writes the text that can no
 * longer be part of a stop string to out (*out_len bytes). Returns true when
 * a stop string completed: out then holds the text before it, and the matcher
 * drops everything else (later pushes are ignored). */
bool stop_push(stop_matcher *m, const char *text, size_t len, char *out, size_t *out_len);

/* At the end of a request without a match: the held-back text. */
size_t stop_flush(stop_matcher *m, char *out);

#endif
