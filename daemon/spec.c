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
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "imageset.h"
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

/* source.path: a required non-empty string, copied into *out. */
static int required_path(json_t *src, char **out, char *err, size_t errlen)
{
	json_t *v = json_object_get(src, "path");
	const char *s;

	if (!v)
		return fail(err, errlen, "source.path: is required");
	s = plain_string(v);
	if (!s)
		return fail(err, errlen, "source.path: must be a non-empty string");
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
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

	r = required_path(src, &spec->source.path, err, errlen);
	if (r < 0)
		return r;

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

/* ---- image sources ---- */

static int parse_image_folder(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "path", NULL };
	const char *key = unknown_key(src, keys);

	if (key)
		return fail(err, errlen, "unknown key \"source.%s\"", key);
	return required_path(src, &spec->source.root, err, errlen);
}

static int parse_webdataset(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "urls", NULL };
	const char *key = unknown_key(src, keys);
	char msg[256];
	json_t *arr;
	size_t n;

	if (key)
		return fail(err, errlen, "unknown key \"source.%s\"", key);
	arr = json_object_get(src, "urls");
	if (!arr)
		return fail(err, errlen, "source.urls: is required");
	n = json_is_string(arr) ? 1 : json_is_array(arr) ? json_array_size(arr) : 0;
	if (n < 1 || n > SPEC_URLS_MAX)
		return fail(err, errlen,
			    "source.urls: must be a string or an array of 1..%d strings (paths of .tar shards, brace patterns allowed)",
			    SPEC_URLS_MAX);
	spec->source.urls = calloc(n, sizeof(*spec->source.urls));
	if (!spec->source.urls)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = plain_string(json_is_string(arr) ? arr : json_array_get(arr, i));
		long cnt;

		if (!s)
			return fail(err, errlen, "source.urls[%zu]: must be a non-empty string", i);
		cnt = brace_expand(s, NULL, msg, sizeof(msg));
		if (cnt < 0)
			return cnt == -ENOMEM ? -ENOMEM
					      : fail(err, errlen, "source.urls[%zu]: %s", i, msg);
		spec->source.urls[i] = strdup(s);
		if (!spec->source.urls[i])
			return -ENOMEM;
		spec->source.nurls = i + 1;
	}
	return 0;
}

/* A number, as a double. */
static bool get_number(json_t *v, double *out)
{
	if (!json_is_number(v))
		return false;
	*out = json_number_value(v);
	return true;
}

/* [a, b] with lo < a <= b <= hi (hi may be INFINITY); absent keeps *out. */
static int get_range(json_t *op, const char *key, size_t i, double lo, double hi,
		     const char *what, double out[2], char *err, size_t errlen)
{
	json_t *v = json_object_get(op, key);
	double a, b;

	if (!v)
		return 0;
	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !get_number(json_array_get(v, 0), &a) || !get_number(json_array_get(v, 1), &b) ||
	    !(a > lo) || !(a <= b) || !(b <= hi))
		return fail(err, errlen, "transforms[%zu].%s: must be %s", i, key, what);
	out[0] = a;
	out[1] = b;
	return 0;
}

/* size: an integer, or [h, w] (@pair_only: an integer means [s, s]). */
static int get_size(json_t *op, size_t i, bool shorter_side, uint32_t size[2], char *err,
		    size_t errlen)
{
	json_t *v = json_object_get(op, "size");
	json_int_t h, w;

	if (!v)
		return fail(err, errlen, "transforms[%zu].size: is required", i);
	if (json_is_integer(v)) {
		h = json_integer_value(v);
		w = shorter_side ? 0 : h;
		if (h < 1 || h > SPEC_IMAGE_SIZE_MAX)
			goto bad;
	} else if (json_is_array(v) && json_array_size(v) == 2 &&
		   json_is_integer(json_array_get(v, 0)) && json_is_integer(json_array_get(v, 1))) {
		h = json_integer_value(json_array_get(v, 0));
		w = json_integer_value(json_array_get(v, 1));
		if (h < 1 || h > SPEC_IMAGE_SIZE_MAX || w < 1 || w > SPEC_IMAGE_SIZE_MAX)
			goto bad;
	} else {
		goto bad;
	}
	size[0] = (uint32_t)h;
	size[1] = (uint32_t)w;
	return 0;
bad:
	return fail(err, errlen, "transforms[%zu].size: must be an integer in 1..%d or [height, width]%s",
		    i, SPEC_IMAGE_SIZE_MAX,
		    shorter_side ? " (an integer is the shorter side)" : "");
}

