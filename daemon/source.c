/* SPDX-License-Identifier: MIT */
/* source - where samples come from: token files, .npy arrays, images */

/*
 * Dataset files are read with pread only, never mapped: a file truncated or
 * replaced under a running pipeline then gives a clear error with -EIO
 * instead of SIGBUS in a worker thread. Every worker reads concurrently from
 * the same descriptors; pread keeps no shared file offset, so no lock.
 *
 * The .npy header is untrusted input and is parsed by hand with bounded
 * lengths: a magic string, a version, a length and a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (N, d1, ...), }.
 *
 * Image sources (image_folder, webdataset) list their files once here
 * (imageset), then each read decodes one file (image) and resamples it
 * straight into the batch slot (imageop). A sample's random crop and flip
 * come from (seed, epoch, index) only.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "image.h"
#include "imageop.h"
#include "imageset.h"
#include "source.h"

#define NPY_HEADER_MAX (1u << 20)

struct npy_file {
	int fd;
	char *path;
	uint64_t data_offset;
	size_t row_bytes;
};

struct source {
	enum source_kind kind;
	uint64_t nsamples;
	size_t nfields;
	struct field_desc fields[SOURCE_MAX_FIELDS];
	/* tokens */
	int fd;
	char *path;
	int dtype;
	int out_dtype;
	size_t elem;
	uint32_t seq_len;
	/* npy */
	struct npy_file files[SOURCE_MAX_FIELDS];
	size_t nfiles;
	/* images */
	struct imageset *images;
	struct imageop *op;
	bool on_error_fail;
	_Atomic uint64_t skipped;
};

/* Read exactly @len bytes at @off; short reads are a truncated file. */
static int read_full(int fd, const char *path, void *buf, size_t len, uint64_t off, char *err,
		     size_t errlen)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errfmt(-errno, err, errlen, "%s: read failed at offset %llu: %s", path,
				    (unsigned long long)(off + got), strerror(errno));
		}
		if (n == 0)
			return errfmt(-EIO, err, errlen,
				    "%s: truncated: wanted %zu bytes at offset %llu, got %zu", path,
				    len, (unsigned long long)off, got);
		got += (size_t)n;
	}
	return 0;
}

static int open_file(const char *path, int *fd_out, uint64_t *size_out, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return errfmt(-errno, err, errlen, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		int r = -errno;
		close(fd);
		return errfmt(r, err, errlen, "%s: %s", path, strerror(-r));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return errfmt(-EINVAL, err, errlen, "%s: not a regular file", path);
	}
	*fd_out = fd;
	*size_out = (uint64_t)st.st_size;
	return 0;
}

/* ---- tokens ---- */

