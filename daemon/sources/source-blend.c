/* SPDX-License-Identifier: MIT */
/* source-blend - several sources mixed by weight, as megatron-core's BlendedDataset */

/*
 * Sample i of a blend is sample sample_index[i] of part part_index[i]. The
 * two arrays are built at open exactly as megatron-core 0.16 builds its
 * BlendedDataset's dataset_index and dataset_sample_index (helpers.cpp):
 * with weights or a size, build_blending_indices() over the weights
 * normalised as numpy does (a pairwise sum); with neither,
 * build_exhaustive_blending_indices() over a count per part. "min_size" is
 * BlendedMegatronDatasetBuilder's size (Megatron-LM's --train-samples): the
 * blend's size derived from it as the builder does, and each megatron part
 * asked, through its num_samples, for the samples the builder asks of its
 * GPTDataset (builder_parts()). The pipeline's sampler then shuffles,
 * partitions and resumes the blend's indices as any source's, so none of
 * that knows about blends.
 *
 * Each part is a whole source object of another kind, parsed by that kind's
 * own hooks into its own struct spec and opened as its own struct source;
 * the blend only routes reads. Parts must give the same fields. A part the
 * blend takes more samples from than it has is read again from its sample 0
 * (Mosaic's repeat; megatron-core raises IndexError instead).
 *
 * Mosaic Streaming's per-part keys map onto the same two builders:
 * "proportion" is a weight (with "size", default the parts' samples
 * summed); "repeat" and "choose" give a part's count per epoch, and the
 * blend is exhaustive over those counts.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "megatron/megatron.h"
#include "source-private.h"
#include "spec.h"

/* megatron-core's limit too (its dataset_index is int16) */
#define BLEND_PARTS_MAX 32766
#define BLEND_SIZE_MAX (1ll << 36)
#define PART_NAME_MAX 48

struct blend_part {
	struct spec *spec;
	char name[PART_NAME_MAX + 1];
	double weight;           /* as given (weights or proportion), 0 if none */
	double repeat;           /* Mosaic's repeat, 0 if none */
	uint64_t choose;         /* Mosaic's choose, 0 if none */
};

struct blend_spec {
	struct blend_part *parts;
	size_t nparts;
	bool has_weights;        /* "weights" at the blend (not proportion) */
	bool has_proportion;
	uint64_t size;           /* 0: not given */
	uint64_t min_size;       /* megatron's builder's size; 0: not given */
	double surplus;          /* megatron's mid_level_dataset_surplus */
};

struct blend_source {
	struct source base;
	struct source **parts;
	size_t nparts;
	/* for status, copied: the source may outlive the spec it was opened from */
	char (*names)[PART_NAME_MAX + 1];
	const char **kinds;       /* the kind table's names */
	uint16_t *part_index;    /* ix's: its arrays, or its cache file's mapping */
	uint64_t *sample_index;
	struct mg_blend ix;
	uint64_t *per_epoch;     /* samples per epoch of each part */
	_Atomic uint64_t *read;  /* samples read of each part */
	struct mg_origin origin; /* the index built or read from the cache */
};

/* ---- the spec ---- */

static void blend_free_spec(struct spec *spec)
{
	struct blend_spec *bs = spec->source.blend;

	if (!bs)
		return;
	for (size_t i = 0; i < bs->nparts; i++)
		spec_free(bs->parts[i].spec);
	free(bs->parts);
	free(bs);
	spec->source.blend = NULL;
}

/* A part's error "spec: source.X..." becomes "spec: source.sources[i].X...",
 * every "source." in it so. */
static int part_error(size_t i, int r, char *err, size_t errlen)
{
	char msg[512], pre[48];
	const char *at, *from;
	size_t n = 0;

	if (r == -ENOMEM || !err || !errlen)
		return r;
	snprintf(msg, sizeof(msg), "%s", err);
	snprintf(pre, sizeof(pre), "source.sources[%zu].", i);
	for (from = msg; (at = strstr(from, "source.")) && n < errlen; from = at + 7)
		n += (size_t)snprintf(err + n, errlen - n, "%.*s%s", (int)(at - from), from, pre);
	if (n < errlen)
		snprintf(err + n, errlen - n, "%s", from);
	return -EINVAL;
}

/* The short name of a part: its "name", else the base name of its first path. */
static void part_name(struct blend_part *p, json_t *canon, size_t i)
{
	static const char *const keys[] = { "path", "paths", "prefix", "prefixes", "root", NULL };
	const char *s = NULL, *slash;

	for (const char *const *k = keys; !s && *k; k++) {
		json_t *v = json_object_get(canon, *k);
		s = json_is_array(v) ? json_string_value(json_array_get(v, 0)) : json_string_value(v);
	}
	if (!s) {
		snprintf(p->name, sizeof(p->name), "%zu", i);
		return;
	}
	slash = strrchr(s, '/');
	snprintf(p->name, sizeof(p->name), "%s", slash && slash[1] ? slash + 1 : s);
}

