/* SPDX-License-Identifier: MIT */
/* log - leveled messages to stderr (journald reads the <N> prefixes) */
#pragma once

enum log_level { LOG_ERR = 3, LOG_WARNING = 4, LOG_NOTICE = 5, LOG_INFO = 6, LOG_DEBUG = 7 };

extern int log_max_level;

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parse "error", "warning", "notice", "info", "debug"; -EINVAL if none. */
int log_level_from_name(const char *name);

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
