/* SPDX-License-Identifier: MIT */
/* source-npy - one field per .npy array, sample i its row i */

/*
 * The .npy header is untrusted input and is parsed by hand with bounded
 * lengths: a magic string, a version, a length and a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (N, d1, ...), }.
 *
 * Arrays in a store more than cache_bytes in all are read by range
 * (docs/storage.md, "Read by range"): the header from one ranged GET of
 * its first NPY_HEAD_READ bytes (and one more for the rest of a longer
 * header), each sample's row one ranged GET per array straight into the
 * batch (a row of a C-order array is contiguous).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "source-private.h"
#include "spec.h"

#define SPEC_NPY_MAX_PATHS 16
#define NPY_HEADER_MAX (1u << 20)
#define NPY_HEAD_READ 4096 /* a ranged header's first GET: most headers are < 200 bytes */

struct npy_file {
	int fd;
	char *path;
	uint64_t data_offset;
	size_t row_bytes;
	bool ranged;         /* an object read by range: no fd */
	unsigned char *head; /* while the header is parsed: its first headn bytes */
	size_t headn;
};

struct npy_source {
	struct source base;
	struct npy_file files[SOURCE_MAX_FIELDS];
	size_t nfiles;
};

/* ---- the spec ---- */

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

static int parse_npy(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "paths", NULL };
	char stems[SPEC_NPY_MAX_PATHS][LDR_NAME_MAX + 1];
	const char *key = spec_unknown_key(src, keys);
	json_t *arr;
	size_t n;

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);
	arr = json_object_get(src, "paths");
	if (!arr)
		return spec_fail(err, errlen, "source.paths: is required");
	n = json_is_array(arr) ? json_array_size(arr) : 0;
	if (n < 1 || n > SPEC_NPY_MAX_PATHS)
		return spec_fail(err, errlen, "source.paths: must be an array of 1..%d strings",
				 SPEC_NPY_MAX_PATHS);
	spec->source.paths = calloc(n, sizeof(*spec->source.paths));
	if (!spec->source.paths)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = spec_plain_string(json_array_get(arr, i));

		if (!s)
			return spec_fail(err, errlen, "source.paths[%zu]: must be a non-empty string", i);
		if (spec_npy_stem(s, stems[i]) < 0)
			return spec_fail(err, errlen,
					 "source.paths[%zu]: the file stem (the field name) must be 1..%d characters",
					 i, LDR_NAME_MAX);
		for (size_t j = 0; j < i; j++)
			if (strcmp(stems[i], stems[j]) == 0)
				return spec_fail(err, errlen,
						 "source.paths[%zu]: field name \"%s\" (the file stem) is already used by source.paths[%zu]",
						 i, stems[i], j);
		spec->source.paths[i] = strdup(s);
		if (!spec->source.paths[i])
			return -ENOMEM;
		spec->source.npaths = i + 1;
	}
	return 0;
}

static json_t *npy_json(const struct spec *spec)
{
	json_t *paths = spec_strings_json(spec->source.paths, spec->source.npaths);

	return paths ? json_pack("{s:s, s:o}", "kind", "npy", "paths", paths) : NULL;
}

/* ---- the dataset ---- */

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

/* @len bytes at @off of @file: from its fd, or its first ranged GET's
 * bytes and a ranged GET for what is past them. */
static int npy_pread(const struct source *base, const struct npy_file *file, void *buf, size_t len,
		     uint64_t off, char *err, size_t errlen)
{
	size_t have = 0;

	if (!file->ranged)
		return source_read_full(file->fd, file->path, buf, len, off, err, errlen);
	if (off < file->headn) {
		have = file->headn - (size_t)off < len ? file->headn - (size_t)off : len;
		memcpy(buf, file->head + off, have);
	}
	if (have == len)
		return 0;
	return source_read_range(base, file->path, off + have, len - have, (char *)buf + have, err, errlen);
}