/* Mosaic's per-part keys and "name", taken out of the part's object. */
static int parse_part_keys(struct blend_spec *bs, struct blend_part *p, json_t *obj, size_t i,
			   char *err, size_t errlen)
{
	json_t *v;
	double d;
	int given = 0;

	if ((v = json_object_get(obj, "name"))) {
		const char *s = spec_plain_string(v);
		if (!s || strlen(s) > PART_NAME_MAX)
			return spec_fail(err, errlen, "source.sources[%zu].name: must be a string of 1..%d bytes",
					 i, PART_NAME_MAX);
		snprintf(p->name, sizeof(p->name), "%s", s);
	}
	if ((v = json_object_get(obj, "proportion"))) {
		if (!spec_get_number(v, &d) || !isfinite(d) || !(d > 0))
			return spec_fail(err, errlen, "source.sources[%zu].proportion: must be a finite number > 0", i);
		p->weight = d;
		given++;
	}
	if ((v = json_object_get(obj, "repeat"))) {
		if (!spec_get_number(v, &d) || !isfinite(d) || !(d > 0) || d > 1e9)
			return spec_fail(err, errlen, "source.sources[%zu].repeat: must be a number in (0, 1e9]", i);
		p->repeat = d;
		given++;
	}
	if ((v = json_object_get(obj, "choose"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > BLEND_SIZE_MAX)
			return spec_fail(err, errlen, "source.sources[%zu].choose: must be an integer in 1..%lld",
					 i, (long long)BLEND_SIZE_MAX);
		p->choose = (uint64_t)json_integer_value(v);
		given++;
	}
	if (given > 1)
		return spec_fail(err, errlen, "source.sources[%zu]: at most one of proportion, repeat, choose", i);
	if (p->weight > 0 && i > 0 && !bs->has_proportion)
		return spec_fail(err, errlen, "source.sources[%zu].proportion: every part needs one, or none", i);
	if (i == 0)
		bs->has_proportion = p->weight > 0;
	else if (bs->has_proportion && !(p->weight > 0))
		return spec_fail(err, errlen, "source.sources[%zu]: has no proportion, but source.sources[0] has "
				 "(every part needs one, or none)", i);
	if (bs->has_proportion && (p->repeat > 0 || p->choose))
		return spec_fail(err, errlen, "source.sources[%zu]: proportion and repeat/choose do not mix", i);
	return 0;
}

/* One part: its blend keys out, the rest parsed by its own kind. */
static int parse_part(struct blend_spec *bs, size_t i, json_t *obj, char *err, size_t errlen)
{
	static const char *const blend_keys[] = { "name", "proportion", "repeat", "choose", NULL };
	struct blend_part *p = &bs->parts[i];
	const struct source_kind_entry *kind;
	json_t *v, *own, *canon;
	int r;

	if (!json_is_object(obj))
		return spec_fail(err, errlen, "source.sources[%zu]: must be a source object", i);
	v = json_object_get(obj, "kind");
	if (!v)
		return spec_fail(err, errlen, "source.sources[%zu].kind: is required", i);
	kind = source_kind_named(json_is_string(v) ? json_string_value(v) : "");
	if (!kind)
		return spec_fail(err, errlen, "source.sources[%zu].kind: must be a source kind", i);
	if (kind->kind == SOURCE_BLEND)
		return spec_fail(err, errlen, "source.sources[%zu].kind: a blend cannot hold a blend "
				 "(list its parts here, with their weights)", i);
	if (kind->ops->external || kind->ops->options)
		return spec_fail(err, errlen, "source.sources[%zu].kind: %s sources cannot be blended "
				 "(a blend's parts are tokens, npy or megatron sources)", i, kind->name);
	if (kind->kind == SOURCE_MEGATRON && json_object_get(obj, "prefixes"))
		return spec_fail(err, errlen, "source.sources[%zu].prefixes: a blend's megatron part "
				 "has one prefix (list each as a part)", i);
	r = parse_part_keys(bs, p, obj, i, err, errlen);
	if (r < 0)
		return r;
	own = json_deep_copy(obj);
	p->spec = calloc(1, sizeof(*p->spec));
	if (!own || !p->spec) {
		json_decref(own);
		return -ENOMEM;
	}
	for (const char *const *k = blend_keys; *k; k++)
		json_object_del(own, *k);
	p->spec->kind = kind->kind;
	r = kind->ops->parse(p->spec, own, err, errlen);
	json_decref(own);
	if (r < 0)
		return part_error(i, r, err, errlen);
	canon = kind->ops->source_json(p->spec);
	if (!canon)
		return -ENOMEM;
	if (!p->name[0])
		part_name(p, canon, i);
	json_decref(canon);
	return 0;
}

static int parse_weights(struct blend_spec *bs, json_t *arr, char *err, size_t errlen)
{
	double d;

	if (!json_is_array(arr))
		return spec_fail(err, errlen, "source.weights: must be an array of numbers, one per source");
	if (json_array_size(arr) != bs->nparts)
		return spec_fail(err, errlen, "source.weights: has %zu weights for %zu sources",
				 json_array_size(arr), bs->nparts);
	if (bs->has_proportion)
		return spec_fail(err, errlen, "source.weights: not with the parts' proportion (the same thing)");
	for (size_t i = 0; i < bs->nparts; i++) {
		if (bs->parts[i].repeat > 0 || bs->parts[i].choose)
			return spec_fail(err, errlen, "source.weights: not with source.sources[%zu].%s", i,
					 bs->parts[i].repeat > 0 ? "repeat" : "choose");
		if (!spec_get_number(json_array_get(arr, i), &d) || !isfinite(d) || !(d > 0))
			return spec_fail(err, errlen, "source.weights[%zu]: must be a finite number > 0", i);
		bs->parts[i].weight = d;
	}
	bs->has_weights = true;
	return 0;
}

/* min_size: megatron's BlendedMegatronDatasetBuilder's size, not with size. */
static int parse_min_size(struct blend_spec *bs, json_t *src, char *err, size_t errlen)
{
	int64_t v = 0;
	double d;
	json_t *j;
	int r;

	bs->surplus = 0.005;
	if ((j = json_object_get(src, "surplus")) && !json_is_null(j)) {
		if (!spec_get_number(j, &d) || !isfinite(d) || d < 0 || d > 10)
			return spec_fail(err, errlen, "source.surplus: must be a number in 0..10");
		bs->surplus = d;
	}
	if (json_is_null(json_object_get(src, "min_size")))
		return 0;
	r = spec_get_int(src, "min_size", "source.min_size", 1, BLEND_SIZE_MAX,
			 "an integer in 1..68719476736", &v, err, errlen);
	if (r < 0 || !v)
		return r;
	if (bs->size)
		return spec_fail(err, errlen, "source.min_size: not with source.size (one of them "
				 "gives the blend's size)");
	for (size_t i = 0; i < bs->nparts; i++)
		if (bs->parts[i].repeat > 0 || bs->parts[i].choose)
			return spec_fail(err, errlen, "source.min_size: not with source.sources[%zu].%s "
					 "(they give the samples per epoch)", i,
					 bs->parts[i].repeat > 0 ? "repeat" : "choose");
	bs->min_size = (uint64_t)v;
	return 0;
}

static int builder_asks(const struct blend_spec *bs, uint64_t *ask);

/* A megatron part's canonical @key, as the spec writes it: "969,30,1" or 1234. */
static const char *mg_key(const struct spec *part, const char *key, char *buf, size_t len)
{
	json_t *v = json_object_get(part->source.mg, key);

	if (json_is_string(v))
		snprintf(buf, len, "\"%s\"", json_string_value(v));
	else
		snprintf(buf, len, "%lld", (long long)json_integer_value(v));
	return buf;
}

/*
 * With min_size, the blend is BlendedMegatronDatasetBuilder's: its megatron
 * parts share one config (one --split, subset, --seed and --seq-length),
 * and each whose num_samples is null is given what the builder asks of it
 * (builder_asks()): its canonical form re-parsed with that num_samples.
 */
static int builder_parts(struct blend_spec *bs, char *err, size_t errlen)
{
	static const char *const same[] = { "split", "subset", "seed", "seq_len" };
	const struct spec *first = NULL;
	uint64_t *ask;
	int r = 0;

	if (!bs->min_size)
		return 0;
	for (size_t i = 0; i < bs->nparts; i++) {
		const struct spec *p = bs->parts[i].spec;

		if (p->kind != SOURCE_MEGATRON)
			continue;
		if (!first) {
			first = p;
			continue;
		}
		for (size_t k = 0; k < ARRAY_SIZE(same); k++) {
			char a[160], b[160];

			if (json_equal(json_object_get(p->source.mg, same[k]),
				       json_object_get(first->source.mg, same[k])))
				continue;
			return spec_fail(err, errlen, "source.sources[%zu].%s: %s is not the first "
					 "megatron part's %s (with min_size, megatron's builder gives "
					 "every part one split, subset, seed and seq_len)", i, same[k],
					 mg_key(p, same[k], a, sizeof(a)),
					 mg_key(first, same[k], b, sizeof(b)));
		}
	}
	ask = calloc(bs->nparts, sizeof(*ask));
	if (!ask || builder_asks(bs, ask) < 0) {
		free(ask);
		return -ENOMEM;
	}
	for (size_t i = 0; i < bs->nparts && r >= 0; i++) {
		struct blend_part *p = &bs->parts[i];
		const struct source_ops *ops = source_kind_ops(p->spec->kind);
		struct spec *again;
		json_t *c;

		if (p->spec->kind != SOURCE_MEGATRON || !ask[i] ||
		    !json_is_null(json_object_get(p->spec->source.mg, "num_samples")))
			continue;
		c = ops->source_json(p->spec);
		again = calloc(1, sizeof(*again));
		if (!c || !again || json_object_set_new(c, "num_samples",
							 json_integer((json_int_t)ask[i])) < 0) {
			json_decref(c);
			free(again);
			r = -ENOMEM;
			break;
		}
		again->kind = SOURCE_MEGATRON;
		r = ops->parse(again, c, err, errlen);
		json_decref(c);
		if (r < 0) {
			spec_free(again);
			r = part_error(i, r, err, errlen);
			break;
		}
		spec_free(p->spec);
		p->spec = again;
	}
	free(ask);
	return r;
}

static int parse_blend(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "sources", "weights", "size", "min_size",
					    "surplus", NULL };
	const char *key = spec_unknown_key(src, keys);
	json_t *arr = json_object_get(src, "sources");
	struct blend_spec *bs;
	int64_t size = 0;
	size_t n;
	int r;

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	if (!arr)
		return spec_fail(err, errlen, "source.sources: is required");
	n = json_is_array(arr) ? json_array_size(arr) : 0;
	if (n < 1 || n > BLEND_PARTS_MAX)
		return spec_fail(err, errlen, "source.sources: must be an array of 1..%d sources",
				 BLEND_PARTS_MAX);
	bs = spec->source.blend = calloc(1, sizeof(*bs));
	if (!bs || !(bs->parts = calloc(n, sizeof(*bs->parts))))
		return -ENOMEM;
	bs->nparts = n;
	for (size_t i = 0; i < n; i++) {
		r = parse_part(bs, i, json_array_get(arr, i), err, errlen);
		if (r < 0)
			return r;
	}
	if (json_object_get(src, "weights")) {
		r = parse_weights(bs, json_object_get(src, "weights"), err, errlen);
		if (r < 0)
			return r;
	}
	r = 0;
	if (!json_is_null(json_object_get(src, "size")))
		r = spec_get_int(src, "size", "source.size", 1, BLEND_SIZE_MAX,
				 "an integer in 1..68719476736", &size, err, errlen);
	if (r < 0)
		return r;
	bs->size = (uint64_t)size;
	r = parse_min_size(bs, src, err, errlen);
	if (r < 0)
		return r;
	r = builder_parts(bs, err, errlen);
	if (r < 0)
		return r;
	for (size_t i = 0; size && i < n; i++)
		if (bs->parts[i].repeat > 0 || bs->parts[i].choose)
			return spec_fail(err, errlen, "source.size: not with source.sources[%zu].%s (they "
					 "give the samples per epoch)", i,
					 bs->parts[i].repeat > 0 ? "repeat" : "choose");
	return 0;
}

