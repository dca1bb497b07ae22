/* SPDX-License-Identifier: MIT */
/* spec - parse and validate a pipeline spec (JSON, docs/spec.md) */

/*
 * A spec arrives from untrusted clients and from the config file, so every
 * key is checked: unknown keys, wrong types and out-of-range values are errors
 * whose message names the key ("spec: source.dtype: must be one of ...").
 * The parsed spec keeps a canonical JSON copy with every default filled in:
 * status output shows it, and two specs are equal when those copies are.
 *
 * This file parses the keys every spec has. What depends on source.kind (the
 * other keys of "source", and top-level keys such as an image source's
 * "transforms") is parsed by that kind's source_ops (source-private.h),
 * found through the kind table.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/creds.h"
#include "source-private.h"
#include "spec.h"

#define SPEC_TEXT_MAX (256 * 1024)
#define BATCH_SIZE_MAX 1048576
#define PREFETCH_MIN 2
#define PREFETCH_MAX 1024
#define SHUFFLE_WINDOW_MAX 65536 /* a webdataset's shards at most */
#define MIN_CLIENTS_MAX 1024

/*
 * The top-level keys of every spec, each parsed by one of the steps in
 * spec_fill() and, unless it is a lifetime or access key, written back by
 * spec_build_json(). A source kind's own keys are in its source_ops.
 */
static const char *const generic_keys[] = { "name", "source", "batch_size", "shuffle", "seed",
					    "shuffle_window",
					    "drop_last", "epochs", "prefetch", "min_clients",
					    "persist", "ttl", "access", "group", "slow_clients",
					    "slow_client_timeout", "max_lag", NULL };

/* errfmt with "spec: " in front, and always -EINVAL: every spec error is
 * one of the client's input (common.h, the error idiom). */
