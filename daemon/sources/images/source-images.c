/* SPDX-License-Identifier: MIT */
/* source-images - image_folder and webdataset: decoded, transformed images */

/*
 * Both kinds list their files once at open (imageset), then each read decodes
 * one file (image) and resamples it straight into the batch slot (imageop). A
 * sample's random crop and flip come from (seed, epoch, index) only.
 *
 * Their spec adds the top-level keys transforms, output, on_error, decode and
 * cache (imagecache.c: decoded images kept for the epochs after the first);
 * the transforms must fix the output size, computed here once per spec.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sources/brace.h"
#include "common.h"
#include "image.h"
#include "imagecache.h"
#include "imageop.h"
#include "imageset.h"
#include "sources/source-private.h"
#include "sources/spec.h"

struct images_source {
	struct source base;
	struct imageset *images;
	struct imageop *op;
	bool on_error_fail;
	uint64_t max_pixels;          /* decode.max_pixels */
	struct imagecache *cache;     /* "cache": {"decoded": true}, else NULL */
	/* on_error skip: a bit for each sample found bad, so that each bad
	 * file is read once, not again for every sample whose replacement
	 * search runs over it (images_read) */
	_Atomic uint64_t *bad;
};

/* ---- the spec: source ---- */

static int parse_image_folder(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "path", NULL };
	const char *key = spec_unknown_key(src, keys);

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	return spec_required_path(src, &spec->source.root, err, errlen);
}

static int parse_webdataset(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "urls", NULL };
	const char *key = spec_unknown_key(src, keys);
	char msg[256];
	json_t *arr;
	size_t n;
	unsigned long long total = 0;

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	arr = json_object_get(src, "urls");
	if (!arr)
		return spec_fail(err, errlen, "source.urls: is required");
	n = json_is_string(arr) ? 1 : json_is_array(arr) ? json_array_size(arr) : 0;
	if (n < 1 || n > SPEC_URLS_MAX)
		return spec_fail(err, errlen,
				 "source.urls: must be a string or an array of 1..%d strings (paths of .tar shards, brace patterns allowed)",
				 SPEC_URLS_MAX);
	spec->source.urls = calloc(n, sizeof(*spec->source.urls));
	if (!spec->source.urls)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = spec_plain_string(json_is_string(arr) ? arr : json_array_get(arr, i));
		long cnt;

		if (!s)
			return spec_fail(err, errlen, "source.urls[%zu]: must be a non-empty string", i);
		cnt = brace_expand(s, NULL, msg, sizeof(msg));
		if (cnt < 0)
			return cnt == -ENOMEM ? -ENOMEM
					      : spec_fail(err, errlen, "source.urls[%zu]: %s", i, msg);
		spec->source.urls[i] = strdup(s);
		if (!spec->source.urls[i])
			return -ENOMEM;
		spec->source.nurls = i + 1;
		total += (unsigned long long)cnt;
	}
	/* the count alone, before any name is made (a million of them took
	 * 2.9 GB and a minute; imageset.c) */
	if (total > IMAGESET_SHARDS_MAX)
		return spec_fail(err, errlen, "source.urls: %llu shards named, the most is %d", total,
				 IMAGESET_SHARDS_MAX);
	return 0;
}

static int images_parse(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	if (spec->kind == SOURCE_IMAGE_FOLDER)
		return parse_image_folder(spec, src, err, errlen);
	return parse_webdataset(spec, src, err, errlen);
}

static json_t *images_json(const struct spec *spec)
{
	json_t *urls;

	if (spec->kind == SOURCE_IMAGE_FOLDER)
		return json_pack("{s:s, s:s}", "kind", "image_folder", "path", spec->source.root);
	urls = spec_strings_json(spec->source.urls, spec->source.nurls);
	return urls ? json_pack("{s:s, s:o}", "kind", "webdataset", "urls", urls) : NULL;
}

/* ---- the spec: transforms, output, on_error, decode ---- */

