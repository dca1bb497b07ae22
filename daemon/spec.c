/* SPDX-License-Identifier: MIT */
/* spec - parse and validate a pipeline spec (JSON, docs/spec.md) */

/*
 * A spec arrives from untrusted clients and from the config file, so every
 * key is checked: unknown keys, wrong types and out-of-range values are errors
 * whose message names the key ("spec: source.dtype: must be one of ...").
 * The parsed spec keeps a canonical JSON copy with every default filled in:
 * status output shows it, and two specs are equal when those copies are.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "spec.h"

#define SPEC_TEXT_MAX (256 * 1024)
#define SPEC_NPY_MAX_PATHS 16
#define SEQ_LEN_MAX (1u << 24)
#define BATCH_SIZE_MAX 1048576
#define PREFETCH_MIN 2
#define PREFETCH_MAX 1024
#define MIN_CLIENTS_MAX 1024

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		int n = snprintf(err, errlen, "spec: ");
		if (n < 0 || (size_t)n >= errlen)
			n = 0;
		va_start(ap, fmt);
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static bool key_in(const char *key, const char *const *keys)
{
	for (; *keys; keys++)
		if (strcmp(key, *keys) == 0)
			return true;
	return false;
}

/* The first key of @obj not in @keys, or NULL. */
static const char *unknown_key(json_t *obj, const char *const *keys)
{
	const char *key;
	json_t *v;

	json_object_foreach(obj, key, v) {
		if (!key_in(key, keys))
			return key;
	}
	return NULL;
}

/* An integer in [min, max]; absent keeps *out. */
static int get_int(json_t *obj, const char *key, const char *label, int64_t min, int64_t max,
		   const char *what, int64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return fail(err, errlen, "%s: must be %s", label, what);
	*out = json_integer_value(v);
	return 0;
}

static int get_bool(json_t *obj, const char *key, bool *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return fail(err, errlen, "%s: must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* A non-empty string without NUL bytes, or NULL. */
static const char *plain_string(json_t *v)
{
	const char *s;

	if (!json_is_string(v))
		return NULL;
	s = json_string_value(v);
	if (!*s || strlen(s) != json_string_length(v))
		return NULL;
	return s;
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

int spec_npy_stem(const char *path, char buf[LDR_NAME_MAX + 1])
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	n = strlen(base);
	if (n > 4 && strcmp(base + n - 4, ".npy") == 0)
		n -= 4;
	if (n == 0 || n > LDR_NAME_MAX)
		return -EINVAL;
	memcpy(buf, base, n);
	buf[n] = '\0';
	return (int)n;
}

static int parse_tokens(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "path", "dtype", "seq_len", "output_dtype", NULL };
	const char *key = unknown_key(src, keys);
	const char *s;
	json_t *v;
	int64_t seq_len = 0;
	int r;

	if (key)
		return fail(err, errlen, "unknown key \"source.%s\"", key);

	v = json_object_get(src, "path");
	if (!v)
		return fail(err, errlen, "source.path: is required");
	s = plain_string(v);
	if (!s)
		return fail(err, errlen, "source.path: must be a non-empty string");
	spec->source.path = strdup(s);
	if (!spec->source.path)
		return -ENOMEM;

	spec->source.dtype = LDR_DTYPE_UINT16;
	v = json_object_get(src, "dtype");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "uint16") == 0)
			spec->source.dtype = LDR_DTYPE_UINT16;
		else if (strcmp(s, "uint32") == 0)
			spec->source.dtype = LDR_DTYPE_UINT32;
		else if (strcmp(s, "int32") == 0)
			spec->source.dtype = LDR_DTYPE_INT32;
		else
			return fail(err, errlen, "source.dtype: must be one of uint16, uint32, int32");
	}

	if (!json_object_get(src, "seq_len"))
		return fail(err, errlen, "source.seq_len: is required");
	r = get_int(src, "seq_len", "source.seq_len", 1, SEQ_LEN_MAX, "an integer in 1..16777216",
		    &seq_len, err, errlen);
	if (r < 0)
		return r;
	spec->source.seq_len = (uint32_t)seq_len;

	spec->source.output_dtype = LDR_DTYPE_INT64;
	v = json_object_get(src, "output_dtype");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "int64") == 0)
			spec->source.output_dtype = LDR_DTYPE_INT64;
		else if (strcmp(s, dtype_name(spec->source.dtype)) == 0)
			spec->source.output_dtype = spec->source.dtype;
		else
			return fail(err, errlen,
				    "source.output_dtype: must be int64 or the source dtype (%s)",
				    dtype_name(spec->source.dtype));
	}
	return 0;
}

