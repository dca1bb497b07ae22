/* SPDX-License-Identifier: MIT */
/* test-mmidx - the Megatron .idx parser (common/mmidx.h): a valid index of
 * every dtype, then each check's exact error with the file and the offset,
 * and its two halves (header, body) one after the other */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mmidx.h"

/* An .idx as megatron-core's _IndexWriter writes it: @n sequences of
 * lengths 3, 4, 5... (elements of @elem bytes), one per document. */
static size_t make_idx(unsigned char *buf, int code, size_t elem, uint64_t n, bool modes)
{
	uint64_t one = 1, d = n + 1, ptr = 0;
	size_t off = 0;

	memcpy(buf, "MMIDIDX\0\0", 9);
	memcpy(buf + 9, &one, 8);
	buf[17] = (unsigned char)code;
	memcpy(buf + 18, &n, 8);
	memcpy(buf + 26, &d, 8);
	off = 34;
	for (uint64_t i = 0; i < n; i++, off += 4) {
		int32_t len = (int32_t)(3 + i);
		memcpy(buf + off, &len, 4);
	}
	for (uint64_t i = 0; i < n; i++, off += 8) {
		memcpy(buf + off, &ptr, 8);
		ptr += (3 + i) * elem;
	}
	for (uint64_t j = 0; j <= n; j++, off += 8)
		memcpy(buf + off, &j, 8);
	if (modes)
		for (uint64_t i = 0; i < n; i++)
			buf[off++] = 0;
	return off;
}

static uint64_t bin_bytes(size_t elem, uint64_t n)
{
	return (3 * n + n * (n - 1) / 2) * elem;
}

static void expect(const unsigned char *buf, size_t len, uint64_t bin, const char *want)
{
	struct mmidx m;
	char err[512] = "";
	int r = mmidx_parse_buf(&m, buf, len, "x.idx", "x.bin", bin, err, sizeof(err));

	if (r >= 0 || strcmp(err, want) != 0) {
		fprintf(stderr, "got %d \"%s\"\nwant \"%s\"\n", r, err, want);
		assert(0);
	}
}

static void test_valid(void)
{
	static const struct { int code; size_t elem; const char *name; } codes[] = {
		{ 1, 1, "uint8" }, { 2, 1, "int8" }, { 3, 2, "int16" }, { 4, 4, "int32" },
		{ 5, 8, "int64" }, { 6, 8, "float64" }, { 7, 4, "float32" }, { 8, 2, "uint16" },
	};
	unsigned char buf[4096];

	for (size_t c = 0; c < sizeof(codes) / sizeof(codes[0]); c++) {
		for (int modes = 0; modes < 2; modes++) {
			size_t len = make_idx(buf, codes[c].code, codes[c].elem, 10, modes);
			struct mmidx m;
			char err[512];

			assert(mmidx_parse_buf(&m, buf, len, "x.idx", "x.bin",
					       bin_bytes(codes[c].elem, 10), err, sizeof(err)) == 0);
			assert(m.nseq == 10 && m.ndocidx == 11 && m.elem == codes[c].elem);
			assert(m.multimodal == (bool)modes);
			assert(m.ntokens == 3 * 10 + 45);
			assert(m.lengths[9] == 12 && m.docidx[10] == 10);
			assert(!strcmp(mmidx_code_name(m.code), codes[c].name));
			mmidx_free(&m);
		}
	}
	/* no sequences, one document index: an empty dataset is valid */
	size_t len = make_idx(buf, 8, 2, 0, false);
	struct mmidx m;
	char err[512];
	assert(mmidx_parse_buf(&m, buf, len, "x.idx", "x.bin", 0, err, sizeof(err)) == 0);
	assert(m.nseq == 0 && m.ntokens == 0);
	mmidx_free(&m);
}