/* [a, b] with lo < a <= b <= hi (hi may be INFINITY); absent keeps *out. */
static int get_range(json_t *op, const char *key, size_t i, double lo, double hi,
		     const char *what, double out[2], char *err, size_t errlen)
{
	json_t *v = json_object_get(op, key);
	double a, b;

	if (!v)
		return 0;
	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !spec_get_number(json_array_get(v, 0), &a) || !spec_get_number(json_array_get(v, 1), &b) ||
	    !(a > lo) || !(a <= b) || !(b <= hi))
		return spec_fail(err, errlen, "transforms[%zu].%s: must be %s", i, key, what);
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
		return spec_fail(err, errlen, "transforms[%zu].size: is required", i);
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
	return spec_fail(err, errlen, "transforms[%zu].size: must be an integer in 1..%d or [height, width]%s",
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
		return spec_fail(err, errlen, "transforms[%zu].%s: is required", i, key);
	if (n != 1 && n != 3)
		goto bad;
	for (size_t c = 0; c < 3; c++) {
		double d;

		if (!spec_get_number(json_array_get(v, n == 1 ? 0 : c), &d) || !isfinite(d) ||
		    (positive && !(d > 0)) || fabs(d) > 1e30)
			goto bad;
		out[c] = d;
	}
	return 0;
bad:
	return spec_fail(err, errlen, "transforms[%zu].%s: must be an array of 1 or 3 %snumbers", i, key,
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
		return spec_fail(err, errlen, "transforms[%zu]: must be an object with an \"op\"", i);
	v = json_object_get(op, "op");
	if (!v)
		return spec_fail(err, errlen, "transforms[%zu].op: is required", i);
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
		return spec_fail(err, errlen,
				 "transforms[%zu].op: must be one of random_resized_crop, resize, center_crop, horizontal_flip, normalize",
				 i);
	}
	key = spec_unknown_key(op, keys);
	if (key)
		return spec_fail(err, errlen, "unknown key \"transforms[%zu].%s\"", i, key);

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
		if (v && (!spec_get_number(v, &t->p) || !(t->p >= 0 && t->p <= 1)))
			return spec_fail(err, errlen, "transforms[%zu].p: must be a number in [0, 1]", i);
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
					return spec_fail(err, errlen,
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
		return spec_fail(err, errlen,
				 "transforms: the output image size depends on each image; end with random_resized_crop, center_crop or resize to [height, width] so that every sample has the same shape");
	if (h * w * 3 * 4 > (256u << 20))
		return spec_fail(err, errlen, "transforms: output images of %llux%llu are too large",
				 (unsigned long long)h, (unsigned long long)w);
	spec->image_h = (uint32_t)h;
	spec->image_w = (uint32_t)w;
	return 0;
}

static int parse_image_options(struct spec *spec, json_t *obj, char *err, size_t errlen)
{
	static const char *const out_keys[] = { "dtype", "layout", NULL };
	static const char *const dec_keys[] = { "dct_scaling", "max_pixels", NULL };
	json_t *v, *arr;
	const char *s, *key;
	int normalize_at = -1;
	int r;

	arr = json_object_get(obj, "transforms");
	if (arr) {
		if (!json_is_array(arr) || json_array_size(arr) > SPEC_TRANSFORMS_MAX)
			return spec_fail(err, errlen,
					 "transforms: must be an array of at most %d transforms",
					 SPEC_TRANSFORMS_MAX);
		for (size_t i = 0; i < json_array_size(arr); i++) {
			r = parse_transform(&spec->transforms[i], json_array_get(arr, i), i, err,
					    errlen);
			if (r < 0)
				return r;
			spec->ntransforms = i + 1;
			if (spec->transforms[i].op == TRANSFORM_NORMALIZE) {
				if (normalize_at >= 0)
					return spec_fail(err, errlen,
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
			return spec_fail(err, errlen, "output: must be an object");
		key = spec_unknown_key(v, out_keys);
		if (key)
			return spec_fail(err, errlen, "unknown key \"output.%s\"", key);
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
				return spec_fail(err, errlen,
						 "output.dtype: must be one of uint8, float16, bfloat16, float32");
		}
		l = json_object_get(v, "layout");
		if (l) {
			s = json_is_string(l) ? json_string_value(l) : "";
			if (strcmp(s, "NHWC") == 0)
				spec->image_nhwc = true;
			else if (strcmp(s, "NCHW") != 0)
				return spec_fail(err, errlen, "output.layout: must be NCHW or NHWC");
		}
	}
	if (normalize_at >= 0 && spec->image_dtype == LDR_DTYPE_UINT8)
		return spec_fail(err, errlen,
				 "transforms[%d]: normalize needs output.dtype float16, bfloat16 or float32, not uint8",
				 normalize_at);

	spec->on_error_fail = false;
	v = json_object_get(obj, "on_error");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "fail") == 0)
			spec->on_error_fail = true;
		else if (strcmp(s, "skip") != 0)
			return spec_fail(err, errlen, "on_error: must be skip or fail");
	}

	spec->dct_scaling = true;
	spec->max_pixels = SPEC_MAX_PIXELS_DEFAULT;
	v = json_object_get(obj, "decode");
	if (v) {
		json_t *b;

		if (!json_is_object(v))
			return spec_fail(err, errlen, "decode: must be an object");
		key = spec_unknown_key(v, dec_keys);
		if (key)
			return spec_fail(err, errlen, "unknown key \"decode.%s\"", key);
		b = json_object_get(v, "dct_scaling");
		if (b && !json_is_boolean(b))
			return spec_fail(err, errlen, "decode.dct_scaling: must be true or false");
		if (b)
			spec->dct_scaling = json_is_true(b);
		b = json_object_get(v, "max_pixels");
		if (b && (!json_is_integer(b) || json_integer_value(b) < 1 ||
			  (uint64_t)json_integer_value(b) > IMAGE_MAX_PIXELS))
			return spec_fail(err, errlen, "decode.max_pixels: must be an integer in 1..%u",
					 IMAGE_MAX_PIXELS);
		if (b)
			spec->max_pixels = (uint64_t)json_integer_value(b);
	}
	r = imagecache_parse(spec, json_object_get(obj, "cache"), err, errlen);
	if (r < 0)
		return r;
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

/* Add the image keys (transforms, output, on_error, decode, cache) to @obj. */
static int image_options_json(const struct spec *spec, json_t *obj)
{
	json_t *arr = json_array(), *cache;

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
				json_pack("{s:b, s:I}", "dct_scaling", spec->dct_scaling, "max_pixels",
					  (json_int_t)spec->max_pixels)) < 0)
		return -ENOMEM;
	cache = imagecache_spec_json(spec);
	if (spec->cache_decoded && (!cache || json_object_set_new(obj, "cache", cache) < 0))
		return -ENOMEM;
	return 0;
}