/* normalize's mean or std: 1 or 3 numbers (one per channel, R G B). */
static int get_channels(json_t *op, const char *key, size_t i, bool positive, double out[3],
			char *err, size_t errlen)
{
	json_t *v = json_object_get(op, key);
	size_t n = json_is_array(v) ? json_array_size(v) : 0;

	if (!v)
		return fail(err, errlen, "transforms[%zu].%s: is required", i, key);
	if (n != 1 && n != 3)
		goto bad;
	for (size_t c = 0; c < 3; c++) {
		double d;

		if (!get_number(json_array_get(v, n == 1 ? 0 : c), &d) || !isfinite(d) ||
		    (positive && !(d > 0)) || fabs(d) > 1e30)
			goto bad;
		out[c] = d;
	}
	return 0;
bad:
	return fail(err, errlen, "transforms[%zu].%s: must be an array of 1 or 3 %snumbers", i, key,
		    positive ? "positive " : "");
}

static int parse_transform(struct transform *t, json_t *op, size_t i, char *err, size_t errlen)
{
	static const char *const rrc_keys[] = { "op", "size", "scale", "ratio", NULL };
	static const char *const size_keys[] = { "op", "size", NULL };
	static const char *const flip_keys[] = { "op", "p", NULL };
	static const char *const norm_keys[] = { "op", "mean", "std", NULL };
	const char *const *keys;
	const char *name, *key;
	json_t *v;
	int r;

	if (!json_is_object(op))
		return fail(err, errlen, "transforms[%zu]: must be an object with an \"op\"", i);
	v = json_object_get(op, "op");
	if (!v)
		return fail(err, errlen, "transforms[%zu].op: is required", i);
	name = json_is_string(v) ? json_string_value(v) : "";
	if (strcmp(name, "random_resized_crop") == 0) {
		t->op = TRANSFORM_RANDOM_RESIZED_CROP;
		keys = rrc_keys;
	} else if (strcmp(name, "resize") == 0) {
		t->op = TRANSFORM_RESIZE;
		keys = size_keys;
	} else if (strcmp(name, "center_crop") == 0) {
		t->op = TRANSFORM_CENTER_CROP;
		keys = size_keys;
	} else if (strcmp(name, "horizontal_flip") == 0) {
		t->op = TRANSFORM_HORIZONTAL_FLIP;
		keys = flip_keys;
	} else if (strcmp(name, "normalize") == 0) {
		t->op = TRANSFORM_NORMALIZE;
		keys = norm_keys;
	} else {
		return fail(err, errlen,
			    "transforms[%zu].op: must be one of random_resized_crop, resize, center_crop, horizontal_flip, normalize",
			    i);
	}
	key = unknown_key(op, keys);
	if (key)
		return fail(err, errlen, "unknown key \"transforms[%zu].%s\"", i, key);

	switch (t->op) {
	case TRANSFORM_RANDOM_RESIZED_CROP:
		r = get_size(op, i, false, t->size, err, errlen);
		if (r < 0)
			return r;
		t->scale[0] = 0.08;
		t->scale[1] = 1.0;
		r = get_range(op, "scale", i, 0, 1, "[min, max] with 0 < min <= max <= 1", t->scale,
			      err, errlen);
		if (r < 0)
			return r;
		t->ratio[0] = 3.0 / 4.0;
		t->ratio[1] = 4.0 / 3.0;
		return get_range(op, "ratio", i, 0, 1000,
				 "[min, max] with 0 < min <= max <= 1000", t->ratio, err, errlen);
	case TRANSFORM_RESIZE:
		return get_size(op, i, true, t->size, err, errlen);
	case TRANSFORM_CENTER_CROP:
		return get_size(op, i, false, t->size, err, errlen);
	case TRANSFORM_HORIZONTAL_FLIP:
		t->p = 0.5;
		v = json_object_get(op, "p");
		if (v && (!get_number(v, &t->p) || !(t->p >= 0 && t->p <= 1)))
			return fail(err, errlen, "transforms[%zu].p: must be a number in [0, 1]", i);
		return 0;
	case TRANSFORM_NORMALIZE:
		r = get_channels(op, "mean", i, false, t->mean, err, errlen);
		if (r < 0)
			return r;
		return get_channels(op, "std", i, true, t->std, err, errlen);
	}
	return 0;
}

