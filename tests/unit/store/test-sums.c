/* SPDX-License-Identifier: MIT */
/* test-sums - CRC32, CRC32C, CRC64NVME and SHA-256 in base64
 * (daemon/store/sums.c), as S3's x-amz-checksum-* headers carry them: known
 * vectors (CRC "123456789" 0xCBF43926, 0xE3069283 and 0xAE8B14860A799888,
 * CRC64NVME of 32 zero bytes 0xCF3473434D4ECF3B as in AWS's CRT tests,
 * FIPS 180-4's "abc" and two-block message),
 * and a body fed in pieces of every size gives the sum of the whole; the
 * fast CRCs give what the portable tables give */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sums.h"

static void sum_of(enum sum_kind kind, const void *data, size_t len, size_t piece, char out[48])
{
	const unsigned char *p = data;
	struct sum s;

	sum_init(&s, kind);
	for (size_t at = 0; at < len; at += piece)
		sum_update(&s, p + at, len - at < piece ? len - at : piece);
	sum_base64(&s, out);
}

static void test_vectors(void)
{
	/* the text, then its CRC32, CRC32C, SHA-256 and CRC64NVME in base64
	 * (Python's zlib and hashlib; CRC64NVME's "123456789" the catalogue's
	 * check value) */
	static const char *const cases[][5] = {
		{ "", "AAAAAA==", "AAAAAA==", "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", "AAAAAAAAAAA=" },
		{ "123456789", "y/Q5Jg==", "4waSgw==", "FeKw08M4keuw8e9gnsQZQgwg4yDOlMZfvIwzEkSOsiU=", "rosUhgp5mIg=" },
		{ "abc", "NSRBwg==", "Nks/tw==", "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=", "BeXKuz/B+us=" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "Fxo/Xw==", "BxMl9Q==", "JI1qYdIGOLjlwCaTDD5gOaM85Flk/yFn9uzt1BnbBsE=", "8Bp3HekfkNQ=" },
	};
	static const char zeros[32];
	char out[48];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t n = strlen(cases[i][0]);

		sum_of(SUM_CRC32, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][1]));
		sum_of(SUM_CRC32C, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][2]));
		sum_of(SUM_SHA256, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][3]));
		sum_of(SUM_CRC64NVME, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][4]));
	}
	sum_of(SUM_CRC64NVME, zeros, sizeof zeros, sizeof zeros, out);
	assert(!strcmp(out, "zzRzQ01Ozzs=")); /* 0xCF3473434D4ECF3B */
	assert(!strcmp(sum_name(SUM_CRC64NVME), "crc64nvme"));
	assert(!strcmp(sum_name(SUM_CRC32C), "crc32c"));
}

static void test_pieces(void)
{
	static const char *const want[] = { "HtV7uQ==", "jboFDQ==", "UztpiFCEm3kIsgoiZY9jnAsqR28XkfhfUBiCh8Mamro=",
					    "TByYOhLtV9A=" };
	static const enum sum_kind kinds[] = { SUM_CRC32, SUM_CRC32C, SUM_SHA256, SUM_CRC64NVME };
	unsigned char body[1000];
	char out[48];

	for (size_t i = 0; i < sizeof body; i++)
		body[i] = (unsigned char)(i * 131 + 7);
	for (int k = 0; k < 4; k++)
		for (size_t piece = 1; piece <= 130; piece++) {
			sum_of(kinds[k], body, sizeof body, piece, out);
			assert(!strcmp(out, want[k]));
		}
}

/* The fast CRCs (SSE4.2's instruction for CRC32C, zlib's CRC32, PCLMULQDQ
 * folding for CRC64NVME) against the portable tables: every length 0..300
 * at every start 0..15 (unaligned heads and tails), lengths around the
 * three streams' runs (3 x 256 and 3 x 8192 bytes) and the folding's least
 * (256), and a body fed in odd pieces. */
static void test_fast_against_tables(void)
{
	static const enum sum_kind kinds[] = { SUM_CRC32, SUM_CRC32C, SUM_CRC64NVME };
	static const size_t around[] = { 255, 256, 257, 767, 768, 769, 1535, 1536, 24575, 24576, 24577,
					 24576 + 768 + 13, 3 * 24576 + 5, 100000 };
	enum { N = 100000 + 16 };
	static unsigned char body[N];
	uint32_t x = 28;

	for (size_t i = 0; i < N; i++) {
		x = x * 1103515245u + 12345u;
		body[i] = (unsigned char)(x >> 16);
	}
	for (int k = 0; k < 3; k++) {
		uint64_t ones = kinds[k] == SUM_CRC64NVME ? ~(uint64_t)0 : 0xFFFFFFFFu;
		uint64_t seed = kinds[k] == SUM_CRC64NVME ? 0x0123456789ABCDEFu : 0x12345678u;

		for (size_t start = 0; start < 16; start++)
			for (size_t len = 0; len <= 300; len++)
				assert(sum_crc(kinds[k], ones, body + start, len) ==
				       sum_crc_portable(kinds[k], ones, body + start, len));
		for (size_t i = 0; i < sizeof around / sizeof around[0]; i++)
			for (size_t start = 0; start < 9; start += 3)
				assert(sum_crc(kinds[k], seed, body + start, around[i]) ==
				       sum_crc_portable(kinds[k], seed, body + start, around[i]));
		/* incremental: odd pieces give the whole's register */
		for (size_t piece = 1; piece < 40000; piece = piece * 3 + 1) {
			uint64_t c = ones;

			for (size_t at = 0; at < 100000; at += piece)
				c = sum_crc(kinds[k], c, body + at, 100000 - at < piece ? 100000 - at : piece);
			assert(c == sum_crc_portable(kinds[k], ones, body, 100000));
		}
	}
	printf("sums: crc32 by %s, crc32c by %s, crc64nvme by %s\n", sum_crc_impl(SUM_CRC32),
	       sum_crc_impl(SUM_CRC32C), sum_crc_impl(SUM_CRC64NVME));
}

int main(void)
{
	test_vectors();
	test_pieces();
	test_fast_against_tables();
	printf("sums: ok\n");
	return 0;
}