bool spec_is_image(const struct spec *spec)
{
	return spec->kind == SOURCE_IMAGE_FOLDER || spec->kind == SOURCE_WEBDATASET;
}

/* Does a sample depend on the seed: a random crop, or a flip that is not
 * always or never? */
static bool transforms_random(const struct spec *spec)
{
	for (size_t i = 0; i < spec->ntransforms; i++) {
		const struct transform *t = &spec->transforms[i];
		if (t->op == TRANSFORM_RANDOM_RESIZED_CROP ||
		    (t->op == TRANSFORM_HORIZONTAL_FLIP && t->p > 0 && t->p < 1))
			return true;
	}
	return false;
}

/* ---- the dataset ---- */

/* The shard of sample @idx (a streamed folder's: its image), for the
 * fetch-ahead (objects.c). */
static const char *shard_of(void *arg, uint64_t idx)
{
	const struct images_source *src = arg;

	return src->images ? imageset_shard_of(src->images, idx) : NULL;
}

/* The shards named by URLs fetched into the node's cache, several at once,
 * before they are indexed one by one (objects.c); when they are more than
 * cache_bytes, only HEADed: fetched several at once ahead of the index,
 * in its order, each given back once indexed, then read as a stream. */
static int fetch_shards(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	char **all = NULL;
	size_t n = 0;
	int r = 0;

	for (size_t u = 0; u < spec->source.nurls; u++)
		if (source_is_url(spec->source.urls[u]))
			break;
		else if (u + 1 == spec->source.nurls)
			return 0;
	for (size_t u = 0; r == 0 && u < spec->source.nurls; u++) {
		char **names = NULL, **grown;
		long k = brace_expand(spec->source.urls[u], &names, err, errlen);

		if (k < 0) {
			r = (int)k;
			break;
		}
		grown = realloc(all, (n + (size_t)k + 1) * sizeof(*all));
		if (!grown) {
			brace_free(names);
			r = -ENOMEM;
			break;
		}
		all = grown;
		for (long i = 0; i < k; i++)
			all[n++] = names[i];
		free(names); /* the strings now belong to all */
	}
	if (r == 0)
		r = source_stream_urls(base, all, n, shard_of, base, err, errlen);
	for (size_t i = 0; i < n; i++)
		free(all[i]);
	free(all);
	return r;
}

