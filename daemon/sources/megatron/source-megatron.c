/* SPDX-License-Identifier: MIT */
/* source-megatron - a Megatron-LM indexed dataset (.bin/.idx), sampled as megatron-core's GPTDataset
 *
 * The spec's sample i is megatron-core 0.16's GPTDataset(...)[i] for the same
 * files, seed, split, seq_len and num_samples: its fields tokens, labels,
 * loss_mask and position_ids, byte for byte (docs/spec.md, "source of kind
 * megatron"). The .idx is parsed and checked against the .bin
 * (common/mmidx.h); the three indexes are built as megatron builds them
 * (megatron-index.c) or taken from the daemon's cache (megatron-cache.c).
 * A sample is read with one pread per document piece and widened to int64.
 *
 * A pair in a store (s3://) is fetched whole into the node's cache when it
 * fits; else its .idx is (the index needs all of it) and the .bin is read
 * by range, one ranged GET per document piece (docs/storage.md, "Read by
 * range"). The cached index of such a pair is keyed by the objects' URLs
 * and ETags rather than the files'.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "megatron.h"
#include "mmidx.h"
#include "sources/source-private.h"
#include "sources/spec.h"

#define MG_SEQ_LEN_MAX (1u << 24)
#define MG_NUM_SAMPLES_MAX (1ULL << 36)
#define MG_PREFIXES_MAX 32766         /* the blend's parts at most */

struct mg_source {
	struct source base;
	int bin_fd;
	char *bin_path;
	struct mmidx idx;
	struct mg_index ix;
	uint32_t seq_len;
	int extra;
	int64_t pad, eod;             /* eod: -2 when none */
	int64_t vocab;                /* 0: unchecked */
	bool eod_mask_loss, reset_position_ids;
	int out_dtype;
	struct mg_file_id idx_id, bin_id;
	struct mg_origin origin;
	const int32_t *lengths;       /* the .idx's: src->idx's or the cache's mapping */
	const int64_t *pointers;
	int idx_fd;                   /* open until the .idx is read or known */
	char *idx_path;
	/* a .bin in a store more than the cache holds: read by range (bin_fd -1) */
	bool bin_ranged;
	char *idx_object, *bin_object; /* their mg_file_id.object, or NULL */
};

/* ---- the spec ---- */

static const char *const subsets[] = { "train", "valid", "test" };

/* megatron's parse_and_normalize_split + convert_split_vector_to_split_matrix:
 * the numbers ([.0-9]+) of @s, padded to 3, normalized, as bookends. */
static int split_bookends(const char *s, int which, double *lo, double *hi)
{
	double w[3] = { 0, 0, 0 }, sum = 0, e[4];
	int n = 0;

	while (*s) {
		size_t len = strspn(s, ".0123456789");
		char buf[64], *end;

		if (!len) {
			s++;
			continue;
		}
		if (n == 3 || len >= sizeof(buf))
			return -1;
		memcpy(buf, s, len);
		buf[len] = '\0';
		w[n] = strtod(buf, &end);
		if (*end || !isfinite(w[n]))
			return -1;
		n++;
		s += len;
	}
	for (int i = 0; i < 3; i++)
		sum += w[i];
	if (!(sum > 0))
		return -1;
	e[0] = 0;
	for (int i = 0; i < 3; i++)
		e[i + 1] = e[i] + w[i] / sum;
	*lo = e[which];
	*hi = e[which + 1];
	return *hi <= *lo ? 1 : 0;   /* 1: megatron's None, the split is empty */
}

static int get_opt_int(json_t *src, const char *key, int64_t min, int64_t max, json_t **out,
		       char *err, size_t errlen)
{
	json_t *v = json_object_get(src, key);

	*out = json_null();
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return spec_fail(err, errlen, "source.%s: must be null or an integer in %lld..%lld",
				 key, (long long)min, (long long)max);
	*out = json_integer(json_integer_value(v));
	return 0;
}