int spec_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	verrfmt(-EINVAL, err, errlen, "spec: ", fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static bool key_in(const char *key, const char *const *keys)
{
	for (; keys && *keys; keys++)
		if (strcmp(key, *keys) == 0)
			return true;
	return false;
}

const char *spec_unknown_key(json_t *obj, const char *const *keys)
{
	const char *key;
	json_t *v;

	json_object_foreach(obj, key, v) {
		if (!key_in(key, keys))
			return key;
	}
	return NULL;
}

int spec_get_int(json_t *obj, const char *key, const char *label, int64_t min, int64_t max,
		 const char *what, int64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return spec_fail(err, errlen, "%s: must be %s", label, what);
	*out = json_integer_value(v);
	return 0;
}

static int get_bool(json_t *obj, const char *key, bool *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return spec_fail(err, errlen, "%s: must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

bool spec_get_number(json_t *v, double *out)
{
	if (!json_is_number(v))
		return false;
	*out = json_number_value(v);
	return true;
}

const char *spec_plain_string(json_t *v)
{
	const char *s;

	if (!json_is_string(v))
		return NULL;
	s = json_string_value(v);
	if (!*s || strlen(s) != json_string_length(v))
		return NULL;
	return s;
}

int spec_required_path(json_t *src, char **out, char *err, size_t errlen)
{
	json_t *v = json_object_get(src, "path");
	const char *s;

	if (!v)
		return spec_fail(err, errlen, "source.path: is required");
	s = spec_plain_string(v);
	if (!s)
		return spec_fail(err, errlen, "source.path: must be a non-empty string");
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
}

json_t *spec_strings_json(char **v, size_t n)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr && i < n; i++) {
		if (json_array_append_new(arr, json_string(v[i])) < 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	return arr;
}

static bool name_valid(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > LDR_NAME_MAX || s[0] == '.' || s[0] == '-')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static json_t *spec_build_json(const struct spec *spec)
{
	const struct source_ops *ops = source_kind_ops(spec->kind);
	json_t *src = ops->source_json(spec), *obj;

	if (!src)
		return NULL;
	obj = json_pack("{s:s, s:o, s:I, s:b, s:I, s:b, s:I, s:o, s:I}",
			"name", spec->name,
			"source", src,
			"batch_size", (json_int_t)spec->batch_size,
			"shuffle", spec->shuffle,
			"seed", (json_int_t)spec->seed,
			"drop_last", spec->drop_last,
			"epochs", (json_int_t)spec->epochs,
			"prefetch", spec->prefetch ? json_integer((json_int_t)spec->prefetch)
						   : json_string("auto"),
			"min_clients", (json_int_t)spec->min_clients);
	/* only when set, so that every spec written before it keeps its form */
	if (obj && spec->shuffle_window &&
	    json_object_set_new(obj, "shuffle_window", json_integer(spec->shuffle_window)) < 0)
		obj = (json_decref(obj), NULL);
	if (obj && ops->options_json && ops->options_json(spec, obj) < 0)
		obj = (json_decref(obj), NULL);
	return obj;
}

/* ---- the steps of spec_fill(), in the order their errors take ---- */

/* Every top-level key is a generic one or some source kind's own. */
static int check_keys(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	const char *key;
	json_t *v;

	(void)spec;
	json_object_foreach(obj, key, v) {
		bool known = key_in(key, generic_keys);

		for (size_t i = 0; !known && i < source_nkinds; i++)
			known = key_in(key, source_kinds[i].ops->options);
		if (!known)
			return spec_fail(err, errlen, "unknown key \"%s\"", key);
	}
	return 0;
}

static int parse_name(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, "name");
	const char *s;

	if (!v)
		return spec_fail(err, errlen, "name: is required");
	s = spec_plain_string(v);
	if (!s || !name_valid(s))
		return spec_fail(err, errlen,
				 "name: must be 1..%d characters of [A-Za-z0-9._-], not starting with '.' or '-'",
				 LDR_NAME_MAX);
	memcpy(spec->name, s, strlen(s) + 1);
	return 0;
}

static int bad_kind(char *err, size_t errlen)
{
	char names[256];
	size_t n = 0;

	names[0] = '\0';
	for (size_t i = 0; i < source_nkinds && n < sizeof(names); i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      source_kinds[i].name);
	return spec_fail(err, errlen, "source.kind: must be one of %s", names);
}

/* source.kind, then the kind's parse hooks: the source object, its own keys. */
static int parse_source(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *src = json_object_get(obj, "source"), *v;
	const struct source_kind_entry *kind;
	const struct source_ops *ops;
	int r;

	if (!src)
		return spec_fail(err, errlen, "source: is required");
	if (!json_is_object(src))
		return spec_fail(err, errlen, "source: must be an object");
	v = json_object_get(src, "kind");
	if (!v)
		return spec_fail(err, errlen, "source.kind: is required");
	kind = source_kind_named(json_is_string(v) ? json_string_value(v) : "");
	if (!kind)
		return bad_kind(err, errlen);
	spec->kind = kind->kind;
	ops = kind->ops;
	r = ops->parse(spec, src, err, errlen);
	if (r < 0)
		return r;
	for (size_t i = 0; i < source_nkinds; i++) {
		const struct source_ops *other = source_kinds[i].ops;

		if (other == ops || !other->options)
			continue;
		for (const char *const *key = other->options; *key; key++)
			if (!key_in(*key, ops->options) && json_object_get(obj, *key))
				return spec_fail(err, errlen, "%s: only for %s", *key,
						 other->options_for);
	}
	return ops->parse_options ? ops->parse_options(spec, obj, err, errlen) : 0;
}

/* A shard-aware shuffle (docs/spec.md, "Shuffle windows"): after shuffle. */
static int parse_shuffle_window(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	const char *kind = "";
	int64_t w = 0;
	int r;

	spec->shuffle_window = 0;
	r = spec_get_int(obj, "shuffle_window", "shuffle_window", 0, SHUFFLE_WINDOW_MAX,
			 "an integer in 0..65536", &w, err, errlen);
	if (r < 0 || !w)
		return r;
	for (size_t k = 0; k < source_nkinds; k++)
		if (source_kinds[k].kind == spec->kind)
			kind = source_kinds[k].name;
	if (spec->kind != SOURCE_WEBDATASET)
		return spec_fail(err, errlen, "shuffle_window: only for a source of shards "
				 "(webdataset), not %s", kind);
	if (!spec->shuffle)
		return spec_fail(err, errlen, "shuffle_window: needs \"shuffle\": true");
	spec->shuffle_window = (uint32_t)w;
	return 0;
}

static int parse_sampling(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *v;
	int64_t i;
	int r;

	i = 32;
	r = spec_get_int(obj, "batch_size", "batch_size", 1, BATCH_SIZE_MAX,
			 "an integer in 1..1048576", &i, err, errlen);
	if (r < 0)
		return r;
	spec->batch_size = (uint32_t)i;

	spec->shuffle = false;
	r = get_bool(obj, "shuffle", &spec->shuffle, err, errlen);
	if (r < 0)
		return r;

	i = 0;
	r = spec_get_int(obj, "seed", "seed", 0, INT64_MAX, "a non-negative integer", &i, err,
			 errlen);
	if (r < 0)
		return r;
	spec->seed = (uint64_t)i;

	r = parse_shuffle_window(spec, obj, err, errlen);
	if (r < 0)
		return r;

	spec->drop_last = false;
	r = get_bool(obj, "drop_last", &spec->drop_last, err, errlen);
	if (r < 0)
		return r;

	i = 1;
	r = spec_get_int(obj, "epochs", "epochs", 0, INT64_MAX,
			 "a non-negative integer (0 = endless)", &i, err, errlen);
	if (r < 0)
		return r;
	spec->epochs = (uint64_t)i;

	/* not given, or "auto": sized at create from the slot bytes (0 here) */
	i = 0;
	v = json_object_get(obj, "prefetch");
	if (!json_is_string(v) || strcmp(json_string_value(v), "auto") != 0) {
		r = spec_get_int(obj, "prefetch", "prefetch", PREFETCH_MIN, PREFETCH_MAX,
				 "an integer in 2..1024, or \"auto\"", &i, err, errlen);
		if (r < 0)
			return r;
	}
	spec->prefetch = (uint32_t)i;

	i = 1;
	r = spec_get_int(obj, "min_clients", "min_clients", 1, MIN_CLIENTS_MAX,
			 "an integer in 1..1024", &i, err, errlen);
	if (r < 0)
		return r;
	spec->min_clients = (uint32_t)i;
	return 0;
}

/*
 * persist and ttl: how long the daemon keeps the pipeline once nobody uses it
 * (docs/spec.md, "Lifetime"). They are left out of the canonical form.
 */
static int parse_lifetime(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, "ttl");
	double ttl;
	int r;

	spec->has_persist = json_object_get(obj, "persist") != NULL;
	r = get_bool(obj, "persist", &spec->persist, err, errlen);
	if (r < 0)
		return r;
	if (!v)
		return 0;
	if (!spec_get_number(v, &ttl) || !(ttl >= 0) || ttl > SPEC_TTL_MAX_S)
		return spec_fail(err, errlen, "ttl: must be a number of seconds in 0..%d",
				 SPEC_TTL_MAX_S);
	if (spec->persist)
		return spec_fail(err, errlen, "ttl: not with persist: true (a persistent pipeline is "
				 "kept until it is dropped)");
	spec->has_ttl = true;
	spec->ttl_ms = (uint64_t)llround(ttl * 1000.0);
	return 0;
}

/*
 * access and group: who besides the owner may use the pipeline
 * (docs/security.md). Left out of the canonical form, as the lifetime keys;
 * whether the creator belongs to the group is the engine's to check.
 */
static int parse_access(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	static const char *const names[] = { [SPEC_ACCESS_OWNER] = "owner",
					     [SPEC_ACCESS_GROUP] = "group", [SPEC_ACCESS_ALL] = "all" };
	json_t *v = json_object_get(obj, "access"), *g = json_object_get(obj, "group");
	gid_t gid;
	int r;

	if (v) {
		const char *t = json_is_string(v) ? json_string_value(v) : "";
		for (int i = SPEC_ACCESS_OWNER; i <= SPEC_ACCESS_ALL; i++)
			if (strcmp(t, names[i]) == 0)
				spec->access = i;
		if (spec->access == SPEC_ACCESS_DEFAULT)
			return spec_fail(err, errlen, "access: must be one of \"owner\", \"group\", \"all\"");
	}
	if (!g)
		return 0;
	if (spec->access != SPEC_ACCESS_GROUP)
		return spec_fail(err, errlen, "group: only with \"access\": \"group\"");
	if (json_is_string(g) && *json_string_value(g)) {
		if ((r = creds_group_by_name(json_string_value(g), &gid)) == -ENOENT)
			return spec_fail(err, errlen, "group: no group %s on this machine",
					 json_string_value(g));
		if (r < 0)
			return spec_fail(err, errlen, "group: cannot look up the group %s: %s",
					 json_string_value(g), strerror(-r));
		spec->group = (unsigned)gid;
	} else if (json_is_integer(g) && json_integer_value(g) >= 0 &&
		   json_integer_value(g) < (json_int_t)UINT32_MAX) {
		spec->group = (unsigned)json_integer_value(g);
	} else {
		return spec_fail(err, errlen, "group: must be a group name or a gid");
	}
	spec->has_group = true;
	return 0;
}

/*
 * slow_clients, slow_client_timeout, max_lag: what a stopped broadcast client
 * does to the others (docs/spec.md, "Slow broadcast clients"). Not part of
 * the canonical form: the creator's decide.
 */
static int parse_slow(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, "slow_clients");
	double secs;
	int64_t lag = 0;
	int r;

	if (v) {
		const char *t = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(t, "skip") != 0 && strcmp(t, "wait") != 0)
			return spec_fail(err, errlen, "slow_clients: must be \"wait\" or \"skip\"");
		spec->slow_skip = strcmp(t, "skip") == 0;
	}
	if ((v = json_object_get(obj, "slow_client_timeout"))) {
		if (!spec_get_number(v, &secs) || !(secs >= 0.1) || secs > SPEC_SLOW_TIMEOUT_MAX_S)
			return spec_fail(err, errlen, "slow_client_timeout: must be a number of seconds "
					 "in 0.1..%d", SPEC_SLOW_TIMEOUT_MAX_S);
		spec->has_slow_timeout = true;
		spec->slow_timeout_ms = (uint64_t)llround(secs * 1000.0);
	}
	r = spec_get_int(obj, "max_lag", "max_lag", 1, PREFETCH_MAX, "an integer in 1..1024", &lag,
			 err, errlen);
	if (r < 0)
		return r;
	spec->max_lag = (uint32_t)lag;
	return 0;
}