static int images_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct images_source *src = (struct images_source *)base;
	struct field_desc *img = &src->base.fields[0], *lab = &src->base.fields[1];
	uint32_t h = spec->image_h, w = spec->image_w;
	int r;

	if (spec->kind == SOURCE_IMAGE_FOLDER)
		r = imageset_open_folder_of(&src->images, base, spec->source.root, shard_of, base, err, errlen);
	else if ((r = fetch_shards(base, spec, err, errlen)) == 0) {
		r = imageset_open_webdataset(&src->images, base, spec->source.urls, spec->source.nurls,
					     err, errlen);
		source_index_ahead_end(base);
		/* a global shuffle spreads a batch over every shard: each
		 * sample's image by range rather than its shard whole, again
		 * and again (docs/storage.md, "Webdataset samples by range") */
		if (r == 0 && spec->shuffle && !spec->shuffle_window)
			source_stream_by_range(base);
	}
	if (r < 0)
		return r;
	src->op = malloc(sizeof(*src->op));
	if (!src->op)
		return -ENOMEM;
	imageop_init(src->op, spec);
	src->on_error_fail = spec->on_error_fail;
	src->base.augments = transforms_random(spec);
	src->max_pixels = spec->max_pixels ? spec->max_pixels : SPEC_MAX_PIXELS_DEFAULT;
	src->base.nsamples = imageset_count(src->images);
	if (spec->shuffle_window) {
		src->base.shard_first = imageset_shard_first(src->images, &src->base.nshards);
		if (!src->base.shard_first)
			return -ENOMEM;
	}
	src->bad = calloc((src->base.nsamples + 63) / 64, sizeof(*src->bad));
	if (!src->bad)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the bad-sample map of %llu samples",
			      (unsigned long long)src->base.nsamples);
	src->base.index_bytes = imageset_bytes(src->images) +
				(src->base.nsamples + 63) / 64 * sizeof(*src->bad);
	if (spec->cache_decoded) {
		r = imagecache_new(&src->cache, spec, src->base.nsamples, err, errlen);
		if (r < 0)
			return r;
		src->base.index_bytes += imagecache_index_bytes(src->cache);
		src->base.memory_bytes = imagecache_capacity(spec, src->base.nsamples);
		/* a cached image is the whole one at full scale (or max_side's),
		 * and a sample not cached must be cut from the same pixels */
		src->op->dct_scaling = false;
	}
	src->base.nfields = 2;

	snprintf(img->name, sizeof(img->name), "image");
	img->dtype = spec->image_dtype;
	img->ndim = 3;
	img->shape[0] = spec->image_nhwc ? h : 3;
	img->shape[1] = spec->image_nhwc ? w : h;
	img->shape[2] = spec->image_nhwc ? 3 : w;
	img->sample_bytes = (size_t)3 * h * w * dtype_size(spec->image_dtype);

	snprintf(lab->name, sizeof(lab->name), "label");
	lab->dtype = LDR_DTYPE_INT64;
	lab->ndim = 0;
	lab->sample_bytes = sizeof(int64_t);
	return 0;
}

/* Seeds one sample is written with: the augment seeds read and the spec's
 * own, which is outside their limit (docs/spec.md, "Augment seeds"). */
#define SAMPLE_SEEDS_MAX (LDR_AUGMENT_SEEDS_MAX + 1)

/* The samples to write: @j's for ctx's seed into @dsts and for each of its
 * augment seeds into ctx->more_dsts (docs/spec.md, "Augment seeds"). */
struct sample_outs {
	size_t n;
	uint64_t seeds[SAMPLE_SEEDS_MAX];
	void *img[SAMPLE_SEEDS_MAX], *label[SAMPLE_SEEDS_MAX];
};

static int sample_outs(const struct images_source *src, const struct sample_ctx *ctx,
		       void *const *dsts, struct sample_outs *o, char *err, size_t errlen)
{
	o->n = 1 + (ctx ? ctx->nmore : 0);
	if (o->n > SAMPLE_SEEDS_MAX)
		return errfmt(-EINVAL, err, errlen, "%zu seeds, above %d", o->n, SAMPLE_SEEDS_MAX);
	for (size_t i = 0; i < o->n; i++) {
		void *const *d = i ? ctx->more_dsts + (i - 1) * src->base.nfields : dsts;
		o->seeds[i] = i ? ctx->more_seeds[i - 1] : ctx ? ctx->seed : 0;
		o->img[i] = d[0];
		o->label[i] = d[1];
	}
	return 0;
}