static int get_flag(json_t *src, const char *key, bool dflt, bool *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(src, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return spec_fail(err, errlen, "source.%s: must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

static int parse_rest(json_t *src, json_t *c, char *err, size_t errlen)
{
	static const char *const flags[] = { "add_extra_token", "eod_mask_loss",
					     "reset_position_ids" };
	json_t *num, *vocab, *eod, *v;
	int64_t pad = -1;
	const char *s;
	bool f;
	int r;

	r = get_opt_int(src, "num_samples", 1, (int64_t)MG_NUM_SAMPLES_MAX, &num, err, errlen);
	if (r < 0)
		return r;
	json_object_set_new(c, "num_samples", num);
	r = get_opt_int(src, "vocab_size", 1, INT64_MAX, &vocab, err, errlen);
	if (r < 0)
		return r;
	json_object_set_new(c, "vocab_size", vocab);
	r = get_opt_int(src, "eod", 0, INT64_MAX, &eod, err, errlen);
	if (r < 0)
		return r;
	json_object_set_new(c, "eod", eod);
	r = spec_get_int(src, "pad", "source.pad", -1, INT64_MAX, "an integer >= -1", &pad, err,
			 errlen);
	if (r < 0)
		return r;
	json_object_set_new(c, "pad", json_integer(pad));
	for (size_t i = 0; i < ARRAY_SIZE(flags); i++) {
		r = get_flag(src, flags[i], i == 0, &f, err, errlen);
		if (r < 0)
			return r;
		if (i > 0 && f && json_is_null(eod))
			return spec_fail(err, errlen, "source.%s: needs source.eod", flags[i]);
		json_object_set_new(c, flags[i], json_boolean(f));
	}
	s = "int64";
	v = json_object_get(src, "output_dtype");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "int64") != 0 && strcmp(s, "int32") != 0)
			return spec_fail(err, errlen, "source.output_dtype: must be int64 or int32");
	}
	json_object_set_new(c, "output_dtype", json_string(s));
	return 0;
}

static int parse_prefixes(struct spec *spec, json_t *src, char *err, size_t errlen);

static int parse_megatron(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "prefix", "seq_len", "seed", "split",
		"subset", "num_samples", "add_extra_token", "pad", "eod", "eod_mask_loss",
		"reset_position_ids", "vocab_size", "output_dtype", NULL };
	const char *key = spec_unknown_key(src, keys), *s;
	int64_t seq_len = 0, seed = 1234;
	double lo, hi;
	json_t *c, *v;
	int r, which = 0;

	if (json_object_get(src, "prefixes"))
		return parse_prefixes(spec, src, err, errlen);
	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	s = spec_plain_string(json_object_get(src, "prefix"));
	if (!s)
		return spec_fail(err, errlen, "source.prefix: is required: the path of the "
				 ".bin/.idx pair without the suffix");
	if (!json_object_get(src, "seq_len"))
		return spec_fail(err, errlen, "source.seq_len: is required");
	r = spec_get_int(src, "seq_len", "source.seq_len", 2, MG_SEQ_LEN_MAX,
			 "an integer in 2..16777216", &seq_len, err, errlen);
	if (r < 0)
		return r;
	r = spec_get_int(src, "seed", "source.seed", 0, UINT32_MAX, "an integer in 0..4294967295",
			 &seed, err, errlen);
	if (r < 0)
		return r;
	c = json_pack("{s:s, s:s, s:I, s:I}", "kind", "megatron", "prefix", s,
		      "seq_len", (json_int_t)seq_len, "seed", (json_int_t)seed);
	if (!c)
		return -ENOMEM;
	v = json_object_get(src, "split");
	s = v ? spec_plain_string(v) : "1,0,0";
	if (!s) {
		json_decref(c);
		return spec_fail(err, errlen, "source.split: must be a string as megatron's "
				 "--split, e.g. \"969,30,1\"");
	}
	json_object_set_new(c, "split", json_string(s));
	v = json_object_get(src, "subset");
	if (v) {
		const char *name = json_is_string(v) ? json_string_value(v) : "";

		for (which = 0; which < 3 && strcmp(name, subsets[which]) != 0; which++)
			;
		if (which == 3) {
			json_decref(c);
			return spec_fail(err, errlen, "source.subset: must be train, valid or test");
		}
	}
	json_object_set_new(c, "subset", json_string(subsets[which]));
	r = split_bookends(s, which, &lo, &hi);
	if (r != 0) {
		json_decref(c);
		return spec_fail(err, errlen, r < 0 ? "source.split: must be up to 3 non-negative "
				 "weights with a positive sum, e.g. \"969,30,1\"" :
				 "source.split: gives the %s subset nothing", subsets[which]);
	}
	r = parse_rest(src, c, err, errlen);
	if (r < 0) {
		json_decref(c);
		return r;
	}
	spec->source.mg = c;
	return 0;
}