/* A number as JSON: integers written as integers, so the canonical form of
 * "weights": [3, 7] stays [3, 7]. */
static json_t *number_json(double d)
{
	if (d == floor(d) && fabs(d) < 9007199254740992.0)
		return json_integer((json_int_t)d);
	return json_real(d);
}

static json_t *blend_json(const struct spec *spec)
{
	const struct blend_spec *bs = spec->source.blend;
	json_t *parts = json_array(), *weights = bs->has_weights ? json_array() : NULL, *o;

	for (size_t i = 0; parts && i < bs->nparts; i++) {
		const struct blend_part *p = &bs->parts[i];
		json_t *c = source_kind_ops(p->spec->kind)->source_json(p->spec);

		if (!c || json_array_append_new(parts, c) < 0)
			goto fail;
		json_object_set_new(c, "name", json_string(p->name));
		if (bs->has_proportion)
			json_object_set_new(c, "proportion", number_json(p->weight));
		if (p->repeat > 0)
			json_object_set_new(c, "repeat", number_json(p->repeat));
		if (p->choose)
			json_object_set_new(c, "choose", json_integer((json_int_t)p->choose));
		if (weights && json_array_append_new(weights, number_json(p->weight)) < 0)
			goto fail;
	}
	if (!parts || (bs->has_weights && !weights))
		goto fail;
	o = json_pack("{s:s, s:o, s:o, s:o, s:o}", "kind", "blend", "sources", parts,
		      "size", bs->size ? json_integer((json_int_t)bs->size) : json_null(),
		      "min_size", bs->min_size ? json_integer((json_int_t)bs->min_size) : json_null(),
		      "surplus", number_json(bs->surplus));
	if (o && weights)
		json_object_set_new(o, "weights", weights);
	return o;
fail:
	json_decref(parts);
	json_decref(weights);
	return NULL;
}