/* Sample @j from the cache: 0, 1 when it holds no image of @j, or an error. */
static int cached_sample(struct images_source *src, const struct sample_ctx *ctx, uint64_t j,
			 struct image_scratch *s, const struct sample_outs *o, char *err,
			 size_t errlen)
{
	const struct imagecache_entry *e = imagecache_get(src->cache, j);
	struct imageop_plan plan;
	char msg[384], what[320];
	uint64_t t0;
	int r = 0;

	if (!e)
		return 1;
	t0 = ctx && ctx->stage_ns ? mono_ns() : 0;
	for (size_t i = 0; r == 0 && i < o->n; i++) {
		/* the crop is drawn on the file's size and mapped onto the pixels kept */
		r = imageop_plan(src->op, (int)e->w, (int)e->h,
				 imageop_key(o->seeds[i], ctx ? ctx->epoch : 0, j), &plan, msg,
				 sizeof(msg));
		if (r == 0)
			r = imageop_run(src->op, s, &plan, e->pix, (int)e->cw, (int)e->ch, o->img[i],
					msg, sizeof(msg));
	}
	if (t0)
		ctx->stage_ns[STAGE_TRANSFORM] += mono_ns() - t0;
	if (r < 0) {
		imageset_describe(src->images, j, what, sizeof(what));
		return errfmt(r, err, errlen, "%s: %s", what, msg);
	}
	for (size_t i = 0; i < o->n; i++)
		memcpy(o->label[i], &e->label, sizeof(e->label));
	return 0;
}

/* Decode and transform sample @j into @dsts, and once more into each of
 * ctx->more_dsts with its seed: one read and probe, one decode per DCT scale. */
static int image_sample(struct images_source *src, const struct sample_ctx *ctx, uint64_t j,
			void *const *dsts, char *err, size_t errlen)
{
	struct image_scratch *s = image_scratch_get();
	const struct imageop *op = src->op;
	struct imageop_plan plans[SAMPLE_SEEDS_MAX];
	struct sample_outs o;
	struct image_info info;
	char msg[384], what[320];
	size_t len = 0;
	unsigned decodes = 0;
	int64_t label = 0;
	int r;

	if (!s)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the image decoder");
	if ((r = sample_outs(src, ctx, dsts, &o, err, errlen)) < 0)
		return r;
	if (src->cache && (r = cached_sample(src, ctx, j, s, &o, err, errlen)) <= 0)
		return r;
	uint64_t t0 = ctx && ctx->stage_ns ? mono_ns() : 0, t1 = 0;
	r = imageset_read(src->images, j, &s->file, &s->file_cap, &len, &label, err, errlen);
	if (r < 0)
		return r;
	if (t0)
		t1 = mono_ns();
	s->transform_ns = 0;
	r = image_probe(s, s->file, len, &info, msg, sizeof(msg));
	if (r == 0 && (uint64_t)info.width * (uint64_t)info.height > src->max_pixels)
		r = errfmt(-EINVAL, msg, sizeof(msg),
			   "image of %dx%d (%llu pixels) is larger than decode.max_pixels %llu",
			   info.width, info.height,
			   (unsigned long long)info.width * (unsigned long long)info.height,
			   (unsigned long long)src->max_pixels);
	for (size_t i = 0; r == 0 && i < o.n; i++)
		r = imageop_plan(op, info.width, info.height,
				 imageop_key(o.seeds[i], ctx ? ctx->epoch : 0, j), &plans[i], msg,
				 sizeof(msg));
	if (r == 0 && src->cache)
		r = imagecache_decode_run(src->cache, op, s, plans, o.n, j, label, s->file, len,
					  &info, o.img, &decodes, msg, sizeof(msg));
	else if (r == 0)
		r = imageop_decode_run_many(op, s, plans, o.n, s->file, len, &info, o.img, &decodes,
					    msg, sizeof(msg));
	atomic_fetch_add_explicit(&src->base.decoded, decodes, memory_order_relaxed);
	if (t0) {
		/* read: the file; decode: probe, plan, entropy decoding; transform:
		 * resampling, crop, flip, normalize into the slot */
		uint64_t t2 = mono_ns();
		ctx->stage_ns[STAGE_READ] += t1 - t0;
		ctx->stage_ns[STAGE_DECODE] += (t2 - t1) - s->transform_ns;
		ctx->stage_ns[STAGE_TRANSFORM] += s->transform_ns;
	}
	/* an outsize image's buffers go back now, not when the worker exits */
	image_scratch_trim(s);
	if (r < 0) {
		imageset_describe(src->images, j, what, sizeof(what));
		return errfmt(r, err, errlen, "%s: %s", what, msg);
	}
	for (size_t i = 0; i < o.n; i++)
		memcpy(o.label[i], &label, sizeof(label));
	return 0;
}