/*
 * The output size after the transforms, from what each one fixes: a crop or an
 * exact resize fixes both sides; resizing the shorter side keeps the size
 * unknown unless it was known before.
 */
static int image_output_size(struct spec *spec, char *err, size_t errlen)
{
	bool known = false;
	uint64_t h = 0, w = 0;

	for (size_t i = 0; i < spec->ntransforms; i++) {
		const struct transform *t = &spec->transforms[i];

		switch (t->op) {
		case TRANSFORM_RANDOM_RESIZED_CROP:
		case TRANSFORM_CENTER_CROP:
			known = true;
			h = t->size[0];
			w = t->size[1];
			break;
		case TRANSFORM_RESIZE:
			if (t->size[1]) {
				known = true;
				h = t->size[0];
				w = t->size[1];
			} else if (known) {
				transform_resize_dims(t, (uint32_t)h, (uint32_t)w, &h, &w);
				if (h < 1 || w < 1 || h > SPEC_IMAGE_SIZE_MAX || w > SPEC_IMAGE_SIZE_MAX)
					return fail(err, errlen,
						    "transforms[%zu].size: the image would be %llux%llu, more than %d on a side",
						    i, (unsigned long long)h, (unsigned long long)w,
						    SPEC_IMAGE_SIZE_MAX);
			}
			break;
		default:
			break;
		}
	}
	if (!known)
		return fail(err, errlen,
			    "transforms: the output image size depends on each image; end with random_resized_crop, center_crop or resize to [height, width] so that every sample has the same shape");
	if (h * w * 3 * 4 > (256u << 20))
		return fail(err, errlen, "transforms: output images of %llux%llu are too large",
			    (unsigned long long)h, (unsigned long long)w);
	spec->image_h = (uint32_t)h;
	spec->image_w = (uint32_t)w;
	return 0;
}

static int parse_image_options(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	static const char *const out_keys[] = { "dtype", "layout", NULL };
	static const char *const dec_keys[] = { "dct_scaling", NULL };
	json_t *v, *arr;
	const char *s, *key;
	int normalize_at = -1;
	int r;

	arr = json_object_get(obj, "transforms");
	if (arr) {
		if (!json_is_array(arr) || json_array_size(arr) > SPEC_TRANSFORMS_MAX)
			return fail(err, errlen, "transforms: must be an array of at most %d transforms",
				    SPEC_TRANSFORMS_MAX);
		for (size_t i = 0; i < json_array_size(arr); i++) {
			r = parse_transform(&spec->transforms[i], json_array_get(arr, i), i, err,
					    errlen);
			if (r < 0)
				return r;
			spec->ntransforms = i + 1;
			if (spec->transforms[i].op == TRANSFORM_NORMALIZE) {
				if (normalize_at >= 0)
					return fail(err, errlen,
						    "transforms[%zu]: normalize may appear once (also transforms[%d])",
						    i, normalize_at);
				normalize_at = (int)i;
			}
		}
	}

	spec->image_dtype = LDR_DTYPE_FLOAT32;
	spec->image_nhwc = false;
	v = json_object_get(obj, "output");
	if (v) {
		json_t *d, *l;

		if (!json_is_object(v))
			return fail(err, errlen, "output: must be an object");
		key = unknown_key(v, out_keys);
		if (key)
			return fail(err, errlen, "unknown key \"output.%s\"", key);
		d = json_object_get(v, "dtype");
		if (d) {
			s = json_is_string(d) ? json_string_value(d) : "";
			if (strcmp(s, "uint8") == 0)
				spec->image_dtype = LDR_DTYPE_UINT8;
			else if (strcmp(s, "float16") == 0)
				spec->image_dtype = LDR_DTYPE_FLOAT16;
			else if (strcmp(s, "bfloat16") == 0)
				spec->image_dtype = LDR_DTYPE_BFLOAT16;
			else if (strcmp(s, "float32") == 0)
				spec->image_dtype = LDR_DTYPE_FLOAT32;
			else
				return fail(err, errlen,
					    "output.dtype: must be one of uint8, float16, bfloat16, float32");
		}
		l = json_object_get(v, "layout");
		if (l) {
			s = json_is_string(l) ? json_string_value(l) : "";
			if (strcmp(s, "NHWC") == 0)
				spec->image_nhwc = true;
			else if (strcmp(s, "NCHW") != 0)
				return fail(err, errlen, "output.layout: must be NCHW or NHWC");
		}
	}
	if (normalize_at >= 0 && spec->image_dtype == LDR_DTYPE_UINT8)
		return fail(err, errlen,
			    "transforms[%d]: normalize needs output.dtype float16, bfloat16 or float32, not uint8",
			    normalize_at);

	spec->on_error_fail = false;
	v = json_object_get(obj, "on_error");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "fail") == 0)
			spec->on_error_fail = true;
		else if (strcmp(s, "skip") != 0)
			return fail(err, errlen, "on_error: must be skip or fail");
	}

	spec->dct_scaling = true;
	v = json_object_get(obj, "decode");
	if (v) {
		json_t *b;

		if (!json_is_object(v))
			return fail(err, errlen, "decode: must be an object");
		key = unknown_key(v, dec_keys);
		if (key)
			return fail(err, errlen, "unknown key \"decode.%s\"", key);
		b = json_object_get(v, "dct_scaling");
		if (b && !json_is_boolean(b))
			return fail(err, errlen, "decode.dct_scaling: must be true or false");
		if (b)
			spec->dct_scaling = json_is_true(b);
	}
	return image_output_size(spec, err, errlen);
}

