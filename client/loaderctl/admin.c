/* SPDX-License-Identifier: MIT */
/* admin - the admin commands set and reload */

#include "loaderctl.h"

/* `set` keys as loaderctl spells them, the daemon's key, and the arguments. */
static const struct set_key {
	const char *name;
	const char *key;
	bool pipeline;                 /* takes PIPELINE before the value */
} set_keys[] = {
	{ "workers", "workers", false },
	{ "prefetch", "prefetch", true },
	{ "log-level", "log_level", false },
	{ "memory-limit", "memory_limit", false },
};

static const struct set_key *set_key_find(const char *name)
{
	for (size_t i = 0; i < sizeof(set_keys) / sizeof(set_keys[0]); i++) {
		const char *a = set_keys[i].name, *b = name;
		/* log-level and log_level alike */
		while (*a && (*a == *b || (*a == '-' && *b == '_')))
			a++, b++;
		if (!*a && !*b)
			return &set_keys[i];
	}
	return NULL;
}

struct set_args {
	const char *key, *pipeline, *value;
};

static int call_set(struct ldr_client *client, void *arg, char **text)
{
	struct set_args *a = arg;
	return ldr_set(client, a->key, a->pipeline, a->value, text);
}

/* A JSON value as people read it: 8, "debug" as debug, null as none. */
static void fmt_setting(char *buf, size_t n, json_t *v)
{
	char *s;

	if (json_is_string(v))
		snprintf(buf, n, "%s", json_string_value(v));
	else if (json_is_null(v) || !v)
		snprintf(buf, n, "(default)");
	else if ((s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT))) {
		snprintf(buf, n, "%s", s);
		free(s);
	} else
		snprintf(buf, n, "?");
}

/* "  workers: 2 -> 4" and its note. */
static void print_change(const char *indent, json_t *c)
{
	char old[256], new[256];
	const char *pl = json_string_value(json_object_get(c, "pipeline"));
	const char *note = json_string_value(json_object_get(c, "note"));

	fmt_setting(old, sizeof(old), json_object_get(c, "old"));
	fmt_setting(new, sizeof(new), json_object_get(c, "new"));
	printf("%s%s%s%s: %s -> %s\n", indent, json_string_value(json_object_get(c, "key")),
	       pl ? " of " : "", pl ? pl : "", old, new);
	if (note)
		printf("%s  (%s)\n", indent, note);
}

int cmd_set(struct ctl *ctl, int argc, char **argv)
{
	const struct set_key *k = set_key_find(argv[0]);
	struct set_args a;
	json_t *rep;
	int r;

	if (!k)
		usage_error("set: unknown setting -- '%s' (workers, prefetch, log-level, memory-limit)",
		            argv[0]);
	if (argc != (k->pipeline ? 3 : 2))
		usage_error("set %s: %s", k->name, k->pipeline ? "usage: set prefetch PIPELINE N"
		            : argc < 2 ? "missing the value" : "one value only");
	a = (struct set_args){ k->key, k->pipeline ? argv[1] : NULL, argv[argc - 1] };
	if ((r = json_request(ctl, "set", &rep, call_set, &a)))
		return r;
	if (ctl->json)
		return print_json(rep);
	print_change("", rep);
	json_decref(rep);
	return 0;
}

static int call_reload(struct ldr_client *client, void *arg, char **text)
{
	(void)arg;
	return ldr_reload(client, text);
}

/* "created a, b" for a non-empty list of names (or of {"name"} objects). */
static void print_names(const char *what, json_t *list)
{
	size_t i;
	json_t *v;

	if (!json_array_size(list))
		return;
	printf("  %s:", what);
	json_array_foreach(list, i, v) {
		const char *name = json_is_string(v) ? json_string_value(v)
		                                     : json_string_value(json_object_get(v, "name"));
		json_t *clients = json_object_get(v, "clients");
		const char *changed = json_string_value(json_object_get(v, "changed"));
		printf("%s %s", i ? "," : "", name ? name : "?");
		if (json_integer_value(clients))
			printf(" (%" JSON_INTEGER_FORMAT " client%s finish%s the epoch)",
			       json_integer_value(clients), json_integer_value(clients) == 1 ? "" : "s",
			       json_integer_value(clients) == 1 ? "es" : "");
		else if (json_is_integer(clients))
			printf(" (no client: dropped)");
		if (changed)
			printf(" (%s)", changed);
	}
	printf("\n");
}

int cmd_reload(struct ctl *ctl, int argc, char **argv)
{
	json_t *rep, *v, *pls, *failed;
	size_t i;
	int r;

	if ((r = json_request(ctl, "reload", &rep, call_reload, NULL)))
		return r;
	pls = json_object_get(rep, "pipelines");
	failed = json_object_get(pls, "failed");
	r = json_array_size(failed) ? EXIT_FAILURE : 0;
	if (ctl->json) {
		int p = print_json(rep);
		return p ? p : r;
	}
	printf("reloaded %s\n", json_string_value(json_object_get(rep, "file")));
	if (!json_array_size(json_object_get(rep, "changed")))
		printf("  no setting changed\n");
	json_array_foreach(json_object_get(rep, "changed"), i, v)
		print_change("  ", v);
	if (json_array_size(json_object_get(rep, "restart_needed")))
		printf("needs a restart (the file differs from what loaderd runs with):\n");
	json_array_foreach(json_object_get(rep, "restart_needed"), i, v) {
		char run[512], file[512];
		fmt_setting(run, sizeof(run), json_object_get(v, "running"));
		fmt_setting(file, sizeof(file), json_object_get(v, "file"));
		printf("  %s: %s (running), %s (file)\n", json_string_value(json_object_get(v, "key")),
		       run, file);
	}
	printf("pipelines:\n");
	print_names("created", json_object_get(pls, "created"));
	print_names("replaced for new attachments", json_object_get(pls, "replaced"));
	print_names("draining", json_object_get(pls, "draining"));
	print_names("unchanged", json_object_get(pls, "unchanged"));
	json_array_foreach(failed, i, v)
		warnx("reload: pipeline %s: %s", json_string_value(json_object_get(v, "name")),
		      json_string_value(json_object_get(v, "error")));
	json_decref(rep);
	return r;
}