static int parse_npy(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "paths", NULL };
	char stems[SPEC_NPY_MAX_PATHS][LDR_NAME_MAX + 1];
	const char *key = unknown_key(src, keys);
	json_t *arr;
	size_t n;

	if (key)
		return fail(err, errlen, "unknown key \"source.%s\"", key);
	arr = json_object_get(src, "paths");
	if (!arr)
		return fail(err, errlen, "source.paths: is required");
	n = json_is_array(arr) ? json_array_size(arr) : 0;
	if (n < 1 || n > SPEC_NPY_MAX_PATHS)
		return fail(err, errlen, "source.paths: must be an array of 1..%d strings",
			    SPEC_NPY_MAX_PATHS);
	spec->source.paths = calloc(n, sizeof(*spec->source.paths));
	if (!spec->source.paths)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = plain_string(json_array_get(arr, i));

		if (!s)
			return fail(err, errlen, "source.paths[%zu]: must be a non-empty string", i);
		if (spec_npy_stem(s, stems[i]) < 0)
			return fail(err, errlen,
				    "source.paths[%zu]: the file stem (the field name) must be 1..%d characters",
				    i, LDR_NAME_MAX);
		for (size_t j = 0; j < i; j++)
			if (strcmp(stems[i], stems[j]) == 0)
				return fail(err, errlen,
					    "source.paths[%zu]: field name \"%s\" (the file stem) is already used by source.paths[%zu]",
					    i, stems[i], j);
		spec->source.paths[i] = strdup(s);
		if (!spec->source.paths[i])
			return -ENOMEM;
		spec->source.npaths = i + 1;
	}
	return 0;
}

static json_t *spec_build_json(const struct spec *spec)
{
	json_t *src, *obj;

	if (spec->kind == SOURCE_TOKENS) {
		src = json_pack("{s:s, s:s, s:s, s:I, s:s}", "kind", "tokens",
				"path", spec->source.path,
				"dtype", dtype_name(spec->source.dtype),
				"seq_len", (json_int_t)spec->source.seq_len,
				"output_dtype", dtype_name(spec->source.output_dtype));
	} else {
		json_t *paths = json_array();

		for (size_t i = 0; paths && i < spec->source.npaths; i++) {
			if (json_array_append_new(paths, json_string(spec->source.paths[i])) < 0) {
				json_decref(paths);
				paths = NULL;
			}
		}
		src = paths ? json_pack("{s:s, s:o}", "kind", "npy", "paths", paths) : NULL;
	}
	if (!src)
		return NULL;
	obj = json_pack("{s:s, s:o, s:I, s:b, s:I, s:b, s:I, s:I, s:I}",
			"name", spec->name,
			"source", src,
			"batch_size", (json_int_t)spec->batch_size,
			"shuffle", spec->shuffle,
			"seed", (json_int_t)spec->seed,
			"drop_last", spec->drop_last,
			"epochs", (json_int_t)spec->epochs,
			"prefetch", (json_int_t)spec->prefetch,
			"min_clients", (json_int_t)spec->min_clients);
	return obj;
}