static json_t *transform_json(const struct transform *t)
{
	switch (t->op) {
	case TRANSFORM_RANDOM_RESIZED_CROP:
		return json_pack("{s:s, s:[I,I], s:[f,f], s:[f,f]}", "op", "random_resized_crop",
				 "size", (json_int_t)t->size[0], (json_int_t)t->size[1],
				 "scale", t->scale[0], t->scale[1], "ratio", t->ratio[0], t->ratio[1]);
	case TRANSFORM_RESIZE:
		if (!t->size[1])
			return json_pack("{s:s, s:I}", "op", "resize", "size", (json_int_t)t->size[0]);
		return json_pack("{s:s, s:[I,I]}", "op", "resize", "size", (json_int_t)t->size[0],
				 (json_int_t)t->size[1]);
	case TRANSFORM_CENTER_CROP:
		return json_pack("{s:s, s:[I,I]}", "op", "center_crop", "size",
				 (json_int_t)t->size[0], (json_int_t)t->size[1]);
	case TRANSFORM_HORIZONTAL_FLIP:
		return json_pack("{s:s, s:f}", "op", "horizontal_flip", "p", t->p);
	case TRANSFORM_NORMALIZE:
		return json_pack("{s:s, s:[f,f,f], s:[f,f,f]}", "op", "normalize",
				 "mean", t->mean[0], t->mean[1], t->mean[2],
				 "std", t->std[0], t->std[1], t->std[2]);
	}
	return NULL;
}

/* Add the image keys (transforms, output, on_error, decode) to @obj. */
static int image_options_json(const struct spec *spec, json_t *obj)
{
	json_t *arr = json_array();

	if (!arr)
		return -ENOMEM;
	for (size_t i = 0; i < spec->ntransforms; i++) {
		if (json_array_append_new(arr, transform_json(&spec->transforms[i])) < 0) {
			json_decref(arr);
			return -ENOMEM;
		}
	}
	if (json_object_set_new(obj, "transforms", arr) < 0 ||
	    json_object_set_new(obj, "output",
				json_pack("{s:s, s:s}", "dtype", dtype_name(spec->image_dtype),
					  "layout", spec->image_nhwc ? "NHWC" : "NCHW")) < 0 ||
	    json_object_set_new(obj, "on_error",
				json_string(spec->on_error_fail ? "fail" : "skip")) < 0 ||
	    json_object_set_new(obj, "decode",
				json_pack("{s:b}", "dct_scaling", spec->dct_scaling)) < 0)
		return -ENOMEM;
	return 0;
}

static json_t *strings_json(char **v, size_t n)
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

