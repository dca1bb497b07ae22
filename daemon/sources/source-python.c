/* SPDX-License-Identifier: MIT */
/* source-python - a user's own torch Dataset, built by the user's Python workers
 *
 * The daemon runs no Python and reads no file for this kind: the spec
 * declares how many samples there are and the fields of one sample (the
 * client learnt them from dataset[0]), and pyworkers.c hands the batches'
 * rows to the owner's worker processes, which write them into the slots. The
 * source only describes; source_read() is never called for it.
 *
 * "dataset", "args", "digest", "collate", "seeding" and "structure" are the client's:
 * the daemon keeps them in the canonical form, so that two trainers join one
 * pipeline only when they name the same dataset, and hands them back in
 * status for a client that attaches by name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "source-private.h"
#include "spec.h"

#define PY_SAMPLES_MAX (1ull << 40)
#define PY_DIM_MAX (1ll << 31)
#define PY_SAMPLE_BYTES_MAX (1ull << 32)
#define PY_STRUCTURE_MAX 8192
#define PY_NAME_MAX 255               /* "module:qualname" */
#define PY_DIGEST_MAX 128
#define PY_JSON_DEPTH_MAX 128          /* nesting of "structure" and "args": every client
					 * parses them (Python's json stops near 1000) */

struct python_source {
	struct source base;
};

/* The nesting of objects and arrays in @v, counted no further than @limit + 1. */
static int json_depth(json_t *v, int limit)
{
	const char *key;
	json_t *x;
	size_t i;
	int most = 0, d;

	if (!json_is_object(v) && !json_is_array(v))
		return 0;
	if (limit <= 0)
		return 1;
	if (json_is_object(v)) {
		json_object_foreach(v, key, x)
			if ((d = json_depth(x, limit - 1)) > most)
				most = d;
	} else {
		json_array_foreach(v, i, x)
			if ((d = json_depth(x, limit - 1)) > most)
				most = d;
	}
	return most + 1;
}

static bool field_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > LDR_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* "module.sub:Qual.name": identifiers separated by dots, one colon. */
static bool import_path_ok(const char *s)
{
	const char *colon = strchr(s, ':');
	bool start = true;

	if (!colon || strchr(colon + 1, ':') || strlen(s) > PY_NAME_MAX)
		return false;
	for (const char *p = s; *p; p++) {
		char c = *p;
		if (c == '.' || c == ':') {
			if (start)
				return false;
			start = true;
			continue;
		}
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' ||
		      (!start && c >= '0' && c <= '9')))
			return false;
		start = false;
	}
	return !start;
}

/* One entry of source.fields into @f, its canonical form appended to @out. */
static int parse_field(json_t *v, size_t i, struct field_desc *f, bool *pad, json_t *out,
		       char *err, size_t errlen)
{
	static const char *const keys[] = { "name", "dtype", "shape", "pad", NULL };
	const char *key, *name, *dt;
	json_t *shape, *jpad, *canon, *jshape;
	uint64_t bytes;
	int dtype;

	if (!json_is_object(v))
		return spec_fail(err, errlen, "source.fields[%zu]: must be an object with name, dtype, shape", i);
	if ((key = spec_unknown_key(v, keys)))
		return spec_fail(err, errlen, "source.fields[%zu]: unknown key \"%s\"", i, key);
	name = spec_plain_string(json_object_get(v, "name"));
	if (!name || !field_name_ok(name))
		return spec_fail(err, errlen, "source.fields[%zu].name: must be 1..%d characters of "
				 "[A-Za-z0-9._-]", i, LDR_NAME_MAX);
	dt = spec_plain_string(json_object_get(v, "dtype"));
	if (!dt || (dtype = dtype_from_name(dt)) < 0)
		return spec_fail(err, errlen, "source.fields[%zu].dtype: must be one of bool, int8, "
				 "uint8, int16, uint16, int32, uint32, int64, uint64, float16, "
				 "bfloat16, float32, float64", i);
	shape = json_object_get(v, "shape");
	if (!json_is_array(shape) || json_array_size(shape) > LDR_MAX_DIMS - 1)
		return spec_fail(err, errlen, "source.fields[%zu].shape: must be an array of at most %d "
				 "sizes ([] for a scalar)", i, LDR_MAX_DIMS - 1);
	snprintf(f->name, sizeof(f->name), "%s", name);
	f->dtype = dtype;
	f->ndim = (int)json_array_size(shape);
	bytes = dtype_size(dtype);
	for (int d = 0; d < f->ndim; d++) {
		json_t *e = json_array_get(shape, (size_t)d);
		json_int_t n = json_is_integer(e) ? json_integer_value(e) : -1;
		if (n < 1 || n > PY_DIM_MAX)
			return spec_fail(err, errlen, "source.fields[%zu].shape[%d]: must be an integer in "
					 "1..2147483648", i, d);
		f->shape[d] = n;
		if (__builtin_mul_overflow(bytes, (uint64_t)n, &bytes) || bytes > PY_SAMPLE_BYTES_MAX)
			return spec_fail(err, errlen, "source.fields[%zu]: one sample of '%s' would be "
					 "over 4 GiB", i, name);
	}
	f->sample_bytes = (size_t)bytes;
	jpad = json_object_get(v, "pad");
	if (jpad && !json_is_boolean(jpad))
		return spec_fail(err, errlen, "source.fields[%zu].pad: must be true or false", i);
	*pad = jpad && json_is_true(jpad);
	if (*pad && f->ndim == 0)
		return spec_fail(err, errlen, "source.fields[%zu].pad: a scalar cannot be padded: pad is "
				 "for a field of variable length along its first dimension", i);
	jshape = json_array();
	for (int d = 0; jshape && d < f->ndim; d++)
		json_array_append_new(jshape, json_integer(f->shape[d]));
	canon = json_pack("{s:s, s:s, s:o, s:b}", "name", name, "dtype", dtype_name(dtype), "shape",
			  jshape, "pad", *pad);
	if (!canon || json_array_append_new(out, canon) < 0)
		return -ENOMEM;
	return 0;
}