static int spec_fill(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	static const char *const keys[] = { "name", "source", "batch_size", "shuffle", "seed",
					    "drop_last", "epochs", "prefetch", "min_clients", NULL };
	const char *key, *s;
	json_t *v, *src;
	int64_t i;
	int r;

	if (!json_is_object(obj))
		return fail(err, errlen, "must be a JSON object");
	key = unknown_key(obj, keys);
	if (key)
		return fail(err, errlen, "unknown key \"%s\"", key);

	v = json_object_get(obj, "name");
	if (!v)
		return fail(err, errlen, "name: is required");
	s = plain_string(v);
	if (!s || !name_valid(s))
		return fail(err, errlen,
			    "name: must be 1..%d characters of [A-Za-z0-9._-], not starting with '.' or '-'",
			    LDR_NAME_MAX);
	memcpy(spec->name, s, strlen(s) + 1);

	src = json_object_get(obj, "source");
	if (!src)
		return fail(err, errlen, "source: is required");
	if (!json_is_object(src))
		return fail(err, errlen, "source: must be an object");
	v = json_object_get(src, "kind");
	if (!v)
		return fail(err, errlen, "source.kind: is required");
	s = json_is_string(v) ? json_string_value(v) : "";
	if (strcmp(s, "tokens") == 0) {
		spec->kind = SOURCE_TOKENS;
		r = parse_tokens(spec, src, err, errlen);
	} else if (strcmp(s, "npy") == 0) {
		spec->kind = SOURCE_NPY;
		r = parse_npy(spec, src, err, errlen);
	} else {
		r = fail(err, errlen, "source.kind: must be one of tokens, npy");
	}
	if (r < 0)
		return r;

	i = 32;
	r = get_int(obj, "batch_size", "batch_size", 1, BATCH_SIZE_MAX, "an integer in 1..1048576",
		    &i, err, errlen);
	if (r < 0)
		return r;
	spec->batch_size = (uint32_t)i;

	spec->shuffle = false;
	r = get_bool(obj, "shuffle", &spec->shuffle, err, errlen);
	if (r < 0)
		return r;

	i = 0;
	r = get_int(obj, "seed", "seed", 0, INT64_MAX, "a non-negative integer", &i, err, errlen);
	if (r < 0)
		return r;
	spec->seed = (uint64_t)i;

	spec->drop_last = false;
	r = get_bool(obj, "drop_last", &spec->drop_last, err, errlen);
	if (r < 0)
		return r;

	i = 1;
	r = get_int(obj, "epochs", "epochs", 0, INT64_MAX, "a non-negative integer (0 = endless)",
		    &i, err, errlen);
	if (r < 0)
		return r;
	spec->epochs = (uint64_t)i;

	i = 8;
	r = get_int(obj, "prefetch", "prefetch", PREFETCH_MIN, PREFETCH_MAX,
		    "an integer in 2..1024", &i, err, errlen);
	if (r < 0)
		return r;
	spec->prefetch = (uint32_t)i;

	i = 1;
	r = get_int(obj, "min_clients", "min_clients", 1, MIN_CLIENTS_MAX,
		    "an integer in 1..1024", &i, err, errlen);
	if (r < 0)
		return r;
	spec->min_clients = (uint32_t)i;

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
		return -ENOMEM;
	r = spec_fill(spec, obj, err, errlen);
	if (r < 0) {
		if (r == -ENOMEM && err && errlen)
			snprintf(err, errlen, "spec: out of memory");
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
		return fail(err, errlen, "empty");
	if (strnlen(text, SPEC_TEXT_MAX + 1) > SPEC_TEXT_MAX)
		return fail(err, errlen, "longer than %d bytes", SPEC_TEXT_MAX);
	obj = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!obj)
		return fail(err, errlen, "invalid JSON at line %d, column %d: %s", jerr.line,
			    jerr.column, jerr.text);
	r = spec_from_json(out, obj, err, errlen);
	json_decref(obj);
	return r;
}

struct spec *spec_free(struct spec *spec)
{
	if (!spec)
		return NULL;
	free(spec->source.path);
	for (size_t i = 0; i < spec->source.npaths; i++)
		free(spec->source.paths[i]);
	free(spec->source.paths);
	json_decref(spec->json);
	free(spec);
	return NULL;
}

bool spec_equal(const struct spec *a, const struct spec *b)
{
	if (!a || !b)
		return a == b;
	return json_equal(a->json, b->json);
}