static json_t *spec_build_json(const struct spec *spec)
{
	json_t *src, *obj;

	if (spec->kind == SOURCE_TOKENS) {
		src = json_pack("{s:s, s:s, s:s, s:I, s:s}", "kind", "tokens",
				"path", spec->source.path,
				"dtype", dtype_name(spec->source.dtype),
				"seq_len", (json_int_t)spec->source.seq_len,
				"output_dtype", dtype_name(spec->source.output_dtype));
	} else if (spec->kind == SOURCE_NPY) {
		json_t *paths = strings_json(spec->source.paths, spec->source.npaths);

		src = paths ? json_pack("{s:s, s:o}", "kind", "npy", "paths", paths) : NULL;
	} else if (spec->kind == SOURCE_IMAGE_FOLDER) {
		src = json_pack("{s:s, s:s}", "kind", "image_folder", "path", spec->source.root);
	} else {
		json_t *urls = strings_json(spec->source.urls, spec->source.nurls);

		src = urls ? json_pack("{s:s, s:o}", "kind", "webdataset", "urls", urls) : NULL;
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
	if (obj && spec_is_image(spec) && image_options_json(spec, obj) < 0)
		obj = (json_decref(obj), NULL);
	return obj;
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
	if (!get_number(v, &ttl) || !(ttl >= 0) || ttl > SPEC_TTL_MAX_S)
		return fail(err, errlen, "ttl: must be a number of seconds in 0..%d", SPEC_TTL_MAX_S);
	if (spec->persist)
		return fail(err, errlen, "ttl: not with persist: true (a persistent pipeline is kept "
			    "until it is dropped)");
	spec->has_ttl = true;
	spec->ttl_ms = (uint64_t)llround(ttl * 1000.0);
	return 0;
}

static int spec_fill(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	static const char *const keys[] = { "name", "source", "batch_size", "shuffle", "seed",
					    "drop_last", "epochs", "prefetch", "min_clients",
					    "transforms", "output", "on_error", "decode",
					    "persist", "ttl", NULL };
	static const char *const image_keys[] = { "transforms", "output", "on_error", "decode",
						  NULL };
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
	} else if (strcmp(s, "image_folder") == 0) {
		spec->kind = SOURCE_IMAGE_FOLDER;
		r = parse_image_folder(spec, src, err, errlen);
	} else if (strcmp(s, "webdataset") == 0) {
		spec->kind = SOURCE_WEBDATASET;
		r = parse_webdataset(spec, src, err, errlen);
	} else {
		r = fail(err, errlen, "source.kind: must be one of tokens, npy, image_folder, webdataset");
	}
	if (r < 0)
		return r;
	if (spec_is_image(spec)) {
		r = parse_image_options(spec, obj, err, errlen);
		if (r < 0)
			return r;
	} else {
		for (size_t k = 0; image_keys[k]; k++)
			if (json_object_get(obj, image_keys[k]))
				return fail(err, errlen,
					    "%s: only for image sources (image_folder, webdataset)",
					    image_keys[k]);
	}

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

	r = parse_lifetime(spec, obj, err, errlen);
	if (r < 0)
		return r;

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
	free(spec->source.root);
	for (size_t i = 0; i < spec->source.nurls; i++)
		free(spec->source.urls[i]);
	free(spec->source.urls);
	json_decref(spec->json);
	free(spec);
	return NULL;
}

bool spec_is_image(const struct spec *spec)
{
	return spec->kind == SOURCE_IMAGE_FOLDER || spec->kind == SOURCE_WEBDATASET;
}

void transform_resize_dims(const struct transform *t, uint32_t h, uint32_t w, uint64_t *oh,
			   uint64_t *ow)
{
	uint64_t shorter, longer, nlong;

	if (t->size[1]) {
		*oh = t->size[0];
		*ow = t->size[1];
		return;
	}
	/* torchvision: new_long = int(size * long / short), in double */
	shorter = w <= h ? w : h;
	longer = w <= h ? h : w;
	nlong = (uint64_t)((double)((uint64_t)t->size[0] * longer) / (double)shorter);
	if (w <= h) {
		*ow = t->size[0];
		*oh = nlong;
	} else {
		*oh = t->size[0];
		*ow = nlong;
	}
}

bool spec_equal(const struct spec *a, const struct spec *b)
{
	if (!a || !b)
		return a == b;
	return json_equal(a->json, b->json);
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