/* ---- megatron-core's blending indices (helpers.cpp), bit for bit ---- */

/*
 * The products below must round as two operations, as megatron's prebuilt
 * helpers do on x86-64: no fused multiply-add.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* numpy's sum of float64 (pairwise_sum in loops_utils.h), which
 * megatron.core.datasets.utils.normalize() divides by. */
static double numpy_sum(const double *a, size_t n)
{
	double r[8], res;
	size_t i;

	if (n < 8) {
		res = 0.0;
		for (i = 0; i < n; i++)
			res += a[i];
		return res;
	}
	if (n <= 128) {
		for (i = 0; i < 8; i++)
			r[i] = a[i];
		for (i = 8; i < n - n % 8; i += 8)
			for (size_t j = 0; j < 8; j++)
				r[j] += a[i + j];
		res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
		for (; i < n; i++)
			res += a[i];
		return res;
	}
	size_t n2 = n / 2;
	n2 -= n2 % 8;
	return numpy_sum(a, n2) + numpy_sum(a + n2, n - n2);
}

/*
 * BlendedMegatronDatasetBuilder with weights and a size N: the weights
 * normalised, each part asked for ceil(N × w) samples (and built with
 * ceil(ceil(N × w) × (1 + surplus)), builder_asks()), the blend's size
 * their sum; BlendedDataset then normalises the normalised weights again,
 * as build_weighted() does with what is left in @w.
 */