/* The first sample in [@j, @n) not known to be bad, or @n. */
static uint64_t next_unknown(const struct images_source *src, uint64_t j, uint64_t n)
{
	while (j < n) {
		uint64_t w = ~atomic_load_explicit(&src->bad[j >> 6], memory_order_relaxed) &
			     (~0ull << (j & 63));

		if (w) {
			uint64_t k = (j & ~63ull) + (uint64_t)__builtin_ctzll(w);
			return k < n ? k : n;
		}
		j = (j | 63) + 1;
	}
	return n;
}

/*
 * Sample @idx, or with on_error skip the next good one in dataset order
 * (idx+1, idx+2, ..., wrapping). Which samples are good is a property of
 * their files, so the replacement is the same whichever worker looks and
 * whenever; the bad-sample map only spares reading a bad file again (once
 * found bad, a sample stays bad for the pipeline's life), so a run of k bad
 * files costs k reads once, not k for every sample that lands on it.
 * `skipped` counts the samples found bad.
 */
static int images_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
		       void *const *dsts, char *err, size_t errlen)
{
	struct images_source *src = (struct images_source *)base;
	uint64_t n = src->base.nsamples, j = idx, seen = 0;
	char last[512];
	bool tried = false;

	source_note_read(base, ctx);
	if (source_ahead_recording()) {
		/* the read-ahead's first pass (source.h): the range it will
		 * read (none for a decoded image cached), no decode of bytes
		 * not yet there, the bad-sample map untouched */
		uint64_t k = next_unknown(src, idx, n);

		if (k == n)
			k = next_unknown(src, 0, n);
		if (k < n && !(src->cache && imagecache_has(src->cache, k)))
			imageset_note(src->images, k);
		return 0;
	}

	while (seen < n) {
		uint64_t k = next_unknown(src, j, n);
		uint64_t bit;
		int r;

		seen += k - j;
		if (k == n) {
			j = 0;
			continue;
		}
		if (seen >= n)
			break;
		j = k;
		r = image_sample(src, ctx, j, dsts, err, errlen);
		if (r == 0)
			return 0;
		/* a store's refusal of the keys, or a store that does not
		 * answer, is no bad sample: the engine waits for fresh keys or
		 * for the store and builds the batch again */
		if (r == -ENOMEM || src->on_error_fail || source_read_why())
			return r;
		tried = true;
		bit = 1ull << (j & 63);
		if (!(atomic_fetch_or_explicit(&src->bad[j >> 6], bit, memory_order_relaxed) & bit))
			atomic_fetch_add_explicit(&src->base.skipped, 1, memory_order_relaxed);
		seen++;
		j = j + 1 == n ? 0 : j + 1;
	}
	if (!tried)
		return errfmt(-EINVAL, err, errlen, "no sample could be decoded: all %llu are bad",
			      (unsigned long long)n);
	snprintf(last, sizeof(last), "%s", err ? err : "");
	return errfmt(-EINVAL, err, errlen, "no sample could be decoded (the last error: %s)", last);
}

static json_t *images_cache_json(const struct source *base)
{
	const struct images_source *src = (const struct images_source *)base;

	return src->cache ? imagecache_json(src->cache) : NULL;
}

static void images_close(struct source *base)
{
	struct images_source *src = (struct images_source *)base;

	imageset_free(src->images);
	imagecache_free(src->cache);
	free(src->op);
	free((void *)src->bad);
}

static const char *const image_options[] = { "transforms", "output", "on_error", "decode", "cache",
					     NULL };

const struct source_ops source_images_ops = {
	.parse = images_parse,
	.options = image_options,
	.options_for = "image sources (image_folder, webdataset)",
	.parse_options = parse_image_options,
	.source_json = images_json,
	.options_json = image_options_json,
	.size = sizeof(struct images_source),
	.open = images_open,
	.read = images_read,
	.cache_json = images_cache_json,
	.check_limit = imagecache_check_limit,
	.close = images_close,
};