static int parse_python(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "dataset", "args", "digest", "samples", "fields",
					    "structure", "collate", "seeding", NULL };
	struct field_desc fields[SOURCE_MAX_FIELDS];
	bool pad[SOURCE_MAX_FIELDS];
	const char *key, *dataset, *digest = "", *collate = "";
	bool seed_per_worker = false;
	json_t *v, *args, *jfields, *structure, *canon = NULL, *cfields = NULL;
	int64_t samples = 0;
	size_t nfields;
	char *text;
	int r;

	if ((key = spec_unknown_key(src, keys)))
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	dataset = spec_plain_string(json_object_get(src, "dataset"));
	if (!dataset || !import_path_ok(dataset))
		return spec_fail(err, errlen, "source.dataset: must name the Dataset class as "
				 "\"module:QualName\" (e.g. \"mypkg.data:ImageNetLMDB\")");
	args = json_object_get(src, "args");
	if (args && !json_is_object(args))
		return spec_fail(err, errlen, "source.args: must be an object (the keyword arguments "
				 "of the Dataset)");
	if (args && json_depth(args, PY_JSON_DEPTH_MAX) > PY_JSON_DEPTH_MAX)
		return spec_fail(err, errlen, "source.args: nested more than %d levels deep",
				 PY_JSON_DEPTH_MAX);
	if ((v = json_object_get(src, "digest"))) {
		if (!json_is_string(v) || json_string_length(v) > PY_DIGEST_MAX)
			return spec_fail(err, errlen, "source.digest: must be a string of at most %d "
					 "characters", PY_DIGEST_MAX);
		digest = json_string_value(v);
	}
	if ((v = json_object_get(src, "collate"))) {
		if (!json_is_string(v) || (json_string_length(v) && !import_path_ok(json_string_value(v))))
			return spec_fail(err, errlen, "source.collate: must be \"\" or name the collate_fn "
					 "as \"module:qualname\"");
		collate = json_string_value(v);
	}
	if ((v = json_object_get(src, "seeding"))) {
		const char *sv = spec_plain_string(v);
		if (!sv || (strcmp(sv, "sample") != 0 && strcmp(sv, "worker") != 0))
			return spec_fail(err, errlen, "source.seeding: must be \"sample\" (each sample "
					 "seeded from seed, epoch, index) or \"worker\" (each worker "
					 "seeded once, as torch's)");
		seed_per_worker = sv[0] == 'w';
	}
	if (!json_object_get(src, "samples"))
		return spec_fail(err, errlen, "source.samples: is required (len(dataset))");
	r = spec_get_int(src, "samples", "source.samples", 1, (int64_t)PY_SAMPLES_MAX,
			 "an integer in 1..2^40", &samples, err, errlen);
	if (r < 0)
		return r;
	jfields = json_object_get(src, "fields");
	if (!json_is_array(jfields) || json_array_size(jfields) < 1 ||
	    json_array_size(jfields) > SOURCE_MAX_FIELDS)
		return spec_fail(err, errlen, "source.fields: is required: an array of 1..%d fields "
				 "({\"name\", \"dtype\", \"shape\"})", SOURCE_MAX_FIELDS);
	structure = json_object_get(src, "structure");
	if (structure) {
		text = json_dumps(structure, JSON_COMPACT | JSON_ENCODE_ANY);
		size_t n = text ? strlen(text) : 0;
		free(text);
		if (n > PY_STRUCTURE_MAX)
			return spec_fail(err, errlen, "source.structure: %zu bytes of JSON, the most is %d",
					 n, PY_STRUCTURE_MAX);
		if (json_depth(structure, PY_JSON_DEPTH_MAX) > PY_JSON_DEPTH_MAX)
			return spec_fail(err, errlen, "source.structure: nested more than %d levels deep "
					 "in JSON (a sample's structure has at most 40 levels)",
					 PY_JSON_DEPTH_MAX);
	}

	nfields = json_array_size(jfields);
	cfields = json_array();
	if (!cfields)
		return -ENOMEM;
	for (size_t i = 0; i < nfields; i++) {
		r = parse_field(json_array_get(jfields, i), i, &fields[i], &pad[i], cfields, err, errlen);
		if (r < 0)
			goto fail;
		for (size_t j = 0; j < i; j++)
			if (strcmp(fields[j].name, fields[i].name) == 0) {
				r = spec_fail(err, errlen, "source.fields[%zu].name: \"%s\" is already used "
					      "by source.fields[%zu]", i, fields[i].name, j);
				goto fail;
			}
	}
	for (size_t i = 0; i < nfields; i++) {
		char want[LDR_NAME_MAX + 8];
		bool found = false;
		if (!pad[i])
			continue;
		snprintf(want, sizeof(want), "%s_len", fields[i].name);
		for (size_t j = 0; j < nfields; j++)
			if (strcmp(fields[j].name, want) == 0 && fields[j].ndim == 0 &&
			    fields[j].dtype == LDR_DTYPE_INT64)
				found = true;
		if (!found) {
			r = spec_fail(err, errlen, "source.fields[%zu]: \"pad\": true needs a field \"%s\" "
				      "(int64, shape []) for the lengths", i, want);
			goto fail;
		}
	}
	canon = json_pack("{s:s, s:s, s:o, s:s, s:I, s:o, s:o, s:s}", "kind", "python",
			  "dataset", dataset, "args", args ? json_incref(args) : json_object(),
			  "digest", digest, "samples", (json_int_t)samples, "fields", cfields,
			  "structure", structure ? json_incref(structure) : json_null(),
			  "collate", collate);
	/* "sample", the default, is left out: the canonical form of older specs */
	if (canon && seed_per_worker && json_object_set_new(canon, "seeding", json_string("worker")) < 0) {
		json_decref(canon);
		canon = NULL;
	}
	if (!canon)
		return -ENOMEM;
	spec->source.py = canon;
	spec->source.py_collate = collate[0] != '\0';
	return 0;