/* Check "prefixes" (and "weights") and put the rest of @src, with the
 * first prefix, in *one: a single megatron source object. */
static int prefixes_one(json_t *src, json_t **one, char *err, size_t errlen)
{
	json_t *arr = json_object_get(src, "prefixes"), *w = json_object_get(src, "weights");
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;

	if (json_object_get(src, "prefix"))
		return spec_fail(err, errlen, "source.prefixes: not with source.prefix");
	if (n < 1 || n > MG_PREFIXES_MAX)
		return spec_fail(err, errlen, "source.prefixes: must be an array of 1..%d prefixes "
				 "(paths of .bin/.idx pairs without the suffix)", MG_PREFIXES_MAX);
	for (size_t i = 0; i < n; i++)
		if (!spec_plain_string(json_array_get(arr, i)))
			return spec_fail(err, errlen, "source.prefixes[%zu]: must be a path string", i);
	if (w && (!json_is_array(w) || json_array_size(w) != n))
		return spec_fail(err, errlen, "source.weights: must be an array of %zu numbers, one "
				 "per prefix", n);
	if (w && (!json_object_get(src, "num_samples") ||
		  json_is_null(json_object_get(src, "num_samples"))))
		return spec_fail(err, errlen, "source.weights: need source.num_samples (megatron's "
				 "builder: weights need a size, as --train-samples)");
	*one = json_deep_copy(src);
	if (!*one)
		return -ENOMEM;
	json_object_del(*one, "prefixes");
	json_object_del(*one, "weights");
	json_object_set(*one, "prefix", json_array_get(arr, 0));
	return 0;
}

/*
 * "prefixes" (with "weights" or without): Megatron-LM's --data-path through
 * BlendedMegatronDatasetBuilder, and "num_samples" its size. One prefix and
 * no weights is that prefix's source (the builder builds no blend); else the
 * source is the blend of one megatron part per prefix, each with this
 * object's other keys, "weights" the blend's and "num_samples" its
 * "min_size" (docs/spec.md, "Megatron-LM's --data-path"). Its canonical form
 * is the blend's.
 */
static int parse_prefixes(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	json_t *arr = json_object_get(src, "prefixes"), *one = NULL, *parts, *blend;
	json_t *num = json_object_get(src, "num_samples"), *w = json_object_get(src, "weights");
	int r = prefixes_one(src, &one, err, errlen);

	if (r < 0)
		return r;
	r = parse_megatron(spec, one, err, errlen);   /* the other keys, checked once */
	if (r < 0 || (json_array_size(arr) == 1 && !w)) {
		json_decref(one);
		return r;
	}
	json_decref(spec->source.mg);
	spec->source.mg = NULL;
	json_object_del(one, "num_samples");
	parts = json_array();
	blend = json_pack("{s:s, s:o}", "kind", "blend", "sources", parts);
	for (size_t i = 0; blend && i < json_array_size(arr); i++) {
		json_t *part = json_deep_copy(one);

		if (!part || json_object_set(part, "prefix", json_array_get(arr, i)) < 0 ||
		    json_array_append_new(parts, part) < 0) {
			json_decref(part);
			r = -ENOMEM;
		}
	}
	json_decref(one);
	if (blend && w)
		json_object_set(blend, "weights", w);
	if (blend && num && !json_is_null(num))
		json_object_set(blend, "min_size", num);
	if (!blend || r < 0) {
		json_decref(blend);
		return -ENOMEM;
	}
	spec->kind = SOURCE_BLEND;
	r = source_blend_ops.parse(spec, blend, err, errlen);
	json_decref(blend);
	return r;
}

