/* SPDX-License-Identifier: MIT */
/* log - leveled messages to stderr (journald reads the <N> prefixes) */
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_ERR = 3, LOG_WARNING = 4, LOG_NOTICE = 5, LOG_INFO = 6, LOG_DEBUG = 7 };

/* Changed live (loaderctl set log-level, a reload) while other threads log. */
extern _Atomic int log_max_level;
/* Its name, "info"; "?" for none. */
const char *log_level_name(int level);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parse "error", "warning", "notice", "info", "debug"; -EINVAL if none. */
int log_level_from_name(const char *name);

/*
 * An event (docs/operations.md, "Logs"): one line, the event's name and then
 * key=value fields, as logfmt has them:
 *
 *	log_event(LOG_INFO, "client.attach", "client=%" PRIu64 " pid=%d pipeline=%s", ...);
 *	-> loaderd: info: client.attach client=8 pid=6463 pipeline=tok
 *
 * A value that may hold spaces, quotes or '=' (names, paths, messages) goes
 * through log_quote().
 */
#define log_event(level, event, ...) log_msg(level, event " " __VA_ARGS__)
/* @s as a logfmt value in @buf: as it is when it needs no quotes, else in
 * double quotes with " and \ escaped and control bytes as spaces; cut to
 * fit. Returns @buf. */
#define LOG_QUOTE_MAX 512
const char *log_quote(char buf[LOG_QUOTE_MAX], const char *s);

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/*
 * A warning a peer can repeat at will (a malformed request): each occurrence
 * goes through log_limit_pass(). The first LOG_LIMIT_BURST of a peer are
 * written; later ones are only counted, and log_limit_due() hands out the
 * count for one summary line at most every LOG_LIMIT_INTERVAL_MS (and at the
 * end, @final), so a flood writes LOG_LIMIT_BURST lines and then one line an
 * interval. Zero-initialized is ready. Not thread-safe (the loop's).
 */
#define LOG_LIMIT_BURST 5
#define LOG_LIMIT_INTERVAL_MS 10000

struct log_limit {
	uint64_t logged;              /* occurrences written one by one */
	uint64_t quiet;               /* counted, not written, since the last summary */
	uint64_t quiet_since_ms;      /* when the first of those came */
};

/*
 * The events of one client (its attaches, creates): at most LOG_RATE_EVENTS
 * written per LOG_RATE_WINDOW_MS; the rest are counted, and log_rate_due()
 * hands out the count once its window is over (or at the end, @final) for one
 * summary line. A client that attaches in a loop writes LOG_RATE_EVENTS lines
 * and a summary every window, however fast it goes. Zero-initialized is
 * ready. Not thread-safe (the loop's).
 */
#define LOG_RATE_EVENTS 20
#define LOG_RATE_WINDOW_MS 10000

struct log_rate {
	uint64_t window_ms;           /* when the current window began */
	uint32_t n;                   /* events written in it */
	uint64_t quiet;               /* counted, not written, since the last summary */
	uint64_t quiet_since_ms;
};

bool log_rate_pass(struct log_rate *r, uint64_t now_ms);
/* Events not written whose summary is due, and *@span_ms the time they took;
 * 0 when none is. The count starts over. */
uint64_t log_rate_due(struct log_rate *r, uint64_t now_ms, bool final, uint64_t *span_ms);

/* Whether to write this occurrence (true) or only count it (false). */
bool log_limit_pass(struct log_limit *l, uint64_t now_ms);
/* The count of the occurrences not written, when a summary is due (at least
 * LOG_LIMIT_INTERVAL_MS since the first of them, or @final), and *@span_ms
 * the time they took; 0 when none is due. The count starts over. */
uint64_t log_limit_due(struct log_limit *l, uint64_t now_ms, bool final, uint64_t *span_ms);
