#include "server/think.h"

#include <stdlib.h>
#include <string.h>

enum { T_OPEN, T_LEAD_THINK, T_THINK, T_LEAD_ANSWER, T_ANSWER };

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

typedef struct sb {
    char *p;
    size_t n, cap;
    bool oom;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static bool finish(sb *c, sb *r, srv_think_out *out) {
    if (c->oom || r->oom) {
        free(c->p);
        free(r->p);
        memset(out, 0, sizeof *out);
        return false;
    }
    *out = (srv_think_out){c->p, r->p, c->n, r->n};
    return true;
}

bool srv_think_push(srv_think *t, const char *s, size_t n, srv_think_out *out) {
    sb c = {0}, r = {0};
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        switch (t->state) {
        case T_OPEN: /* does the reply open with <think>? */
            if (ch == OPEN[t->held]) {
                if (++t->held == sizeof OPEN - 1) t->held = 0, t->state = T_LEAD_THINK;
            } else {
                sb_add(&c, OPEN, t->held);
                sb_add(&c, &ch, 1);
                t->held = 0;
                t->state = T_ANSWER;
            }
            break;
        case T_LEAD_THINK:
        case T_LEAD_ANSWER: /* newlines right after a tag are layout, not text */
            if (ch == '\n') break;
            t->state = t->state == T_LEAD_THINK ? T_THINK : T_ANSWER;
            /* fall through */
        case T_THINK:
            if (t->state == T_ANSWER) {
                sb_add(&c, &ch, 1);
                break;
            }
            if (ch == CLOSE[t->held]) {
                if (++t->held == sizeof CLOSE - 1) t->held = 0, t->state = T_LEAD_ANSWER;
            } else {
                sb_add(&r, CLOSE, t->held);
                t->held = 0;
                if (ch == CLOSE[0])
                    t->held = 1;
                else
                    sb_add(&r, &ch, 1);
            }
            break;
        default:
            sb_add(&c, &ch, 1);
            break;
        }
    }
    return finish(&c, &r, out);
}

bool srv_think_flush(srv_think *t, srv_think_out *out) {
    sb c = {0}, r = {0};
    if (t->state == T_OPEN)
        sb_add(&c, OPEN, t->held);
    else if (t->state == T_THINK)
        sb_add(&r, CLOSE, t->held);
    t->held = 0;
    return finish(&c, &r, out);
}
