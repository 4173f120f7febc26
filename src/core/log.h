/* Logging to stderr; the level comes from TOKAMAK_LOG (error|warn|info|debug),
 * default warn. Never called inside a step's hot path. */
#ifndef TK_CORE_LOG_H
#define TK_CORE_LOG_H

enum { TK_LOG_ERROR = 0, TK_LOG_WARN = 1, TK_LOG_INFO = 2, TK_LOG_DEBUG = 3 };

void tk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define tk_log_error(...) tk_log(TK_LOG_ERROR, __VA_ARGS__)
#define tk_log_warn(...)  tk_log(TK_LOG_WARN, __VA_ARGS__)
#define tk_log_info(...)  tk_log(TK_LOG_INFO, __VA_ARGS__)
#define tk_log_debug(...) tk_log(TK_LOG_DEBUG, __VA_ARGS__)

#endif