static uint64_t builder_size(double *w, size_t n, uint64_t target)
{
	double sum = numpy_sum(w, n);
	uint64_t size = 0;

	for (size_t i = 0; i < n; i++) {
		w[i] /= sum;
		size += (uint64_t)ceil((double)target * w[i]);
	}
	return size;
}

/*
 * What BlendedMegatronDatasetBuilder asks of each dataset for the size
 * N = min_size: with weights, ceil(ceil(N × w) × (1 + surplus)) of the
 * normalised w (_get_size_per_split_per_dataset); one part and no weights,
 * N itself (no BlendedDataset at all); several parts and no weights, one
 * epoch each (0 here: num_samples stays null).
 */
static int builder_asks(const struct blend_spec *bs, uint64_t *ask)
{
	double sum;
	double *w;

	if (!(bs->has_weights || bs->has_proportion)) {
		ask[0] = bs->nparts == 1 ? bs->min_size : 0;
		return 0;
	}
	w = calloc(bs->nparts, sizeof(*w));
	if (!w)
		return -ENOMEM;
	for (size_t i = 0; i < bs->nparts; i++)
		w[i] = bs->parts[i].weight;
	sum = numpy_sum(w, bs->nparts);
	for (size_t i = 0; i < bs->nparts; i++) {
		double need = ceil((double)bs->min_size * (w[i] / sum));

		ask[i] = (uint64_t)ceil(need * (1.0 + bs->surplus));
	}
	free(w);
	return 0;
}

/* ---- the dataset ---- */

/* "64, 3" */
static const char *shape_str(const struct field_desc *f, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int d = 0; d < f->ndim && n < len; d++)
		n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)f->shape[d]);
	return buf;
}

static int check_fields(struct blend_source *src, size_t i, char *err, size_t errlen)
{
	const struct source *a = src->parts[0], *b = src->parts[i];

	if (a->nfields != b->nfields)
		return errfmt(-EINVAL, err, errlen, "source.sources[%zu]: gives %zu fields, but "
			    "source.sources[0] gives %zu (a blend's parts give the same fields)",
			    i, b->nfields, a->nfields);
	for (size_t f = 0; f < a->nfields; f++) {
		const struct field_desc *x = &a->fields[f], *y = &b->fields[f];
		bool same = strcmp(x->name, y->name) == 0 && x->dtype == y->dtype &&
			    x->ndim == y->ndim && x->sample_bytes == y->sample_bytes;

		for (int d = 0; same && d < x->ndim; d++)
			same = x->shape[d] == y->shape[d];
		if (!same) {
			char sx[96], sy[96];

			return errfmt(-EINVAL, err, errlen, "source.sources[%zu]: field %zu is \"%s\" %s "
				    "[%s], but source.sources[0] gives \"%s\" %s [%s] (a blend's parts "
				    "give the same fields)", i, f, y->name, dtype_name(y->dtype),
				    shape_str(y, sy, sizeof(sy)), x->name, dtype_name(x->dtype),
				    shape_str(x, sx, sizeof(sx)));
		}
	}
	return 0;
}

