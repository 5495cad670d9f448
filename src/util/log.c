// SPDX-License-Identifier: MIT
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

int urdma_log_level = URDMA_LOG_WARN;
static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static const char *const level_names[] = {
	[URDMA_LOG_ERROR] = "error", [URDMA_LOG_WARN] = "warn",
	[URDMA_LOG_INFO] = "info",   [URDMA_LOG_DEBUG] = "debug",
	[URDMA_LOG_TRACE] = "trace",
};

static void log_setup(void)
{
	const char *lvl = getenv("URDMA_LOG_LEVEL");
	const char *path = getenv("URDMA_LOG_FILE");

	if (lvl) {
		for (int i = 0; i <= URDMA_LOG_TRACE; i++)
			if (!strcasecmp(lvl, level_names[i]))
				urdma_log_level = i;
		if (lvl[0] >= '0' && lvl[0] <= '4' && !lvl[1])
			urdma_log_level = lvl[0] - '0';
	}
	if (path && *path) {
		log_file = fopen(path, "ae");
		if (log_file)
			setvbuf(log_file, NULL, _IOLBF, 0);
	}
	if (!log_file)
		log_file = stderr;
}

void urdma_log_init(void)
{
	pthread_once(&log_once, log_setup);
}

void urdma_log_write(int level, const char *func, const char *fmt, ...)
{
	int saved = errno;
	char buf[512];
	int n;
	va_list ap;

	urdma_log_init();
	n = snprintf(buf, sizeof(buf), "urdma[%d] %s: %s: ", (int)getpid(),
		     level_names[level], func);
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(buf))
		vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
	va_end(ap);
	fprintf(log_file, "%s\n", buf);
	errno = saved;
}