typedef int spec_step(struct spec *spec, json_t *obj, char *err, size_t errlen);

/* A new generic key: in generic_keys, parsed by one of these, in spec_build_json(). */
static spec_step *const spec_steps[] = {
	check_keys, parse_name, parse_source, parse_sampling, parse_lifetime, parse_access,
	parse_slow,
};

static int spec_fill(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	if (!json_is_object(obj))
		return spec_fail(err, errlen, "must be a JSON object");
	for (size_t i = 0; i < ARRAY_SIZE(spec_steps); i++) {
		int r = spec_steps[i](spec, obj, err, errlen);

		if (r < 0)
			return r;
	}
	spec->json = spec_build_json(spec);
	return spec->json ? 0 : -ENOMEM;
}

int spec_from_json(struct spec **out, json_t *obj, char *err, size_t errlen)
{
	struct spec *spec;
	int r;

	if (err && errlen)
		err[0] = '\0';
	spec = calloc(1, sizeof(*spec));
	if (!spec)
		return errfmt(-ENOMEM, err, errlen, "spec: out of memory");
	r = spec_fill(spec, obj, err, errlen);
	if (r < 0) {
		if (r == -ENOMEM)
			errfmt(r, err, errlen, "spec: out of memory");
		spec_free(spec);
		return r;
	}
	*out = spec;
	return 0;
}

