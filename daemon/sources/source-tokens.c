/* SPDX-License-Identifier: MIT */
/* source-tokens - a flat file of token ids cut into (input, target) sequences */

/*
 * Sample i is tokens [i*L, i*L + L) as input and the same shifted by one as
 * target, read as L+1 tokens at once into a per-thread buffer and widened to
 * int64 unless output_dtype keeps the file's dtype.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "source-private.h"
#include "spec.h"

#define SEQ_LEN_MAX (1u << 24)

struct tokens_source {
	struct source base;
	int fd;
	char *path;
	int dtype;
	int out_dtype;
	size_t elem;
	uint32_t seq_len;
};

/* ---- the spec ---- */

static int parse_tokens(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "path", "dtype", "seq_len", "output_dtype", NULL };
	const char *key = spec_unknown_key(src, keys);
	const char *s;
	json_t *v;
	int64_t seq_len = 0;
	int r;

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);

	r = spec_required_path(src, &spec->source.path, err, errlen);
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
			return spec_fail(err, errlen, "source.dtype: must be one of uint16, uint32, int32");
	}

	if (!json_object_get(src, "seq_len"))
		return spec_fail(err, errlen, "source.seq_len: is required");
	r = spec_get_int(src, "seq_len", "source.seq_len", 1, SEQ_LEN_MAX,
			 "an integer in 1..16777216", &seq_len, err, errlen);
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
			return spec_fail(err, errlen,
					 "source.output_dtype: must be int64 or the source dtype (%s)",
					 dtype_name(spec->source.dtype));
	}
	return 0;
}

static json_t *tokens_json(const struct spec *spec)
{
	return json_pack("{s:s, s:s, s:s, s:I, s:s}", "kind", "tokens",
			 "path", spec->source.path,
			 "dtype", dtype_name(spec->source.dtype),
			 "seq_len", (json_int_t)spec->source.seq_len,
			 "output_dtype", dtype_name(spec->source.output_dtype));
}

/* ---- the dataset ---- */

static int tokens_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct tokens_source *src = (struct tokens_source *)base;
	uint64_t size = 0, ntokens;
	int r;

	src->fd = -1;
	src->dtype = spec->source.dtype;
	src->out_dtype = spec->source.output_dtype;
	src->elem = dtype_size(src->dtype);
	src->seq_len = spec->source.seq_len;
	if (!src->elem || !dtype_size(src->out_dtype) || src->seq_len == 0)
		return errfmt(-EINVAL, err, errlen, "%s: invalid token source", spec->source.path);
	src->path = strdup(spec->source.path);
	if (!src->path)
		return -ENOMEM;
	r = source_open_file(base, src->path, &src->fd, &size, err, errlen);
	if (r < 0)
		return r;
	if (size % src->elem)
		return errfmt(-EINVAL, err, errlen,
			    "%s: size %llu is not a multiple of %zu bytes (%s tokens)", src->path,
			    (unsigned long long)size, src->elem, dtype_name(src->dtype));
	ntokens = size / src->elem;
	if (ntokens < (uint64_t)src->seq_len + 1)
		return errfmt(-EINVAL, err, errlen, "%s: too small for seq_len %u: %llu tokens",
			    src->path, src->seq_len, (unsigned long long)ntokens);
	src->base.nsamples = (ntokens - 1) / src->seq_len;

	src->base.nfields = 2;
	for (int i = 0; i < 2; i++) {
		struct field_desc *f = &src->base.fields[i];

		snprintf(f->name, sizeof(f->name), "%s", i == 0 ? "input" : "target");
		f->dtype = src->out_dtype;
		f->ndim = 1;
		f->shape[0] = src->seq_len;
		f->sample_bytes = (size_t)src->seq_len * dtype_size(src->out_dtype);
	}
	return 0;
}

/* One buffer of L+1 tokens per worker thread, freed when the thread exits. */
static pthread_key_t tokbuf_key;
static pthread_once_t tokbuf_once = PTHREAD_ONCE_INIT;

struct tokbuf {
	size_t cap;
	unsigned char data[];
};

static void tokbuf_init(void)
{
	if (pthread_key_create(&tokbuf_key, free) != 0)
		abort();
}

static void *tokbuf_get(size_t len)
{
	struct tokbuf *b;

	pthread_once(&tokbuf_once, tokbuf_init);
	b = pthread_getspecific(tokbuf_key);
	if (b && b->cap >= len)
		return b->data;
	free(b);
	pthread_setspecific(tokbuf_key, NULL);
	b = malloc(sizeof(*b) + len);
	if (!b)
		return NULL;
	b->cap = len;
	if (pthread_setspecific(tokbuf_key, b) != 0) {
		free(b);
		return NULL;
	}
	return b->data;
}

#define WIDEN(T)                                                             \
	static void widen_##T(int64_t *restrict in, int64_t *restrict tg,    \
			      const T *restrict buf, size_t n)               \
	{                                                                    \
		for (size_t j = 0; j < n; j++)                               \
			in[j] = (int64_t)buf[j];                             \
		for (size_t j = 0; j < n; j++)                               \
			tg[j] = (int64_t)buf[j + 1];                         \
	}
WIDEN(uint16_t)
WIDEN(uint32_t)
WIDEN(int32_t)

static int tokens_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
		       void *const *dsts, char *err, size_t errlen)
{
	struct tokens_source *src = (struct tokens_source *)base;
	size_t n = src->seq_len;
	size_t len = (n + 1) * src->elem;
	uint64_t off = idx * n * src->elem;
	void *buf = tokbuf_get(len);
	int r;

	(void)ctx;
	if (!buf)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory for %zu bytes", src->path,
			    len);
	r = source_read_full(src->fd, src->path, buf, len, off, err, errlen);
	if (r < 0)
		return r;
	if (src->out_dtype == src->dtype) {
		memcpy(dsts[0], buf, n * src->elem);
		memcpy(dsts[1], (char *)buf + src->elem, n * src->elem);
		return 0;
	}
	switch (src->dtype) {
	case LDR_DTYPE_UINT16:
		widen_uint16_t(dsts[0], dsts[1], buf, n);
		break;
	case LDR_DTYPE_UINT32:
		widen_uint32_t(dsts[0], dsts[1], buf, n);
		break;
	case LDR_DTYPE_INT32:
		widen_int32_t(dsts[0], dsts[1], buf, n);
		break;
	default:
		return errfmt(-EINVAL, err, errlen, "%s: unsupported token dtype", src->path);
	}
	return 0;
}


static void tokens_close(struct source *base)
{
	struct tokens_source *src = (struct tokens_source *)base;

	if (src->fd >= 0)
		close(src->fd);
	free(src->path);
}

const struct source_ops source_tokens_ops = {
	.parse = parse_tokens,
	.source_json = tokens_json,
	.size = sizeof(struct tokens_source),
	.open = tokens_open,
	.read = tokens_read,
	.close = tokens_close,
};