/* The parts opened OPEN_THREADS at a time (each opens its files as the
 * owner: ds_open() takes the credentials on the calling thread). */
#define OPEN_THREADS 8

struct open_job {
	struct blend_source *src;
	const struct spec *spec;     /* the blend's: its keys are the parts' */
	const struct blend_spec *bs;
	_Atomic size_t next;
	pthread_mutex_t lock;
	size_t failed;           /* the first part that failed to open; nparts: none */
	int r;
	char err[512];
};

static void *open_thread(void *arg)
{
	struct open_job *j = arg;
	size_t i;

	while ((i = atomic_fetch_add(&j->next, 1)) < j->bs->nparts) {
		char perr[512];
		int r;

		pthread_mutex_lock(&j->lock);
		r = i > j->failed;       /* a part before it failed: the error is that one's */
		pthread_mutex_unlock(&j->lock);
		if (r)
			continue;
		r = source_open_part(&j->src->parts[i], j->bs->parts[i].spec, j->spec, &j->src->base.who,
				     perr, sizeof(perr));
		if (r >= 0)
			continue;
		pthread_mutex_lock(&j->lock);
		if (i < j->failed) {
			j->failed = i;
			j->r = r;
			snprintf(j->err, sizeof(j->err), "%s", perr);
		}
		pthread_mutex_unlock(&j->lock);
	}
	return NULL;
}

/*
 * Open every part, several at once; then, in order, the first part that
 * failed or has no samples or other fields is the error, as if they were
 * opened one by one (every part before the first that failed was opened).
 */
static int open_parts(struct blend_source *src, const struct spec *spec, char *err, size_t errlen)
{
	const struct blend_spec *bs = spec->source.blend;
	struct open_job j = { .src = src, .spec = spec, .bs = bs, .lock = PTHREAD_MUTEX_INITIALIZER,
			      .failed = bs->nparts };
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t nt = bs->nparts < OPEN_THREADS ? bs->nparts : OPEN_THREADS, started = 0;
	pthread_t t[OPEN_THREADS];

	if (cpus > 0 && nt > (size_t)cpus)
		nt = (size_t)cpus;
	for (; nt > 1 && started < nt; started++)
		if (pthread_create(&t[started], NULL, open_thread, &j) != 0)
			break;
	if (started == 0)
		open_thread(&j);
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	src->nparts = bs->nparts; /* parts not opened are NULL */
	for (size_t i = 0; i < bs->nparts; i++) {
		int r;

		if (i == j.failed)
			return errfmt(j.r, err, errlen, "source.sources[%zu]: %s", i, j.err);
		if (src->parts[i]->nsamples == 0)
			return errfmt(-EINVAL, err, errlen, "source.sources[%zu]: has no samples", i);
		r = check_fields(src, i, err, errlen);
		if (r < 0)
			return r;
		src->base.index_bytes += src->parts[i]->index_bytes;
	}
	return 0;
}

/* The samples per epoch of each part for the exhaustive builder. */
static int part_counts(struct blend_source *src, const struct blend_spec *bs, uint64_t *counts,
		       uint64_t *total, char *err, size_t errlen)
{
	*total = 0;
	for (size_t i = 0; i < bs->nparts; i++) {
		const struct blend_part *p = &bs->parts[i];
		uint64_t n = src->parts[i]->nsamples;

		if (p->choose)
			counts[i] = p->choose;
		else if (p->repeat > 0)
			counts[i] = (uint64_t)(p->repeat * (double)n); /* Mosaic's int() */
		else
			counts[i] = n;
		if (!counts[i])
			return errfmt(-EINVAL, err, errlen, "source.sources[%zu].repeat: takes no sample "
				    "of its %llu", i, (unsigned long long)n);
		*total += counts[i];
		if (*total > BLEND_SIZE_MAX)
			return errfmt(-EINVAL, err, errlen, "source.sources: more than %lld samples per "
				    "epoch in all", (long long)BLEND_SIZE_MAX);
	}
	return 0;
}

struct index_job {
	struct blend_source *src;
	struct mg_blend *b;
	size_t n;
	uint64_t size;
	bool weighted;
	const uint64_t *counts;
	double *w;
};

/* Threads for the index: a chunk is worth one when its steps scan at least
 * this many parts in all (about 10 ms), and runs at least 4096 steps. */
#define INDEX_CHUNK_WORK (1u << 23)
#define INDEX_THREADS 8

