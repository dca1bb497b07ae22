/* SPDX-License-Identifier: MIT */
/* test-sums - CRC32, CRC32C and SHA-256 in base64 (daemon/store/sums.c), as
 * S3's x-amz-checksum-* headers carry them: known vectors (CRC "123456789"
 * 0xCBF43926 and 0xE3069283, FIPS 180-4's "abc" and two-block message),
 * and a body fed in pieces of every size gives the sum of the whole */
#undef NDEBUG
#include <assert.h>
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
	/* the text, then its CRC32, CRC32C and SHA-256 in base64 (Python's zlib and hashlib) */
	static const char *const cases[][4] = {
		{ "", "AAAAAA==", "AAAAAA==", "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=" },
		{ "123456789", "y/Q5Jg==", "4waSgw==", "FeKw08M4keuw8e9gnsQZQgwg4yDOlMZfvIwzEkSOsiU=" },
		{ "abc", "NSRBwg==", "Nks/tw==", "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "Fxo/Xw==", "BxMl9Q==", "JI1qYdIGOLjlwCaTDD5gOaM85Flk/yFn9uzt1BnbBsE=" },
	};
	char out[48];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t n = strlen(cases[i][0]);

		sum_of(SUM_CRC32, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][1]));
		sum_of(SUM_CRC32C, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][2]));
		sum_of(SUM_SHA256, cases[i][0], n, n ? n : 1, out);
		assert(!strcmp(out, cases[i][3]));
	}
	assert(!strcmp(sum_name(SUM_CRC32C), "crc32c"));
}

static void test_pieces(void)
{
	static const char *const want[] = { "HtV7uQ==", "jboFDQ==", "UztpiFCEm3kIsgoiZY9jnAsqR28XkfhfUBiCh8Mamro=" };
	static const enum sum_kind kinds[] = { SUM_CRC32, SUM_CRC32C, SUM_SHA256 };
	unsigned char body[1000];
	char out[48];

	for (size_t i = 0; i < sizeof body; i++)
		body[i] = (unsigned char)(i * 131 + 7);
	for (int k = 0; k < 3; k++)
		for (size_t piece = 1; piece <= 130; piece++) {
			sum_of(kinds[k], body, sizeof body, piece, out);
			assert(!strcmp(out, want[k]));
		}
}

int main(void)
{
	test_vectors();
	test_pieces();
	printf("sums: ok\n");
	return 0;
}
