/* SPDX-License-Identifier: MIT */
/* test-md5 - MD5 (daemon/store/sums.c, an ETag's): RFC 1321's test suite, and a body fed
 * in pieces of every size gives the digest of the whole */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "sums.h"

static void digest(const char *s, char hex[65])
{
	struct sum m;

	sum_init(&m, SUM_MD5);
	sum_update(&m, s, strlen(s));
	sum_hex(&m, hex);
}

static void test_rfc1321(void)
{
	static const char *const cases[][2] = {
		{ "", "d41d8cd98f00b204e9800998ecf8427e" },
		{ "a", "0cc175b9c0f1b6a831c399e269772661" },
		{ "abc", "900150983cd24fb0d6963f7d28e17f72" },
		{ "message digest", "f96b697d7cb7938d525a2f31aaf161d0" },
		{ "abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b" },
		{ "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
		  "d174ab98d277d9f5a5611c2c9f419d9f" },
		{ "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
		  "57edf4a22be3c955ac49da2e2107b67a" },
	};
	char hex[65];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		digest(cases[i][0], hex);
		assert(!strcmp(hex, cases[i][1]));
	}
}

/* 1000 bytes fed in pieces of 1..130 bytes: the digest of the whole, the
 * padding crossing a block at every length from 0 to 129 */
static void test_pieces(void)
{
	unsigned char body[1000];
	char whole[65], hex[65];

	for (size_t i = 0; i < sizeof body; i++)
		body[i] = (unsigned char)(i * 131 + 7);
	for (size_t len = 0; len < 130; len++) {
		struct sum m;
		char ref[65];

		sum_init(&m, SUM_MD5);
		sum_update(&m, body, len);
		sum_hex(&m, ref);
		for (size_t piece = 1; piece <= 130; piece += 43) {
			sum_init(&m, SUM_MD5);
			for (size_t at = 0; at < len; at += piece)
				sum_update(&m, body + at, len - at < piece ? len - at : piece);
			sum_hex(&m, hex);
			assert(!strcmp(hex, ref));
		}
	}
	for (size_t piece = 1; piece <= 130; piece++) {
		struct sum m;

		sum_init(&m, SUM_MD5);
		for (size_t at = 0; at < sizeof body; at += piece)
			sum_update(&m, body + at, sizeof body - at < piece ? sizeof body - at : piece);
		sum_hex(&m, hex);
		if (piece == 1)
			memcpy(whole, hex, sizeof whole);
		assert(!strcmp(hex, whole));
	}
	/* python3 -c 'print(hashlib.md5(bytes((i*131+7)&255 for i in range(1000))).hexdigest())' */
	assert(!strcmp(whole, "0b8ae90ded6089334e353eb2669ab5e6"));
}

int main(void)
{
	test_rfc1321();
	test_pieces();
	printf("md5: ok\n");
	return 0;
}