static int tokens_open(struct source *src, const struct spec *spec, char *err, size_t errlen)
{
	uint64_t size = 0, ntokens;
	int r;

	src->dtype = spec->source.dtype;
	src->out_dtype = spec->source.output_dtype;
	src->elem = dtype_size(src->dtype);
	src->seq_len = spec->source.seq_len;
	if (!src->elem || !dtype_size(src->out_dtype) || src->seq_len == 0)
		return errfmt(-EINVAL, err, errlen, "%s: invalid token source", spec->source.path);
	src->path = strdup(spec->source.path);
	if (!src->path)
		return -ENOMEM;
	r = open_file(src->path, &src->fd, &size, err, errlen);
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
	src->nsamples = (ntokens - 1) / src->seq_len;

	src->nfields = 2;
	for (int i = 0; i < 2; i++) {
		struct field_desc *f = &src->fields[i];

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

static int tokens_read(struct source *src, uint64_t idx, void *const *dsts, char *err,
		       size_t errlen)
{
	size_t n = src->seq_len;
	size_t len = (n + 1) * src->elem;
	uint64_t off = idx * n * src->elem;
	void *buf = tokbuf_get(len);
	int r;

	if (!buf)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory for %zu bytes", src->path,
			    len);
	r = read_full(src->fd, src->path, buf, len, off, err, errlen);
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

/* ---- npy ---- */

struct cursor {
	const char *p, *end;
};

static void skip_ws(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

static bool eat(struct cursor *c, char ch)
{
	skip_ws(c);
	if (c->p < c->end && *c->p == ch) {
		c->p++;
		return true;
	}
	return false;
}

/* A quoted Python string without escapes, copied into @buf (bounded). */
static bool parse_str(struct cursor *c, char *buf, size_t size)
{
	char q;
	size_t n = 0;

	skip_ws(c);
	if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
		return false;
	q = *c->p++;
	while (c->p < c->end && *c->p != q) {
		if (*c->p == '\\' || (unsigned char)*c->p < 0x20 || n + 1 >= size)
			return false;
		buf[n++] = *c->p++;
	}
	if (c->p >= c->end)
		return false;
	c->p++;
	buf[n] = '\0';
	return true;
}

static bool parse_word(struct cursor *c, const char *w)
{
	size_t n = strlen(w);

	skip_ws(c);
	if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0)
		return false;
	c->p += n;
	return true;
}

static bool parse_uint(struct cursor *c, int64_t *out)
{
	int64_t v = 0;
	bool any = false;

	skip_ws(c);
	while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
		if (v > (INT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (*c->p++ - '0');
		any = true;
	}
	if (!any)
		return false;
	if (c->p < c->end && *c->p == 'L') /* Python 2 long */
		c->p++;
	*out = v;
	return true;
}

/* (N,) or (N, d1, ...) or (); returns ndim or -1. */
static int parse_shape(struct cursor *c, int64_t *shape, int max)
{
	int n = 0;

	if (!eat(c, '('))
		return -1;
	if (eat(c, ')'))
		return 0;
	for (;;) {
		if (n >= max)
			return -2;
		if (!parse_uint(c, &shape[n++]))
			return -1;
		if (eat(c, ')'))
			return n;
		if (!eat(c, ','))
			return -1;
		if (eat(c, ')'))
			return n;
	}
}

struct npy_header {
	char descr[32];
	bool fortran;
	int ndim;
	int64_t shape[LDR_MAX_DIMS];
};

static int npy_parse_dict(const char *path, const char *text, size_t len,
			  struct npy_header *h, char *err, size_t errlen)
{
	struct cursor c = { text, text + len };
	bool have_descr = false, have_fortran = false, have_shape = false;
	char key[32];

	if (!eat(&c, '{'))
		return errfmt(-EINVAL, err, errlen, "%s: bad header: not a dict", path);
	for (;;) {
		if (eat(&c, '}'))
			break;
		if (!parse_str(&c, key, sizeof(key)) || !eat(&c, ':'))
			return errfmt(-EINVAL, err, errlen, "%s: bad header: expected a key", path);
		if (strcmp(key, "descr") == 0 && !have_descr) {
			skip_ws(&c);
			if (c.p < c.end && *c.p == '[')
				return errfmt(-EINVAL, err, errlen,
					    "%s: structured dtypes are not supported", path);
			if (!parse_str(&c, h->descr, sizeof(h->descr)))
				return errfmt(-EINVAL, err, errlen, "%s: bad header: bad descr",
					    path);
			have_descr = true;
		} else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
			if (parse_word(&c, "True"))
				h->fortran = true;
			else if (parse_word(&c, "False"))
				h->fortran = false;
			else
				return errfmt(-EINVAL, err, errlen,
					    "%s: bad header: bad fortran_order", path);
			have_fortran = true;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			h->ndim = parse_shape(&c, h->shape, LDR_MAX_DIMS);
			if (h->ndim == -2)
				return errfmt(-EINVAL, err, errlen,
					    "%s: more than %d dimensions are not supported", path,
					    LDR_MAX_DIMS);
			if (h->ndim < 0)
				return errfmt(-EINVAL, err, errlen, "%s: bad header: bad shape",
					    path);
			have_shape = true;
		} else {
			return errfmt(-EINVAL, err, errlen, "%s: bad header: unexpected key '%s'",
				    path, key);
		}
		if (eat(&c, '}'))
			break;
		if (!eat(&c, ','))
			return errfmt(-EINVAL, err, errlen, "%s: bad header: expected ',' or '}'",
				    path);
	}
	skip_ws(&c);
	if (c.p != c.end)
		return errfmt(-EINVAL, err, errlen, "%s: bad header: trailing bytes after the dict",
			    path);
	if (!have_descr || !have_fortran || !have_shape)
		return errfmt(-EINVAL, err, errlen, "%s: bad header: missing %s", path,
			    !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
	return 0;
}

/* Map a numpy descr to a dtype; only little-endian (or byte) types. */
static int npy_dtype(const char *path, const char *descr, char *err, size_t errlen)
{
	static const struct {
		const char *code;
		int dtype;
	} types[] = {
		{ "b1", LDR_DTYPE_BOOL },   { "i1", LDR_DTYPE_INT8 },     { "u1", LDR_DTYPE_UINT8 },
		{ "i2", LDR_DTYPE_INT16 },  { "u2", LDR_DTYPE_UINT16 },   { "i4", LDR_DTYPE_INT32 },
		{ "u4", LDR_DTYPE_UINT32 }, { "i8", LDR_DTYPE_INT64 },    { "u8", LDR_DTYPE_UINT64 },
		{ "f2", LDR_DTYPE_FLOAT16 }, { "f4", LDR_DTYPE_FLOAT32 }, { "f8", LDR_DTYPE_FLOAT64 },
	};
	const bool host_le = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
	char order = descr[0];

	if (order != '<' && order != '>' && order != '|' && order != '=')
		return errfmt(-EINVAL, err, errlen, "%s: dtype '%s' is not supported", path, descr);
	for (size_t i = 0; i < ARRAY_SIZE(types); i++) {
		if (strcmp(descr + 1, types[i].code) != 0)
			continue;
		if (dtype_size(types[i].dtype) == 1)
			return types[i].dtype;
		if (order == '>' || (order == '<' && !host_le) || (order == '=' && !host_le))
			return errfmt(-EINVAL, err, errlen,
				    "%s: big-endian dtype '%s' is not supported", path, descr);
		if (order == '|')
			break;
		return types[i].dtype;
	}
	return errfmt(-EINVAL, err, errlen, "%s: dtype '%s' is not supported", path, descr);
}

static int npy_open_one(struct npy_file *file, struct field_desc *f, uint64_t *nrows,
			char *err, size_t errlen)
{
	const char *path = file->path;
	unsigned char pre[12];
	struct npy_header h = { 0 };
	uint64_t size = 0, hlen, prelen, need, nelem = 1;
	char *text;
	int dtype, r;

	r = open_file(path, &file->fd, &size, err, errlen);
	if (r < 0)
		return r;
	if (size < 10)
		return errfmt(-EINVAL, err, errlen, "%s: not a .npy file (too short)", path);
	r = read_full(file->fd, path, pre, 10, 0, err, errlen);
	if (r < 0)
		return r;
	if (memcmp(pre, "\x93NUMPY", 6) != 0)
		return errfmt(-EINVAL, err, errlen, "%s: not a .npy file (bad magic)", path);
	if (pre[6] == 1 && pre[7] == 0) {
		hlen = pre[8] | (uint64_t)pre[9] << 8;
		prelen = 10;
	} else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0) {
		if (size < 12)
			return errfmt(-EINVAL, err, errlen, "%s: truncated header", path);
		r = read_full(file->fd, path, pre + 10, 2, 10, err, errlen);
		if (r < 0)
			return r;
		hlen = pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 |
		       (uint64_t)pre[11] << 24;
		prelen = 12;
	} else {
		return errfmt(-EINVAL, err, errlen, "%s: unsupported .npy version %u.%u", path,
			    pre[6], pre[7]);
	}
	if (hlen > NPY_HEADER_MAX)
		return errfmt(-EINVAL, err, errlen, "%s: header too long (%llu bytes)", path,
			    (unsigned long long)hlen);
	if (size < prelen + hlen)
		return errfmt(-EINVAL, err, errlen, "%s: truncated header", path);
	text = malloc(hlen + 1);
	if (!text)
		return -ENOMEM;
	r = read_full(file->fd, path, text, hlen, prelen, err, errlen);
	if (r == 0) {
		text[hlen] = '\0';
		r = npy_parse_dict(path, text, hlen, &h, err, errlen);
	}
	free(text);
	if (r < 0)
		return r;

	if (h.fortran)
		return errfmt(-EINVAL, err, errlen, "%s: Fortran order is not supported", path);
	dtype = npy_dtype(path, h.descr, err, errlen);
	if (dtype < 0)
		return dtype;
	if (h.ndim == 0)
		return errfmt(-EINVAL, err, errlen,
			    "%s: 0-d arrays are not supported (shape ()): need one row per sample",
			    path);
	if (h.shape[0] == 0)
		return errfmt(-EINVAL, err, errlen, "%s: no samples (shape[0] is 0)", path);
	f->dtype = dtype;
	f->ndim = h.ndim - 1;
	for (int i = 1; i < h.ndim; i++) {
		if (h.shape[i] == 0)
			return errfmt(-EINVAL, err, errlen, "%s: dimension %d is 0", path, i);
		if (__builtin_mul_overflow(nelem, (uint64_t)h.shape[i], &nelem))
			return errfmt(-EINVAL, err, errlen, "%s: shape too large", path);
		f->shape[i - 1] = h.shape[i];
	}
	if (__builtin_mul_overflow(nelem, (uint64_t)dtype_size(dtype), &nelem) ||
	    nelem > SIZE_MAX / 2 ||
	    __builtin_mul_overflow((uint64_t)h.shape[0], nelem, &need) ||
	    __builtin_add_overflow(need, prelen + hlen, &need))
		return errfmt(-EINVAL, err, errlen, "%s: shape too large", path);
	f->sample_bytes = (size_t)nelem;
	file->row_bytes = (size_t)nelem;
	file->data_offset = prelen + hlen;
	if (size < need)
		return errfmt(-EINVAL, err, errlen,
			    "%s: truncated: shape needs %llu bytes, the file has %llu", path,
			    (unsigned long long)need, (unsigned long long)size);
	*nrows = (uint64_t)h.shape[0];
	return 0;
}

static int npy_open(struct source *src, const struct spec *spec, char *err, size_t errlen)
{
	if (spec->source.npaths < 1 || spec->source.npaths > SOURCE_MAX_FIELDS)
		return errfmt(-EINVAL, err, errlen, "npy source: 1..%d paths", SOURCE_MAX_FIELDS);
	for (size_t i = 0; i < spec->source.npaths; i++) {
		struct npy_file *file = &src->files[i];
		struct field_desc *f = &src->fields[i];
		uint64_t nrows = 0;
		int r;

		file->fd = -1;
		file->path = strdup(spec->source.paths[i]);
		if (!file->path)
			return -ENOMEM;
		src->nfiles = i + 1;
		if (spec_npy_stem(file->path, f->name) < 0)
			return errfmt(-EINVAL, err, errlen, "%s: bad file stem for a field name",
				    file->path);
		for (size_t j = 0; j < i; j++)
			if (strcmp(src->fields[j].name, f->name) == 0)
				return errfmt(-EINVAL, err, errlen,
					    "%s: field name \"%s\" is already used by %s",
					    file->path, f->name, src->files[j].path);
		r = npy_open_one(file, f, &nrows, err, errlen);
		if (r < 0)
			return r;
		if (i == 0)
			src->nsamples = nrows;
		else if (nrows != src->nsamples)
			return errfmt(-EINVAL, err, errlen,
				    "%s: has %llu rows but %s has %llu: all arrays need the same first dimension",
				    file->path, (unsigned long long)nrows, src->files[0].path,
				    (unsigned long long)src->nsamples);
	}
	src->nfields = spec->source.npaths;
	return 0;
}

static int npy_read(struct source *src, uint64_t idx, void *const *dsts, char *err,
		    size_t errlen)
{
	for (size_t i = 0; i < src->nfiles; i++) {
		const struct npy_file *file = &src->files[i];
		int r = read_full(file->fd, file->path, dsts[i], file->row_bytes,
				  file->data_offset + idx * file->row_bytes, err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

/* ---- images ---- */

static int images_open(struct source *src, const struct spec *spec, char *err, size_t errlen)
{
	struct field_desc *img = &src->fields[0], *lab = &src->fields[1];
	uint32_t h = spec->image_h, w = spec->image_w;
	int r;

	if (spec->kind == SOURCE_IMAGE_FOLDER)
		r = imageset_open_folder(&src->images, spec->source.root, err, errlen);
	else
		r = imageset_open_webdataset(&src->images, spec->source.urls, spec->source.nurls,
					     err, errlen);
	if (r < 0)
		return r;
	src->op = malloc(sizeof(*src->op));
	if (!src->op)
		return -ENOMEM;
	imageop_init(src->op, spec);
	src->on_error_fail = spec->on_error_fail;
	src->nsamples = imageset_count(src->images);
	src->nfields = 2;

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

/* Decode and transform sample @j into @dsts. */
static int image_sample(struct source *src, const struct sample_ctx *ctx, uint64_t j,
			void *const *dsts, char *err, size_t errlen)
{
	struct image_scratch *s = image_scratch_get();
	const struct imageop *op = src->op;
	struct imageop_plan plan;
	struct image_info info;
	char msg[384], what[320];
	size_t len = 0;
	int64_t label = 0;
	int r;

	if (!s)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the image decoder");
	r = imageset_read(src->images, j, &s->file, &s->file_cap, &len, &label, err, errlen);
	if (r < 0)
		return r;
	r = image_probe(s, s->file, len, &info, msg, sizeof(msg));
	if (r == 0)
		r = imageop_plan(op, info.width, info.height,
				 imageop_key(ctx ? ctx->seed : 0, ctx ? ctx->epoch : 0, j), &plan,
				 msg, sizeof(msg));
	if (r == 0)
		r = imageop_decode_run(op, s, &plan, s->file, len, &info, dsts[0], msg, sizeof(msg));
	if (r < 0) {
		imageset_describe(src->images, j, what, sizeof(what));
		return errfmt(r, err, errlen, "%s: %s", what, msg);
	}
	memcpy(dsts[1], &label, sizeof(label));
	return 0;
}

static int images_read(struct source *src, const struct sample_ctx *ctx, uint64_t idx,
		       void *const *dsts, char *err, size_t errlen)
{
	uint64_t n = src->nsamples, j = idx;
	char last[512];

	for (uint64_t tries = 0; tries < n; tries++) {
		int r = image_sample(src, ctx, j, dsts, err, errlen);

		if (r == 0)
			return 0;
		if (r == -ENOMEM || src->on_error_fail)
			return r;
		atomic_fetch_add_explicit(&src->skipped, 1, memory_order_relaxed);
		j = j + 1 == n ? 0 : j + 1;
	}
	snprintf(last, sizeof(last), "%s", err ? err : "");
	return errfmt(-EINVAL, err, errlen, "no sample could be decoded (the last error: %s)", last);
}

/* ---- the interface ---- */

int source_open(struct source **out, const struct spec *spec, char *err, size_t errlen)
{
	struct source *src;
	int r;

	if (err && errlen)
		err[0] = '\0';
	src = calloc(1, sizeof(*src));
	if (!src)
		return -ENOMEM;
	src->fd = -1;
	src->kind = spec->kind;
	if (spec->kind == SOURCE_TOKENS)
		r = tokens_open(src, spec, err, errlen);
	else if (spec->kind == SOURCE_NPY)
		r = npy_open(src, spec, err, errlen);
	else if (spec_is_image(spec))
		r = images_open(src, spec, err, errlen);
	else
		r = errfmt(-EINVAL, err, errlen, "unknown source kind %d", (int)spec->kind);
	if (r < 0) {
		if (r == -ENOMEM && err && errlen && !err[0])
			snprintf(err, errlen, "source: out of memory");
		source_free(src);
		return r;
	}
	*out = src;
	return 0;
}

struct source *source_free(struct source *src)
{
	if (!src)
		return NULL;
	if (src->fd >= 0)
		close(src->fd);
	free(src->path);
	for (size_t i = 0; i < src->nfiles; i++) {
		if (src->files[i].fd >= 0)
			close(src->files[i].fd);
		free(src->files[i].path);
	}
	imageset_free(src->images);
	free(src->op);
	free(src);
	return NULL;
}

uint64_t source_nsamples(const struct source *src)
{
	return src->nsamples;
}

size_t source_nfields(const struct source *src)
{
	return src->nfields;
}

const struct field_desc *source_field(const struct source *src, size_t i)
{
	return i < src->nfields ? &src->fields[i] : NULL;
}

int source_read(struct source *src, const struct sample_ctx *ctx, uint64_t idx, void *const *dsts,
		char *err, size_t errlen)
{
	if (idx >= src->nsamples)
		return errfmt(-EINVAL, err, errlen, "sample %llu out of range (%llu samples)",
			    (unsigned long long)idx, (unsigned long long)src->nsamples);
	if (src->kind == SOURCE_TOKENS)
		return tokens_read(src, idx, dsts, err, errlen);
	if (src->kind == SOURCE_NPY)
		return npy_read(src, idx, dsts, err, errlen);
	return images_read(src, ctx, idx, dsts, err, errlen);
}

uint64_t source_skipped(const struct source *src)
{
	return atomic_load_explicit(&((struct source *)src)->skipped, memory_order_relaxed);
}
