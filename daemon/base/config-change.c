/* SPDX-License-Identifier: MIT */
/* config-change - a live setting's change: its log line and its reply entry
 *
 * A setting changes live two ways: a reload of the config file (reload.c,
 * the process's top) and an admin's `loaderctl set` (server/admin.c). Both
 * log and answer a change alike, so it is written once, below both.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "config-change.h"
#include "log.h"

const char *config_log_value(char *buf, const json_t *v)
{
	char *text;

	if (json_is_string(v))
		return log_quote(buf, json_string_value(v));
	text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
	log_quote(buf, text ? text : "?");
	free(text);
	return buf;
}

json_t *config_change(const char *event, const char *key, const char *pipeline, json_t *old,
                      json_t *new, const char *note, const char *who)
{
	char o[LOG_QUOTE_MAX], n[LOG_QUOTE_MAX], q[LOG_QUOTE_MAX];
	json_t *e;

	log_msg(LOG_NOTICE, "%s key=%s%s%s old=%s new=%s %s%s%s", event, key,
	          pipeline ? " pipeline=" : "", pipeline ? pipeline : "", config_log_value(o, old),
	          config_log_value(n, new), who, note ? " note=" : "", note ? log_quote(q, note) : "");
	e = json_pack("{s:s, s:o, s:o}", "key", key, "old", old, "new", new);
	if (e && pipeline)
		json_object_set_new(e, "pipeline", json_string(pipeline));
	if (e && note)
		json_object_set_new(e, "note", json_string(note));
	return e;
}

json_t *config_change_log_level(int level, const char *event, const char *who)
{
	int old = log_max_level;
	json_t *e;

	/* the line says it at the louder of both levels, so it is seen */
	if (level > old)
		log_max_level = level;
	e = config_change(event, "log_level", NULL, json_string(log_level_name(old)),
	                  json_string(log_level_name(level)), NULL, who);
	log_max_level = level;
	return e;
}

const char *memory_limit_note(char *buf, size_t len, uint64_t limit, uint64_t used)
{
	if (limit >= used)
		return NULL;
	snprintf(buf, len, "%" PRIu64 " bytes are in use, above the new limit: nothing is freed, "
	         "creates are refused until pipelines are dropped", used);
	return buf;
}