fail:
	json_decref(cfields);
	return r;
}

static json_t *python_json(const struct spec *spec)
{
	return json_deep_copy(spec->source.py);
}

/* on_error: "raise" (the default here: torch's DataLoader re-raises a
 * failed batch's exception in the trainer, and a later next() goes on),
 * "fail" or "skip" */
static int parse_python_options(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, "on_error");
	const char *s = json_is_string(v) ? json_string_value(v) : NULL;

	spec->on_error_fail = true;
	spec->on_error_raise = true;
	if (!v)
		return 0;
	if (s && strcmp(s, "skip") == 0)
		spec->on_error_fail = spec->on_error_raise = false;
	else if (s && strcmp(s, "fail") == 0)
		spec->on_error_raise = false;
	else if (!s || strcmp(s, "raise") != 0)
		return spec_fail(err, errlen, "on_error: must be raise, fail or skip");
	return 0;
}

static int python_options_json(const struct spec *spec, json_t *obj)
{
	return json_object_set_new(obj, "on_error", json_string(spec->on_error_raise ? "raise"
	                                                        : spec->on_error_fail ? "fail" : "skip"));
}

static const char *const python_options[] = { "on_error", NULL };

static int python_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	json_t *jfields = json_object_get(spec->source.py, "fields");
	json_t *f;
	size_t i;

	base->nsamples = (uint64_t)json_integer_value(json_object_get(spec->source.py, "samples"));
	json_array_foreach(jfields, i, f) {
		struct field_desc *d = &base->fields[i];
		json_t *shape = json_object_get(f, "shape");
		uint64_t bytes;

		snprintf(d->name, sizeof(d->name), "%s", json_string_value(json_object_get(f, "name")));
		d->dtype = dtype_from_name(json_string_value(json_object_get(f, "dtype")));
		d->ndim = (int)json_array_size(shape);
		bytes = dtype_size(d->dtype);
		for (int k = 0; k < d->ndim; k++) {
			d->shape[k] = json_integer_value(json_array_get(shape, (size_t)k));
			bytes *= (uint64_t)d->shape[k];
		}
		d->sample_bytes = (size_t)bytes;
	}
	base->nfields = json_array_size(jfields);
	if (base->nfields == 0 || base->nsamples == 0)
		return errfmt(-EINVAL, err, errlen, "python source: no fields or no samples");
	return 0;
}

static int python_read(struct source *src, const struct sample_ctx *ctx, uint64_t idx,
		       void *const *dsts, char *err, size_t errlen)
{
	(void)src, (void)ctx, (void)dsts;
	return errfmt(-ENOTSUP, err, errlen, "sample %llu: a python source is built by its "
		      "Python workers, not read by the daemon", (unsigned long long)idx);
}

static void python_close(struct source *src)
{
	(void)src;
}

const struct source_ops source_python_ops = {
	.parse = parse_python,
	.options = python_options,
	.options_for = "python",
	.parse_options = parse_python_options,
	.source_json = python_json,
	.options_json = python_options_json,
	.size = sizeof(struct python_source),
	.open = python_open,
	.read = python_read,
	.close = python_close,
	.external = true,
};