/* The object's size, and its first bytes (one ranged GET) or its fd. */
static int npy_open_file(const struct source *base, struct npy_file *file, uint64_t *size, char *err,
			 size_t errlen)
{
	int r;

	file->ranged = source_ranged(base, file->path);
	if (!file->ranged)
		return source_open_file(base, file->path, &file->fd, size, err, errlen);
	r = source_object_size(base, file->path, size, err, errlen);
	if (r < 0 || *size < 10)
		return r;
	file->headn = *size < NPY_HEAD_READ ? (size_t)*size : NPY_HEAD_READ;
	file->head = malloc(file->headn);
	if (!file->head)
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	r = source_read_range(base, file->path, 0, file->headn, file->head, err, errlen);
	if (r < 0)
		file->headn = 0;
	return r;
}

static int npy_open_one(const struct source *base, struct npy_file *file, struct field_desc *f,
			uint64_t *nrows, char *err, size_t errlen)
{
	const char *path = file->path;
	unsigned char pre[12];
	struct npy_header h = { 0 };
	uint64_t size = 0, hlen, prelen, need, nelem = 1;
	char *text;
	int dtype, r;

	r = npy_open_file(base, file, &size, err, errlen);
	if (r < 0)
		return r;
	if (size < 10)
		return errfmt(-EINVAL, err, errlen, "%s: not a .npy file (too short)", path);
	r = npy_pread(base, file, pre, 10, 0, err, errlen);
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
		r = npy_pread(base, file, pre + 10, 2, 10, err, errlen);
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
	r = npy_pread(base, file, text, hlen, prelen, err, errlen);
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

static int npy_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct npy_source *src = (struct npy_source *)base;

	if (spec->source.npaths < 1 || spec->source.npaths > SOURCE_MAX_FIELDS)
		return errfmt(-EINVAL, err, errlen, "npy source: 1..%d paths", SOURCE_MAX_FIELDS);
	for (size_t i = 0; i < spec->source.npaths; i++)
		src->files[i].fd = -1;
	/* the arrays in a store: all fetched at once (objects.c), or read by
	 * range when more than the cache holds */
	int r0 = source_range_urls(base, spec->source.paths, spec->source.npaths, err, errlen);
	if (r0 < 0)
		return r0;
	for (size_t i = 0; i < spec->source.npaths; i++) {
		struct npy_file *file = &src->files[i];
		struct field_desc *f = &src->base.fields[i];
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
			if (strcmp(src->base.fields[j].name, f->name) == 0)
				return errfmt(-EINVAL, err, errlen,
					    "%s: field name \"%s\" is already used by %s",
					    file->path, f->name, src->files[j].path);
		r = npy_open_one(base, file, f, &nrows, err, errlen);
		free(file->head); /* the header is parsed: rows are read by range */
		file->head = NULL;
		file->headn = 0;
		if (r < 0)
			return r;
		if (i == 0)
			src->base.nsamples = nrows;
		else if (nrows != src->base.nsamples)
			return errfmt(-EINVAL, err, errlen,
				    "%s: has %llu rows but %s has %llu: all arrays need the same first dimension",
				    file->path, (unsigned long long)nrows, src->files[0].path,
				    (unsigned long long)src->base.nsamples);
	}
	src->base.nfields = spec->source.npaths;
	return 0;
}

static int npy_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
		    void *const *dsts, char *err, size_t errlen)
{
	struct npy_source *src = (struct npy_source *)base;

	(void)ctx;
	for (size_t i = 0; i < src->nfiles; i++) {
		const struct npy_file *file = &src->files[i];
		uint64_t off = file->data_offset + idx * file->row_bytes;
		/* read by range: one GET per array, straight into the batch */
		int r = file->ranged ? source_read_range(base, file->path, off, file->row_bytes, dsts[i], err, errlen)
				     : source_read_full(file->fd, file->path, dsts[i], file->row_bytes, off, err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

static void npy_close(struct source *base)
{
	struct npy_source *src = (struct npy_source *)base;

	for (size_t i = 0; i < src->nfiles; i++) {
		if (src->files[i].fd >= 0)
			close(src->files[i].fd);
		free(src->files[i].path);
		free(src->files[i].head);
	}
}

const struct source_ops source_npy_ops = {
	.parse = parse_npy,
	.source_json = npy_json,
	.size = sizeof(struct npy_source),
	.open = npy_open,
	.read = npy_read,
	.close = npy_close,
};