static json_t *megatron_json(const struct spec *spec)
{
	return json_deep_copy(spec->source.mg);
}

/* ---- the dataset ---- */

static int64_t jint(const json_t *c, const char *key, int64_t dflt)
{
	json_t *v = json_object_get(c, key);

	return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static bool jflag(const json_t *c, const char *key)
{
	return json_is_true(json_object_get(c, key));
}

struct fd_ctx {
	int fd;
	const char *path;
};

static void file_id(int fd, struct mg_file_id *id)
{
	struct stat st;

	if (fstat(fd, &st) == 0) {
		id->dev = (uint64_t)st.st_dev;
		id->ino = (uint64_t)st.st_ino;
		id->size = (uint64_t)st.st_size;
		id->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
}

static int fd_read(void *ctx, void *buf, size_t len, uint64_t off, char *err, size_t errlen)
{
	struct fd_ctx *f = ctx;

	return source_read_full(f->fd, f->path, buf, len, off, err, errlen);
}

/* @bytes of the .bin at @off: pread, or a ranged GET (If-Match the
 * create's ETag; a refusal or an outage parks the batch, source.h). */
static int bin_read(struct mg_source *src, void *buf, size_t bytes, uint64_t off, char *err,
		    size_t errlen)
{
	if (!bytes)
		return 0;
	if (src->bin_ranged)
		return source_read_range(&src->base, src->bin_path, off, bytes, buf, err, errlen);
	return source_read_full(src->bin_fd, src->bin_path, buf, bytes, off, err, errlen);
}

static bool is_idx(void *arg, const char *url)
{
	return strcmp(url, arg) == 0;
}

/* The objects' identity for the index cache: their URL and ETag (an object
 * without an ETag by the cached copy's identity, or by its URL and size
 * when read by range). */
static int object_ids(struct mg_source *src)
{
	char id[4800];

	if (source_is_url(src->idx_path) && source_object_id(&src->base, src->idx_path, id,
							     sizeof(id)) == 0 &&
	    !(src->idx_object = strdup(id)))
		return -ENOMEM;
	if (source_is_url(src->bin_path) && source_object_id(&src->base, src->bin_path, id,
							     sizeof(id)) == 0 &&
	    !(src->bin_object = strdup(id)))
		return -ENOMEM;
	if (src->bin_ranged && !src->bin_object) {
		snprintf(id, sizeof(id), "%s (no ETag) %llu", src->bin_path,
			 (unsigned long long)src->bin_id.size);
		if (!(src->bin_object = strdup(id)))
			return -ENOMEM;
	}
	src->idx_id.object = src->idx_object;
	src->bin_id.object = src->bin_object;
	return 0;
}

/* The .bin: opened (a local file, a cached object) or, in a store and more
 * than the cache holds with its .idx, read by range; the .idx fetched whole. */
static int open_bin(struct mg_source *src, uint64_t *bin_size, char *err, size_t errlen)
{
	char *v[2] = { src->bin_path, src->idx_path };
	int r = 0;

	if (source_is_url(src->bin_path) || source_is_url(src->idx_path))
		r = source_range_urls_but(&src->base, v, 2, is_idx, src->idx_path,
					  "a megatron .idx is read whole (only its .bin by range)",
					  err, errlen);
	if (r < 0)
		return r;
	src->bin_ranged = source_ranged(&src->base, src->bin_path);
	if (!src->bin_ranged)
		return source_open_file(&src->base, src->bin_path, &src->bin_fd, bin_size, err,
					errlen);
	r = source_object_size(&src->base, src->bin_path, bin_size, err, errlen);
	src->bin_id.size = *bin_size;
	return r;
}

/* Open the pair and read the .idx's header; the rest of it is read only
 * when the index is not in the cache (read_idx()). */
static int open_pair(struct mg_source *src, const char *prefix, char *err, size_t errlen)
{
	size_t plen = strlen(prefix);
	uint64_t idx_size = 0, bin_size = 0;
	struct fd_ctx f;
	int r;

	src->idx_path = malloc(plen + 5);
	src->bin_path = malloc(plen + 5);
	if (!src->idx_path || !src->bin_path)
		return -ENOMEM;
	snprintf(src->idx_path, plen + 5, "%s.idx", prefix);
	snprintf(src->bin_path, plen + 5, "%s.bin", prefix);
	r = open_bin(src, &bin_size, err, errlen);
	if (r >= 0)
		r = source_open_file(&src->base, src->idx_path, &src->idx_fd, &idx_size, err,
				     errlen);
	if (r < 0)
		return r;
	if (src->bin_fd >= 0)
		file_id(src->bin_fd, &src->bin_id);
	file_id(src->idx_fd, &src->idx_id);
	if (object_ids(src) < 0)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", src->bin_path);
	f = (struct fd_ctx){ src->idx_fd, src->idx_path };
	return mmidx_parse_header(&src->idx, fd_read, &f, src->idx_path, idx_size, bin_size, err,
				  errlen);
}

/* The rest of the .idx read and checked against the .bin. */
static int read_idx(struct mg_source *src, char *err, size_t errlen)
{
	struct fd_ctx f = { src->idx_fd, src->idx_path };
	int r = mmidx_parse_body(&src->idx, fd_read, &f, src->idx_path, src->bin_path, err,
				 errlen);

	free(src->idx.docidx);        /* checked; samples run across documents */
	src->idx.docidx = NULL;
	/* after the checks, as before the cache (an .idx that a cached index was
	 * built from never holds floats) */
	if (r >= 0 && (src->idx.dtype == LDR_DTYPE_FLOAT32 || src->idx.dtype == LDR_DTYPE_FLOAT64))
		r = errfmt(-EINVAL, err, errlen, "%s: offset 17: dtype %s (code %d) does not hold "
			   "token ids", src->idx_path, mmidx_code_name(src->idx.code),
			   src->idx.code);
	return r;
}

/* The sequences of the spec's split, as megatron rounds them. */
static int split_range(const json_t *c, uint64_t nseq, struct mg_params *p, char *err,
		       size_t errlen)
{
	const char *subset = json_string_value(json_object_get(c, "subset"));
	int which = 0;
	double lo, hi;

	while (which < 2 && strcmp(subset, subsets[which]) != 0)
		which++;
	if (split_bookends(json_string_value(json_object_get(c, "split")), which, &lo, &hi) != 0)
		return errfmt(-EINVAL, err, errlen, "source.split: gives the %s subset nothing",
			      subset);
	/* Python's int(round(x)): half to even, as rint() in the default mode */
	p->beg = (uint64_t)rint(lo * (double)nseq);
	p->end = (uint64_t)rint(hi * (double)nseq);
	if (p->end <= p->beg)
		return errfmt(-EINVAL, err, errlen, "source.split: the %s subset of %llu sequences "
			      "is empty", subset, (unsigned long long)nseq);
	return 0;
}

/* Every token of the split's sequences below vocab_size; the error names the offset. */
static int check_vocab(struct mg_source *src, const int32_t *lengths, const int64_t *pointers,
		       const struct mg_params *p, char *err, size_t errlen);

static void set_fields(struct mg_source *src)
{
	static const char *const names[] = { "tokens", "labels", "loss_mask", "position_ids" };
	int dtypes[] = { src->out_dtype, src->out_dtype, LDR_DTYPE_FLOAT32, LDR_DTYPE_INT64 };

	src->base.nfields = 4;
	for (int i = 0; i < 4; i++) {
		struct field_desc *f = &src->base.fields[i];

		snprintf(f->name, sizeof(f->name), "%s", names[i]);
		f->dtype = dtypes[i];
		f->ndim = 1;
		f->shape[0] = src->seq_len;
		f->sample_bytes = (size_t)src->seq_len * dtype_size(dtypes[i]);
	}
}

static int megatron_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct mg_source *src = (struct mg_source *)base;
	const json_t *c = spec->source.mg;
	struct mg_params p = { 0 };
	int r;

	src->bin_fd = -1;
	src->idx_fd = -1;
	src->seq_len = (uint32_t)jint(c, "seq_len", 0);
	src->extra = jflag(c, "add_extra_token") ? 1 : 0;
	src->eod = jint(c, "eod", -2);
	src->pad = jint(c, "pad", -1);
	if (src->pad == src->eod)     /* megatron: a pad that is a special token is -1 */
		src->pad = -1;
	src->vocab = jint(c, "vocab_size", 0);
	src->eod_mask_loss = jflag(c, "eod_mask_loss");
	src->reset_position_ids = jflag(c, "reset_position_ids");
	src->out_dtype = strcmp(json_string_value(json_object_get(c, "output_dtype")), "int32") == 0
		? LDR_DTYPE_INT32 : LDR_DTYPE_INT64;
	r = open_pair(src, json_string_value(json_object_get(c, "prefix")), err, errlen);
	if (r < 0)
		return r;
	r = split_range(c, src->idx.nseq, &p, err, errlen);
	if (r < 0) {
		char e2[4608];      /* a damaged .idx is the error to name first */
		int r2 = read_idx(src, e2, sizeof(e2));

		return r2 < 0 ? errfmt(r2, err, errlen, "%s", e2) : r;
	}
	p.seq_len = src->seq_len;
	p.seed = (uint32_t)jint(c, "seed", 1234);
	p.num_samples = (uint64_t)jint(c, "num_samples", 0);
	p.extra = src->extra;
	/* in the cache: the .idx was checked when it was built (its identity is
	 * the key) and its lengths and pointers are there; else read it now */
	if (mg_index_find(&src->ix, src->idx.nseq, &src->idx_id, &src->bin_id, &p) == 0) {
		src->origin.reused = true;
	} else {
		r = read_idx(src, err, errlen);
		if (r < 0)
			return r;
	}
	close(src->idx_fd);
	src->idx_fd = -1;
	if (src->vocab) {
		const int32_t *l = src->ix.map ? src->ix.lengths : src->idx.lengths;
		const int64_t *q = src->ix.map ? src->ix.pointers : src->idx.pointers;

		r = check_vocab(src, l, q, &p, err, errlen);
		if (r < 0)
			return r;
	}
	if (!src->ix.map) {
		r = mg_index_get(&src->ix, src->idx.lengths, src->idx.pointers, src->idx.nseq,
				 &src->idx_id, &src->bin_id, &p, &src->origin, src->bin_path, err,
				 errlen);
		if (r < 0)
			return r;
	}
	src->lengths = src->ix.lengths;
	src->pointers = src->ix.pointers;
	src->base.nsamples = src->ix.nsamples;
	src->base.index_bytes = src->ix.ndoc * 4 + src->ix.nsamples * (src->ix.shuffle_wide ? 16 : 12) +
				src->idx.nseq * 12;
	set_fields(src);
	return 0;
}

#define WIDEN(T)                                                                \
	static void widen_##T(int64_t *restrict out, const void *restrict raw, size_t n) \
	{                                                                       \
		const T *in = raw;                                              \
		for (size_t j = 0; j < n; j++)                                  \
			out[j] = (int64_t)in[j];                                \
	}
WIDEN(uint8_t)
WIDEN(int8_t)
WIDEN(int16_t)
WIDEN(uint16_t)
WIDEN(int32_t)

static void widen(int dtype, int64_t *out, const void *raw, size_t n)
{
	switch (dtype) {
	case LDR_DTYPE_UINT8: widen_uint8_t(out, raw, n); break;
	case LDR_DTYPE_INT8: widen_int8_t(out, raw, n); break;
	case LDR_DTYPE_INT16: widen_int16_t(out, raw, n); break;
	case LDR_DTYPE_UINT16: widen_uint16_t(out, raw, n); break;
	case LDR_DTYPE_INT32: widen_int32_t(out, raw, n); break;
	default: memcpy(out, raw, n * sizeof(*out)); break;
	}
}

static int vocab_error(const struct mg_source *src, const int64_t *t, size_t n, uint64_t off,
		       char *err, size_t errlen)
{
	for (size_t j = 0; j < n; j++)
		if (t[j] < 0 || t[j] >= src->vocab)
			return errfmt(-EINVAL, err, errlen, "%s: offset %llu: token id %lld is not "
				      "in 0..%lld (source.vocab_size %lld)", src->bin_path,
				      (unsigned long long)(off + j * src->idx.elem),
				      (long long)t[j], (long long)(src->vocab - 1),
				      (long long)src->vocab);
	return 0;
}

#define VOCAB_CHUNK 65536

static int check_vocab(struct mg_source *src, const int32_t *lengths, const int64_t *pointers,
		       const struct mg_params *p, char *err, size_t errlen)
{
	uint64_t from = (uint64_t)pointers[p->beg], to;
	int64_t *t = malloc(VOCAB_CHUNK * sizeof(*t));
	void *raw = malloc(VOCAB_CHUNK * src->idx.elem);
	int r = 0;

	to = (uint64_t)pointers[p->end - 1] + (uint64_t)lengths[p->end - 1] * src->idx.elem;
	if (!t || !raw) {
		free(t);
		free(raw);
		return -ENOMEM;
	}
	/* the split's sequences ascend without overlap (mmidx.c), so scan the span */
	for (uint64_t off = from; off < to && r >= 0;) {
		size_t n = (size_t)((to - off) / src->idx.elem);

		if (n > VOCAB_CHUNK)
			n = VOCAB_CHUNK;
		r = bin_read(src, raw, n * src->idx.elem, off, err, errlen);
		if (r >= 0) {
			widen(src->idx.dtype, t, raw, n);
			r = vocab_error(src, t, n, off, err, errlen);
		}
		off += n * src->idx.elem;
	}
	free(t);
	free(raw);
	return r;
}


/* Tokens [off, off + len) of sequence @seq into text + *n. */
static int piece(struct mg_source *src, int64_t *text, void *raw, size_t *n, size_t want,
		 int64_t seq, int64_t off, int64_t len, char *err, size_t errlen)
{
	uint64_t at;
	int r;

	if (seq < 0 || (uint64_t)seq >= src->idx.nseq || len < 0 || off < 0 ||
	    off + len > src->lengths[seq] || (uint64_t)len > want - *n)
		return errfmt(-EIO, err, errlen, "%s: sample piece of sequence %lld [%lld, +%lld) "
			      "out of range", src->bin_path, (long long)seq, (long long)off,
			      (long long)len);
	at = (uint64_t)src->pointers[seq] + (uint64_t)off * src->idx.elem;
	r = bin_read(src, raw, (size_t)len * src->idx.elem, at, err, errlen);
	if (r < 0)
		return r;
	widen(src->idx.dtype, text + *n, raw, (size_t)len);
	if (src->vocab) {
		r = vocab_error(src, text + *n, (size_t)len, at, err, errlen);
		if (r < 0)
			return r;
	}
	*n += (size_t)len;
	return 0;
}

/* The length of sequence @seq, 0 out of range (piece() says so). */
static int64_t seq_length(const struct mg_source *src, int64_t seq)
{
	return seq >= 0 && (uint64_t)seq < src->idx.nseq ? src->lengths[seq] : 0;
}

/*
 * _query_document_sample_shuffle_indices(): the seq_len + extra tokens of
 * @idx. Every position followed is checked first: a cached index is used
 * as it is (megatron-cache.c), so a damaged one is an error, never a read
 * out of its arrays.
 */
static int gather(struct mg_source *src, uint64_t idx, int64_t *text, void *raw, char *err,
		  size_t errlen)
{
	const struct mg_index *ix = &src->ix;
	size_t want = src->seq_len + (size_t)src->extra, n = 0;
	uint64_t j = idx < ix->nsamples ? mg_shuffle_at(ix, idx) : UINT64_MAX;
	int64_t d0, o0, d1, o1;
	int r = 0;

	if (j >= ix->nsamples)
		return errfmt(-EIO, err, errlen, "%s: sample %llu: shuffle index %lld out of range "
			      "(the cached index is damaged)", src->bin_path,
			      (unsigned long long)idx, (long long)j);
	d0 = ix->sample[2 * j];
	o0 = ix->sample[2 * j + 1];
	d1 = ix->sample[2 * j + 2];
	o1 = ix->sample[2 * j + 3];
	if (d0 < 0 || d1 < d0 || (uint64_t)d1 >= ix->ndoc)
		return errfmt(-EIO, err, errlen, "%s: sample %llu: document positions %lld..%lld "
			      "out of range (the cached index is damaged)", src->bin_path,
			      (unsigned long long)idx, (long long)d0, (long long)d1);

	if (d0 == d1) {
		r = piece(src, text, raw, &n, want, ix->doc[d0], o0, o1 - o0 + src->extra, err,
			  errlen);
	} else {
		for (int64_t i = d0; i <= d1 && r >= 0; i++) {
			int64_t seq = ix->doc[i], off = i > d0 ? 0 : o0;
			int64_t len = i < d1 ? seq_length(src, seq) - off : o1 + src->extra;

			r = piece(src, text, raw, &n, want, seq, off, len, err, errlen);
		}
	}
	while (r >= 0 && n < want)
		text[n++] = src->pad;
	return r;
}

/*
 * Sample @idx as megatron's GPTDataset.__getitem__ gives it, in one pass
 * over the gathered tokens: tokens = text[0, L), labels = text[1, L] (the
 * last one pad without the extra token), the loss mask and position ids
 * from them, then pad written as 0 straight into the fields.
 */
static int megatron_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
			 void *const *dsts, char *err, size_t errlen)
{
	struct mg_source *src = (struct mg_source *)base;
	size_t L = src->seq_len, want = L + 1;
	/* the sample as int64, then its raw bytes */
	int64_t *text = source_scratch((want + want * src->idx.elem / 8 + 1) * sizeof(int64_t));
	int64_t *pos = dsts[3], start = 0, pad = src->pad, eod = src->eod;
	bool out32 = src->out_dtype == LDR_DTYPE_INT32;
	float *loss = dsts[2];
	int r;

	(void)ctx;
	if (!text)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", src->bin_path);
	r = gather(src, idx, text, text + want, err, errlen);
	if (r < 0)
		return r;
	for (size_t k = 0; k < L; k++) {
		int64_t t = text[k], l = k + 1 < L || src->extra ? text[k + 1] : pad;

		loss[k] = (src->eod_mask_loss && t == eod) || l == pad ? 0.0f : 1.0f;
		pos[k] = (int64_t)k - start;
		if (src->reset_position_ids && t == eod)
			start = (int64_t)k + 1;
		t = t == pad ? 0 : t;
		l = l == pad ? 0 : l;
		if (out32) {
			((int32_t *)dsts[0])[k] = (int32_t)t;
			((int32_t *)dsts[1])[k] = (int32_t)l;
		} else {
			((int64_t *)dsts[0])[k] = t;
			((int64_t *)dsts[1])[k] = l;
		}
	}
	return 0;
}

