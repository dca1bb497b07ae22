/* SPDX-License-Identifier: MIT */
/* config-change - a live setting's change: its log line and its reply entry */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* @v as a logfmt value in @buf (log_quote()): a string as it is, a number
 * or null as JSON has it. Returns @buf. */
const char *config_log_value(char *buf, const json_t *v);
/*
 * config_change() - a change of a live setting: its log line, notice
 * "@event key=K[ pipeline=P] old=O new=N @who[ note=...]" (@who: the asker's
 * logfmt fields), and its entry {"key", "old", "new"[, "pipeline"][, "note"]}
 * for a reply (@old and @new taken; NULL when out of memory).
 * config_change_log_level(): the log level set to @level, its line written at
 * the louder of both levels so that it is seen.
 * memory_limit_note(): the note of a memory limit below what is in use, in
 * @buf, or NULL when it is not.
 */
json_t *config_change(const char *event, const char *key, const char *pipeline, json_t *old,
                      json_t *new, const char *note, const char *who);
json_t *config_change_log_level(int level, const char *event, const char *who);
const char *memory_limit_note(char *buf, size_t len, uint64_t limit, uint64_t used);