static int index_build(void *ctx, char *err, size_t errlen)
{
	struct index_job *j = ctx;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned threads = cpus < 1 ? 1 : cpus > INDEX_THREADS ? INDEX_THREADS : (unsigned)cpus;
	uint64_t min_chunk = INDEX_CHUNK_WORK / j->n;
	int r;

	j->b->part = mg_array_alloc(j->size * sizeof(*j->b->part));
	j->b->sample = mg_array_alloc(j->size * sizeof(*j->b->sample));
	r = j->b->part && j->b->sample ? 0 : -ENOMEM;
	if (r == 0 && j->weighted) {
		/* build_blending_indices(normalize(weights), size) */
		double sum = numpy_sum(j->w, j->n);

		for (size_t i = 0; i < j->n; i++)
			j->w[i] /= sum;
	}
	if (r == 0)
		r = mg_blend_indices(j->b->part, j->b->sample, j->w, j->weighted ? NULL : j->counts,
				     j->n, j->size, j->src->per_epoch, threads,
				     min_chunk > 4096 ? min_chunk : 4096, NULL);
	if (r < 0)
		return errfmt(-ENOMEM, err, errlen, "blend: out of memory for the index of %llu "
			      "samples", (unsigned long long)j->size);
	return 0;
}

/*
 * The index of @size samples: weighted over @w, else exhaustive over
 * @counts; from the daemon's cache directory when a blend of the same
 * inputs was built before (megatron-cache.c), keyed by them all.
 */
static int build_index(struct blend_source *src, size_t n, uint64_t size, bool weighted,
		       const uint64_t *counts, double *w, char *err, size_t errlen)
{
	struct index_job job = { src, &src->ix, n, size, weighted, counts, w };
	size_t klen = 40 + 8 * n;
	uint64_t *key = malloc(klen);
	int r;

	src->ix = (struct mg_blend){ size, n, NULL, NULL, src->per_epoch, NULL, 0 };
	if (!key)
		return errfmt(-ENOMEM, err, errlen, "blend: out of memory");
	memcpy(key, "blend index 1\n\0\0", 16);
	key[2] = weighted;
	key[3] = n;
	key[4] = size;
	for (size_t i = 0; i < n; i++)
		if (weighted)
			memcpy(&key[5 + i], &w[i], 8);
		else
			key[5 + i] = counts[i];
	r = mg_blend_get(&src->ix, key, klen, index_build, &job, &src->origin, err, errlen);
	free(key);
	if (r < 0)
		return r;
	src->part_index = src->ix.part;
	src->sample_index = src->ix.sample;
	src->base.nsamples = size;
	src->base.index_bytes += size * (sizeof(*src->part_index) + sizeof(*src->sample_index));
	return 0;
}

static int blend_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct blend_source *src = (struct blend_source *)base;
	const struct blend_spec *bs = spec->source.blend;
	size_t n = bs->nparts;
	uint64_t *counts = NULL, size = 0, cap;
	double *w = NULL;
	bool weights = bs->has_weights || bs->has_proportion;
	/* weights and a size: the index needs no part's length */
	bool early = weights && (bs->size || bs->min_size);
	uint64_t early_size = bs->size;
	int r;

	src->parts = calloc(n, sizeof(*src->parts));
	src->names = calloc(n, sizeof(*src->names));
	src->kinds = calloc(n, sizeof(*src->kinds));
	src->per_epoch = calloc(n, sizeof(*src->per_epoch));
	src->read = calloc(n, sizeof(*src->read));
	counts = calloc(n, sizeof(*counts));
	w = calloc(n, sizeof(*w));
	r = -ENOMEM;
	if (!src->parts || !src->names || !src->kinds || !src->per_epoch || !src->read ||
	    !counts || !w)
		goto out;
	for (size_t i = 0; i < n; i++) {
		memcpy(src->names[i], bs->parts[i].name, sizeof(src->names[i]));
		for (size_t k = 0; k < source_nkinds; k++)
			if (source_kinds[k].kind == bs->parts[i].spec->kind)
				src->kinds[i] = source_kinds[k].name;
	}
	for (size_t i = 0; weights && i < n; i++)
		w[i] = bs->parts[i].weight;
	if (weights && bs->min_size)
		early_size = builder_size(w, n, bs->min_size);
	/* megatron parts were given the builder's share at parse (builder_parts());
	 * every part is opened as the owner before the index cache is looked at */
	r = open_parts(src, spec, err, errlen);
	if (r < 0)
		goto out;
	source_objects_parts(base, src->parts, n); /* status: the parts read by range */
	if (early) {
		r = build_index(src, n, early_size, true, NULL, w, err, errlen);
		goto out;
	}
	r = part_counts(src, bs, counts, &size, err, errlen);
	if (r < 0)
		goto out;
	/* min_size without weights: megatron's builder's size, but one part
	 * is its GPTDataset as it is (no BlendedDataset) */
	cap = bs->size ? bs->size : n > 1 ? bs->min_size : 0;
	if (cap) {
		/* a size without weights: the parts' sizes as weights, the size at
		 * most their sum (megatron's builder) */
		for (size_t i = 0; i < n; i++)
			w[i] = (double)src->parts[i]->nsamples;
		if (cap < size)
			size = cap;
	}
	r = build_index(src, n, size, weights || cap, counts, w, err, errlen);