static json_t *megatron_cache_json(const struct source *base)
{
	const struct mg_source *src = (const struct mg_source *)base;

	json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:I}",
			      "index", src->origin.reused ? "reused" : "built",
			      "epochs", (json_int_t)src->ix.epochs,
			      "documents", (json_int_t)(src->idx.ndocidx - 1),
			      "sequences", (json_int_t)src->idx.nseq,
			      "samples", (json_int_t)src->ix.nsamples);

	if (j && !src->origin.reused)
		json_object_set_new(j, "build_seconds", json_real(src->origin.build_s));
	if (j && src->origin.note[0])
		json_object_set_new(j, "note", json_string(src->origin.note));
	return j;
}

static void megatron_close(struct source *base)
{
	struct mg_source *src = (struct mg_source *)base;

	if (src->bin_fd >= 0)
		close(src->bin_fd);
	if (src->idx_fd >= 0)
		close(src->idx_fd);
	free(src->bin_path);
	free(src->idx_path);
	free(src->bin_object);
	free(src->idx_object);
	mmidx_free(&src->idx);
	mg_index_free(&src->ix);
}

const struct source_ops source_megatron_ops = {
	.parse = parse_megatron,
	.source_json = megatron_json,
	.size = sizeof(struct mg_source),
	.open = megatron_open,
	.read = megatron_read,
	.cache_json = megatron_cache_json,
	.close = megatron_close,
};
