/* SPDX-License-Identifier: MIT */
/* mmidx - the .idx of a Megatron-LM indexed dataset, parsed and checked (mmidx.h) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mmidx.h"

static const struct {
	const char *name;
	int dtype;
} codes[] = {
	[1] = { "uint8", LDR_DTYPE_UINT8 },   [2] = { "int8", LDR_DTYPE_INT8 },
	[3] = { "int16", LDR_DTYPE_INT16 },   [4] = { "int32", LDR_DTYPE_INT32 },
	[5] = { "int64", LDR_DTYPE_INT64 },   [6] = { "float64", LDR_DTYPE_FLOAT64 },
	[7] = { "float32", LDR_DTYPE_FLOAT32 }, [8] = { "uint16", LDR_DTYPE_UINT16 },
};

const char *mmidx_code_name(int code)
{
	return code >= 1 && code <= 8 ? codes[code].name : NULL;
}

static uint64_t le64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

void mmidx_free(struct mmidx *m)
{
	free(m->lengths);
	free(m->pointers);
	free(m->docidx);
	memset(m, 0, sizeof(*m));
}

static int parse_header(struct mmidx *m, const unsigned char *h, const char *idx_path,
			uint64_t idx_size, char *err, size_t errlen)
{
	uint64_t version, body, n, d;

	if (memcmp(h, "MMIDIDX\0\0", 9) != 0)
		return errfmt(-EINVAL, err, errlen,
			      "%s: offset 0: not a Megatron indexed dataset index (magic is not "
			      "\"MMIDIDX\\x00\\x00\")", idx_path);
	version = le64(h + 9);
	if (version != 1)
		return errfmt(-EINVAL, err, errlen, "%s: offset 9: version %llu (only 1 is known)",
			      idx_path, (unsigned long long)version);
	m->code = h[17];
	if (!mmidx_code_name(m->code))
		return errfmt(-EINVAL, err, errlen,
			      "%s: offset 17: dtype code %d is not one of 1..8", idx_path, m->code);
	m->dtype = codes[m->code].dtype;
	m->elem = dtype_size(m->dtype);
	n = le64(h + 18);
	d = le64(h + 26);
	body = idx_size - MMIDX_HEADER_BYTES;
	/* each count is bounded by the file before any product is formed */
	if (n > body / 12 || d > body / 8 || n * 12 + d * 8 > body ||
	    (body - n * 12 - d * 8 != 0 && body - n * 12 - d * 8 != n))
		return errfmt(-EINVAL, err, errlen,
			      "%s: offset 18: %llu sequences and %llu document indices need %llu "
			      "bytes (or %llu with sequence modes), the file has %llu",
			      idx_path, (unsigned long long)n, (unsigned long long)d,
			      n > body || d > body ? 0ULL
			      : (unsigned long long)(MMIDX_HEADER_BYTES + n * 12 + d * 8),
			      n > body || d > body ? 0ULL
			      : (unsigned long long)(MMIDX_HEADER_BYTES + n * 13 + d * 8),
			      (unsigned long long)idx_size);
	if (d == 0)
		return errfmt(-EINVAL, err, errlen,
			      "%s: offset 26: no document indices (there must be at least the "
			      "leading 0)", idx_path);
	m->nseq = n;
	m->ndocidx = d;
	m->multimodal = body - n * 12 - d * 8 == n && n > 0;
	return 0;
}

static int check_sequences(struct mmidx *m, const char *idx_path, const char *bin_path,
			   char *err, size_t errlen)
{
	uint64_t end = 0, ptr_off = MMIDX_HEADER_BYTES + m->nseq * 4;

	for (uint64_t i = 0; i < m->nseq; i++) {
		int64_t len = m->lengths[i], ptr = m->pointers[i];
		uint64_t bytes;

		if (len < 0)
			return errfmt(-EINVAL, err, errlen, "%s: offset %llu: sequence %llu has "
				      "length %lld", idx_path,
				      (unsigned long long)(MMIDX_HEADER_BYTES + i * 4),
				      (unsigned long long)i, (long long)len);
		if (ptr < 0 || (uint64_t)ptr < end)
			return errfmt(-EINVAL, err, errlen, "%s: offset %llu: sequence %llu "
				      "pointer %lld is before the end of sequence %llu (%llu): "
				      "pointers must ascend", idx_path,
				      (unsigned long long)(ptr_off + i * 8), (unsigned long long)i,
				      (long long)ptr, (unsigned long long)(i ? i - 1 : 0),
				      (unsigned long long)end);
		bytes = (uint64_t)len * m->elem;
		if ((uint64_t)ptr > m->bin_size || bytes > m->bin_size - (uint64_t)ptr)
			return errfmt(-EINVAL, err, errlen, "%s: offset %llu: sequence %llu "
				      "pointer %lld + %lld %s elements is past the end of %s "
				      "(%llu bytes)", idx_path,
				      (unsigned long long)(ptr_off + i * 8), (unsigned long long)i,
				      (long long)ptr, (long long)len, codes[m->code].name,
				      bin_path, (unsigned long long)m->bin_size);
		end = (uint64_t)ptr + bytes;
		m->ntokens += (uint64_t)len;
	}
	if (end != m->bin_size)
		return errfmt(-EINVAL, err, errlen, "%s: %llu bytes, but the sequences of %s end at "
			      "byte %llu", bin_path, (unsigned long long)m->bin_size, idx_path,
			      (unsigned long long)end);
	return 0;
}

