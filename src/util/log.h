/* SPDX-License-Identifier: MIT */
/*
 * Levelled logging.  URDMA_LOG_LEVEL=error|warn|info|debug|trace (default
 * warn) and URDMA_LOG_FILE=path (default stderr).  The level is tested before
 * anything is formatted, errno is preserved, and data-path messages
 * (urdma_trace) compile away unless URDMA_DEBUG is defined.
 */
#ifndef URDMA_LOG_H
#define URDMA_LOG_H

enum urdma_log_level {
	URDMA_LOG_ERROR,
	URDMA_LOG_WARN,
	URDMA_LOG_INFO,
	URDMA_LOG_DEBUG,
	URDMA_LOG_TRACE,
};

extern int urdma_log_level;
void urdma_log_init(void);
void urdma_log_write(int level, const char *func, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define urdma_log(lvl, ...)                                                    \
	do {                                                                   \
		if ((lvl) <= urdma_log_level)                                  \
			urdma_log_write((lvl), __func__, __VA_ARGS__);         \
	} while (0)

#define urdma_err(...) urdma_log(URDMA_LOG_ERROR, __VA_ARGS__)
#define urdma_warn(...) urdma_log(URDMA_LOG_WARN, __VA_ARGS__)
#define urdma_info(...) urdma_log(URDMA_LOG_INFO, __VA_ARGS__)
#define urdma_dbg(...) urdma_log(URDMA_LOG_DEBUG, __VA_ARGS__)
#ifdef URDMA_DEBUG
#define urdma_trace(...) urdma_log(URDMA_LOG_TRACE, __VA_ARGS__)
#else
#define urdma_trace(...) do { } while (0)
#endif

#endif
