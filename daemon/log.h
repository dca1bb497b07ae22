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

/* Whether to write this occurrence (true) or only count it (false). */
bool log_limit_pass(struct log_limit *l, uint64_t now_ms);
/* The count of the occurrences not written, when a summary is due (at least
 * LOG_LIMIT_INTERVAL_MS since the first of them, or @final), and *@span_ms
 * the time they took; 0 when none is due. The count starts over. */
uint64_t log_limit_due(struct log_limit *l, uint64_t now_ms, bool final, uint64_t *span_ms);