static int check_documents(const struct mmidx *m, const char *idx_path, char *err, size_t errlen)
{
	uint64_t off = MMIDX_HEADER_BYTES + m->nseq * 12;

	if (m->docidx[0] != 0)
		return errfmt(-EINVAL, err, errlen, "%s: offset %llu: document index 0 is %lld, "
			      "must be 0", idx_path, (unsigned long long)off,
			      (long long)m->docidx[0]);
	for (uint64_t j = 1; j < m->ndocidx; j++)
		if (m->docidx[j] < m->docidx[j - 1] || (uint64_t)m->docidx[j] > m->nseq)
			return errfmt(-EINVAL, err, errlen, "%s: offset %llu: document index %llu "
				      "is %lld, not in %lld..%llu", idx_path,
				      (unsigned long long)(off + j * 8), (unsigned long long)j,
				      (long long)m->docidx[j], (long long)m->docidx[j - 1],
				      (unsigned long long)m->nseq);
	if ((uint64_t)m->docidx[m->ndocidx - 1] != m->nseq)
		return errfmt(-EINVAL, err, errlen, "%s: offset %llu: the last document index is "
			      "%lld, must be the sequence count %llu", idx_path,
			      (unsigned long long)(off + (m->ndocidx - 1) * 8),
			      (long long)m->docidx[m->ndocidx - 1], (unsigned long long)m->nseq);
	return 0;
}

int mmidx_parse_header(struct mmidx *out, mmidx_read_fn read, void *ctx, const char *idx_path,
		       uint64_t idx_size, uint64_t bin_size, char *err, size_t errlen)
{
	unsigned char h[MMIDX_HEADER_BYTES];
	int r;

	memset(out, 0, sizeof(*out));
	out->bin_size = bin_size;
	if (idx_size < MMIDX_HEADER_BYTES)
		return errfmt(-EINVAL, err, errlen, "%s: %llu bytes, shorter than the %d-byte "
			      "header", idx_path, (unsigned long long)idx_size,
			      MMIDX_HEADER_BYTES);
	r = read(ctx, h, sizeof(h), 0, err, errlen);
	if (r < 0)
		return r;
	return parse_header(out, h, idx_path, idx_size, err, errlen);
}

int mmidx_parse_body(struct mmidx *m, mmidx_read_fn read, void *ctx, const char *idx_path,
		     const char *bin_path, char *err, size_t errlen)
{
	struct mmidx head;
	int r;

	m->lengths = malloc(m->nseq ? m->nseq * 4 : 1);
	m->pointers = malloc(m->nseq ? m->nseq * 8 : 1);
	m->docidx = malloc(m->ndocidx * 8);
	if (!m->lengths || !m->pointers || !m->docidx) {
		r = errfmt(-ENOMEM, err, errlen, "%s: out of memory for %llu sequences",
			   idx_path, (unsigned long long)m->nseq);
		goto fail;
	}
	r = read(ctx, m->lengths, m->nseq * 4, MMIDX_HEADER_BYTES, err, errlen);
	if (r >= 0)
		r = read(ctx, m->pointers, m->nseq * 8, MMIDX_HEADER_BYTES + m->nseq * 4, err,
			 errlen);
	if (r >= 0)
		r = read(ctx, m->docidx, m->ndocidx * 8, MMIDX_HEADER_BYTES + m->nseq * 12, err,
			 errlen);
	if (r >= 0)
		r = check_sequences(m, idx_path, bin_path, err, errlen);
	if (r >= 0)
		r = check_documents(m, idx_path, err, errlen);
	if (r >= 0)
		return 0;
fail:
	head = *m;                    /* the header's fields stay */
	head.lengths = NULL;
	head.pointers = NULL;
	head.docidx = NULL;
	head.ntokens = 0;
	mmidx_free(m);
	*m = head;
	return r;
}

int mmidx_parse(struct mmidx *out, mmidx_read_fn read, void *ctx, const char *idx_path,
		uint64_t idx_size, const char *bin_path, uint64_t bin_size, char *err,
		size_t errlen)
{
	int r = mmidx_parse_header(out, read, ctx, idx_path, idx_size, bin_size, err, errlen);

	if (r >= 0)
		r = mmidx_parse_body(out, read, ctx, idx_path, bin_path, err, errlen);
	if (r < 0)
		memset(out, 0, sizeof(*out));
	return r;
}

struct membuf {
	const unsigned char *p;
	size_t len;
	const char *path;
};

static int mem_read(void *ctx, void *buf, size_t len, uint64_t off, char *err, size_t errlen)
{
	struct membuf *b = ctx;

	if (off > b->len || len > b->len - off)
		return errfmt(-EIO, err, errlen, "%s: truncated at offset %llu", b->path,
			      (unsigned long long)off);
	if (len)
		memcpy(buf, b->p + off, len);
	return 0;
}

int mmidx_parse_buf(struct mmidx *out, const void *buf, size_t len, const char *idx_path,
		    const char *bin_path, uint64_t bin_size, char *err, size_t errlen)
{
	struct membuf b = { buf, len, idx_path };

	return mmidx_parse(out, mem_read, &b, idx_path, len, bin_path, bin_size, err, errlen);
}
