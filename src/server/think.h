/* Splitting a Qwen3 reply into its thinking and its answer, as text streams in:
 * "<think>\nreasoning\n</think>\n\nanswer" gives reasoning_content "reasoning\n"
 * and content "answer". A reply that does not open with <think> is all answer.
 * Tags split across pushes are held back until they resolve. */
#ifndef TK_SERVER_THINK_H
#define TK_SERVER_THINK_H

#include <stdbool.h>
#include <stddef.h>

typedef struct srv_think {
    int state;   /* where in the reply: opening tag, thinking, answer (see think.c) */
    size_t held; /* bytes of a tag matched so far and not yet emitted */
} srv_think;

/* What one push or flush produced (malloc'd, NUL-terminated, or NULL when empty). */
typedef struct srv_think_out {
    char *content, *reasoning;
    size_t n_content, n_reasoning;
} srv_think_out;

/* false only without memory. */
bool srv_think_push(srv_think *t, const char *s, size_t n, srv_think_out *out);
/* The end of the reply: emit what is held back. */
bool srv_think_flush(srv_think *t, srv_think_out *out);

#endif