static void test_errors(void)
{
	unsigned char buf[4096];
	uint64_t bin = bin_bytes(2, 10), v;
	size_t len;
	int32_t l;
	int64_t p;

#define FRESH() (len = make_idx(buf, 8, 2, 10, false))
	FRESH();
	expect(buf, 33, bin, "x.idx: 33 bytes, shorter than the 34-byte header");
	buf[3] = 'X';
	expect(buf, len, bin, "x.idx: offset 0: not a Megatron indexed dataset index (magic is not "
	       "\"MMIDIDX\\x00\\x00\")");
	FRESH();
	v = 2;
	memcpy(buf + 9, &v, 8);
	expect(buf, len, bin, "x.idx: offset 9: version 2 (only 1 is known)");
	FRESH();
	buf[17] = 9;
	expect(buf, len, bin, "x.idx: offset 17: dtype code 9 is not one of 1..8");
	FRESH();
	v = 11;
	memcpy(buf + 18, &v, 8);
	expect(buf, len, bin, "x.idx: offset 18: 11 sequences and 11 document indices need 254 "
	       "bytes (or 265 with sequence modes), the file has 242");
	FRESH();
	v = UINT64_MAX;
	memcpy(buf + 26, &v, 8);
	expect(buf, len, bin, "x.idx: offset 18: 10 sequences and 18446744073709551615 document "
	       "indices need 0 bytes (or 0 with sequence modes), the file has 242");
	FRESH();
	expect(buf, len - 1, bin, "x.idx: offset 18: 10 sequences and 11 document indices need 242 "
	       "bytes (or 252 with sequence modes), the file has 241");
	FRESH();
	l = -4;
	memcpy(buf + 34 + 4 * 3, &l, 4);
	expect(buf, len, bin, "x.idx: offset 46: sequence 3 has length -4");
	FRESH();
	p = 2;
	memcpy(buf + 74 + 8 * 1, &p, 8);
	expect(buf, len, bin, "x.idx: offset 82: sequence 1 pointer 2 is before the end of "
	       "sequence 0 (6): pointers must ascend");
	FRESH();
	expect(buf, len, bin - 1, "x.idx: offset 146: sequence 9 pointer 126 + 12 uint16 elements "
	       "is past the end of x.bin (149 bytes)");
	FRESH();
	expect(buf, len, bin + 2, "x.bin: 152 bytes, but the sequences of x.idx end at byte 150");
	FRESH();
	p = INT64_MAX;
	memcpy(buf + 74 + 8 * 9, &p, 8);
	expect(buf, len, bin, "x.idx: offset 146: sequence 9 pointer 9223372036854775807 + 12 "
	       "uint16 elements is past the end of x.bin (150 bytes)");
	FRESH();
	p = 3;
	memcpy(buf + 154, &p, 8);
	expect(buf, len, bin, "x.idx: offset 154: document index 0 is 3, must be 0");
	FRESH();
	p = 1;
	memcpy(buf + 154 + 8 * 4, &p, 8);
	expect(buf, len, bin, "x.idx: offset 186: document index 4 is 1, not in 3..10");
	FRESH();
	p = 9;
	memcpy(buf + 154 + 8 * 10, &p, 8);
	expect(buf, len, bin, "x.idx: offset 234: the last document index is 9, must be the "
	       "sequence count 10");
	FRESH();
	v = 0;
	memcpy(buf + 26, &v, 8);
	expect(buf, 34 + 120, bin, "x.idx: offset 26: no document indices (there must be at least "
	       "the leading 0)");
#undef FRESH
}

static int mem_read(void *ctx, void *buf, size_t len, uint64_t off, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	memcpy(buf, (const unsigned char *)ctx + off, len);
	return 0;
}

/* The header alone reads no array; a body that fails frees what it read
 * and leaves the header's fields (source-megatron.c reads the body only
 * when its index is not cached). */
static void test_halves(void)
{
	unsigned char buf[4096];
	size_t len = make_idx(buf, 4, 4, 10, false);
	struct mmidx m;
	char err[512];
	int32_t l = -1;

	assert(mmidx_parse_header(&m, mem_read, buf, "x.idx", len, bin_bytes(4, 10), err,
				  sizeof(err)) == 0);
	assert(m.nseq == 10 && m.ndocidx == 11 && m.elem == 4 && m.code == 4);
	assert(!m.lengths && !m.pointers && !m.docidx && m.ntokens == 0);
	assert(mmidx_parse_body(&m, mem_read, buf, "x.idx", "x.bin", err, sizeof(err)) == 0);
	assert(m.ntokens == 75 && m.lengths[9] == 12 && m.pointers[1] == 12 && m.docidx[10] == 10);
	mmidx_free(&m);
	memcpy(buf + 34 + 4 * 2, &l, 4);
	assert(mmidx_parse_header(&m, mem_read, buf, "x.idx", len, bin_bytes(4, 10), err,
				  sizeof(err)) == 0);
	assert(mmidx_parse_body(&m, mem_read, buf, "x.idx", "x.bin", err, sizeof(err)) < 0);
	assert(!strcmp(err, "x.idx: offset 42: sequence 2 has length -1"));
	assert(m.nseq == 10 && m.ndocidx == 11 && m.bin_size == bin_bytes(4, 10));
	assert(!m.lengths && !m.pointers && !m.docidx && m.ntokens == 0);
}

int main(void)
{
	test_valid();
	test_errors();
	test_halves();
	printf("test-mmidx: ok\n");
	return 0;
}