out:
	if (r == 0) {
		src->base.nfields = src->parts[0]->nfields;
		memcpy(src->base.fields, src->parts[0]->fields, sizeof(src->base.fields));
	}
	free(counts);
	free(w);
	return r;
}

static int blend_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
		      void *const *dsts, char *err, size_t errlen)
{
	struct blend_source *src = (struct blend_source *)base;
	size_t p = src->part_index[idx];
	struct source *part;
	uint64_t s = src->sample_index[idx];

	/* a cached index is used as it is (megatron-cache.c): checked here */
	if (p >= src->nparts)
		return errfmt(-EIO, err, errlen, "blend: sample %llu: part %zu out of range (the "
			      "cached index is damaged)", (unsigned long long)idx, p);
	part = src->parts[p];

	/* more than the part has: it runs again from its sample 0 */
	if (s >= part->nsamples)
		s %= part->nsamples;
	atomic_fetch_add_explicit(&src->read[p], 1, memory_order_relaxed);
	return source_read(part, ctx, s, dsts, err, errlen);
}

/* Status "source" (the kind's own key, source_status_json()): each part's
 * name, kind, samples, samples per epoch and samples read so far. */
static json_t *blend_status_json(const struct source *base)
{
	const struct blend_source *src = (const struct blend_source *)base;
	json_t *parts = json_array();

	for (size_t i = 0; parts && i < src->nparts; i++) {
		json_t *p = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I}",
			"index", (json_int_t)i,
			"name", src->names[i],
			"kind", src->kinds[i] ? src->kinds[i] : "",
			"samples", (json_int_t)src->parts[i]->nsamples,
			"samples_per_epoch", (json_int_t)src->per_epoch[i],
			"samples_read", (json_int_t)atomic_load_explicit(&src->read[i],
									  memory_order_relaxed));
		/* a part read by range (objects.c): ranged, ranged_gets, ranged_bytes */
		json_t *ranged = p ? source_ranged_json(src->parts[i]) : NULL;

		if (ranged)
			json_object_update(p, ranged);
		json_decref(ranged);
		json_array_append_new(parts, p);
	}
	return parts ? json_pack("{s:{s:s, s:o}}", "source", "kind", "blend", "parts", parts) : NULL;
}

/* Status "cache": the blend's index built or reused, and how many of its
 * parts' own indexes were (megatron parts; the others have none). */
static json_t *blend_cache_json(const struct source *base)
{
	const struct blend_source *src = (const struct blend_source *)base;
	json_int_t built = 0, reused = 0;
	json_t *j;

	for (size_t i = 0; i < src->nparts; i++) {
		json_t *c = source_cache_json(src->parts[i]);
		const char *ix = json_string_value(json_object_get(c, "index"));

		built += ix && strcmp(ix, "built") == 0;
		reused += ix && strcmp(ix, "reused") == 0;
		json_decref(c);
	}
	j = json_pack("{s:s, s:I, s:I, s:I, s:I}", "index", src->origin.reused ? "reused" : "built",
		      "samples", (json_int_t)src->base.nsamples, "parts", (json_int_t)src->nparts,
		      "parts_built", built, "parts_reused", reused);
	if (j && !src->origin.reused)
		json_object_set_new(j, "build_seconds", json_real(src->origin.build_s));
	if (j && src->origin.note[0])
		json_object_set_new(j, "note", json_string(src->origin.note));
	return j;
}

static void blend_close(struct source *base)
{
	struct blend_source *src = (struct blend_source *)base;

	for (size_t i = 0; src->parts && i < src->nparts; i++)
		source_free(src->parts[i]);
	free(src->parts);
	free(src->names);
	free(src->kinds);
	free(src->per_epoch);
	free(src->read);
	mg_blend_free(&src->ix);
}

const struct source_ops source_blend_ops = {
	.parse = parse_blend,
	.source_json = blend_json,
	.free_spec = blend_free_spec,
	.size = sizeof(struct blend_source),
	.open = blend_open,
	.read = blend_read,
	.status_json = blend_status_json,
	.cache_json = blend_cache_json,
	.close = blend_close,
};