int spec_parse(struct spec **out, const char *text, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *obj;
	int r;

	if (err && errlen)
		err[0] = '\0';
	if (!text)
		return spec_fail(err, errlen, "empty");
	if (strnlen(text, SPEC_TEXT_MAX + 1) > SPEC_TEXT_MAX)
		return spec_fail(err, errlen, "longer than %d bytes", SPEC_TEXT_MAX);
	obj = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!obj)
		return spec_fail(err, errlen, "invalid JSON at line %d, column %d: %s", jerr.line,
				 jerr.column, jerr.text);
	r = spec_from_json(out, obj, err, errlen);
	json_decref(obj);
	return r;
}

struct spec *spec_free(struct spec *spec)
{
	const struct source_ops *ops;

	if (!spec)
		return NULL;
	ops = source_kind_ops(spec->kind);
	if (ops && ops->free_spec)
		ops->free_spec(spec);
	free(spec->source.path);
	for (size_t i = 0; i < spec->source.npaths; i++)
		free(spec->source.paths[i]);
	free(spec->source.paths);
	free(spec->source.root);
	for (size_t i = 0; i < spec->source.nurls; i++)
		free(spec->source.urls[i]);
	free(spec->source.urls);
	json_decref(spec->source.py);
	json_decref(spec->source.mg);
	json_decref(spec->json);
	source_keys_put(spec->keys);
	free(spec);
	return NULL;
}

