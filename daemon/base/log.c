/* SPDX-License-Identifier: MIT */
/* log - leveled messages to stderr
 *
 * Under systemd (JOURNAL_STREAM set) each line starts with the <N> syslog
 * priority prefix that journald understands; on a terminal it starts with the
 * level's name instead. One write per line, so lines of several threads do not
 * interleave.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "log.h"

_Atomic int log_max_level = LOG_INFO;

static const char *const names[] = {
	[LOG_ERR] = "error", [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
	[LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

int log_level_from_name(const char *name)
{
	for (int i = LOG_ERR; i <= LOG_DEBUG; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	return -EINVAL;
}

const char *log_level_name(int level)
{
	return level >= LOG_ERR && level <= LOG_DEBUG ? names[level] : "?";
}

void log_msg(int level, const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	if (level > log_max_level)
		return;
	if (getenv("JOURNAL_STREAM"))
		n = snprintf(line, sizeof(line), "<%d>", level);
	else
		n = snprintf(line, sizeof(line), "loaderd: %s: ", names[level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
}

bool log_limit_pass(struct log_limit *l, uint64_t now_ms)
{
	if (l->logged < LOG_LIMIT_BURST) {
		l->logged++;
		return true;
	}
	if (l->quiet++ == 0)
		l->quiet_since_ms = now_ms;
	return false;
}

uint64_t log_limit_due(struct log_limit *l, uint64_t now_ms, bool final, uint64_t *span_ms)
{
	uint64_t n = l->quiet;

	if (!n || (!final && now_ms - l->quiet_since_ms < LOG_LIMIT_INTERVAL_MS))
		return 0;
	*span_ms = now_ms - l->quiet_since_ms;
	l->quiet = 0;
	return n;
}

const char *log_quote(char buf[LOG_QUOTE_MAX], const char *raw)
{
	char s[LOG_QUOTE_MAX];
	size_t n = 0;
	bool plain;

	/* printable UTF-8 first: control characters and invalid bytes become spaces */
	text_clean(s, sizeof(s) - 2, raw, ' ');
	plain = s[0] != '\0';
	for (const char *p = s; *p && plain; p++)
		plain = *p != ' ' && *p != '"' && *p != '=' && *p != '\\';
	if (plain) {
		memcpy(buf, s, strlen(s) + 1);
		return buf;
	}
	buf[n++] = '"';
	for (const char *p = s; *p && n < LOG_QUOTE_MAX - 3; p++) {
		if (*p == '"' || *p == '\\') {
			if (n >= LOG_QUOTE_MAX - 4)
				break;
			buf[n++] = '\\';
		}
		buf[n++] = *p;
	}
	buf[n++] = '"';
	buf[n] = '\0';
	return buf;
}

bool log_rate_pass(struct log_rate *r, uint64_t now_ms)
{
	if (!r->n || now_ms - r->window_ms >= LOG_RATE_WINDOW_MS) {
		r->window_ms = now_ms;
		r->n = 0;
	}
	if (r->n < LOG_RATE_EVENTS) {
		r->n++;
		return true;
	}
	if (r->quiet++ == 0)
		r->quiet_since_ms = now_ms;
	return false;
}

uint64_t log_rate_due(struct log_rate *r, uint64_t now_ms, bool final, uint64_t *span_ms)
{
	uint64_t n = r->quiet;

	if (!n || (!final && now_ms - r->window_ms < LOG_RATE_WINDOW_MS))
		return 0;
	*span_ms = now_ms - r->quiet_since_ms;
	r->quiet = 0;
	return n;
}