bool spec_equal(const struct spec *a, const struct spec *b)
{
	if (!a || !b)
		return a == b;
	return json_equal(a->json, b->json);
}

uint64_t spec_hash(const struct spec *spec)
{
	char *text = json_dumps(spec->json, JSON_COMPACT | JSON_SORT_KEYS);
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */

	if (!text)
		return 0;
	for (const unsigned char *p = (const unsigned char *)text; *p; p++)
		h = (h ^ *p) * 0x100000001b3ULL;
	free(text);
	return h;
}

/* --- how two specs differ ------------------------------------------------ */

#define DIFF_VALUE_MAX 72

struct diff {
	char *buf;
	size_t len, pos;
	size_t count, shown;
	bool full;
};

static void diff_value(char *out, size_t n, const json_t *v)
{
	char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15)) : NULL;

	if (!s)
		snprintf(out, n, "none");
	else if (strlen(s) > DIFF_VALUE_MAX)
		snprintf(out, n, "%.*s...", DIFF_VALUE_MAX - 3, s);
	else
		snprintf(out, n, "%s", s);
	free(s);
}

/* One differing key; room is kept for the ", and N more" ending. */
static void diff_add(struct diff *d, const char *key, const json_t *want, const json_t *have)
{
	char a[DIFF_VALUE_MAX + 1], b[DIFF_VALUE_MAX + 1], item[2 * DIFF_VALUE_MAX + 160];
	int n;

	d->count++;
	if (d->full)
		return;
	diff_value(a, sizeof(a), want);
	diff_value(b, sizeof(b), have);
	if (want)
		n = snprintf(item, sizeof(item), "%s%s %s (it has %s)", d->shown ? ", " : "", key, a, b);
	else
		n = snprintf(item, sizeof(item), "%sno %s (it has %s)", d->shown ? ", " : "", key, b);
	if (n < 0 || d->pos + (size_t)n + 24 >= d->len) {
		d->full = true;
		return;
	}
	memcpy(d->buf + d->pos, item, (size_t)n + 1);
	d->pos += (size_t)n;
	d->shown++;
}

static void diff_objects(struct diff *d, const char *prefix, json_t *want, json_t *have)
{
	const char *key;
	json_t *v;

	json_object_foreach(want, key, v) {
		json_t *h = json_object_get(have, key);
		char path[256];

		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", key);
		if (json_is_object(v) && json_is_object(h))
			diff_objects(d, path, v, h);
		else if (!h || !json_equal(v, h))
			diff_add(d, path, v, h);
	}
	json_object_foreach(have, key, v) {
		char path[256];

		if (json_object_get(want, key))
			continue;
		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", key);
		diff_add(d, path, NULL, v);
	}
}

size_t spec_diff(const struct spec *want, const struct spec *have, char *buf, size_t len)
{
	struct diff d = { .buf = buf, .len = len };

	if (!len)
		return 0;
	buf[0] = '\0';
	if (!want || !have)
		return 0;
	diff_objects(&d, "", want->json, have->json);
	if (d.count > d.shown)
		snprintf(buf + d.pos, len - d.pos, "%sand %zu more", d.shown ? ", " : "", d.count - d.shown);
	return d.count;
}
