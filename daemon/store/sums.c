/* SPDX-License-Identifier: MIT */
/* sums - MD5 (RFC 1321), CRC32, CRC32C, CRC64NVME and SHA-256 (FIPS 180-4) of a body
 * as it streams in (see sums.h). CRC32C runs on SSE4.2's crc32 instruction
 * and CRC64NVME on PCLMULQDQ folding where the CPU has them (chosen at run
 * time: the build assumes no instruction set), CRC32 on zlib's crc32_z
 * (braided, about 4 GB/s here: 7 to 10 times MD5, so folding it too would
 * not change what a fetch costs); the portable CRCs are sliced by 8 (eight
 * tables, eight bytes a step). A body
 * is summed only when its store gave the sum, and with one sum only
 * (store.c). Speeds: bench/sums-speed, docs/benchmarks.md "Checksums". */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#include <wmmintrin.h>
#endif

#include "sums.h"

/* the tables of the CRCs sliced by 8 (make_table64()) */
static uint32_t crc32_table[8][256], crc32c_table[8][256];
static uint64_t crc64_table[8][256]; /* CRC64NVME's */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static bool have_sse42; /* the CPU has SSE4.2's crc32 instruction */
static bool have_pclmul; /* and PCLMULQDQ (a carry-less multiply) */

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* [0]: the byte-wise table of the reflected polynomial @poly; [k]: a
 * byte's CRC followed by k zero bytes. A 32-bit CRC's in a 64-bit register
 * stays in its low half. */
static void make_table64(uint64_t t[8][256], uint64_t poly)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint64_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ poly : c >> 1;
		t[0][i] = c;
	}
	for (int k = 1; k < 8; k++)
		for (uint32_t i = 0; i < 256; i++)
			t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
}

static void make_table(uint32_t t[8][256], uint32_t poly)
{
	uint64_t wide[8][256];

	make_table64(wide, poly);
	for (int k = 0; k < 8; k++)
		for (int i = 0; i < 256; i++)
			t[k][i] = (uint32_t)wide[k][i];
}

static uint64_t crc64_update(uint64_t c, const unsigned char *p, size_t len)
{
	uint64_t(*t)[256] = crc64_table;

	for (; len >= 8; p += 8, len -= 8) {
		c ^= le64(p);
		c = t[7][c & 0xFF] ^ t[6][(c >> 8) & 0xFF] ^ t[5][(c >> 16) & 0xFF] ^ t[4][(c >> 24) & 0xFF] ^
		    t[3][(c >> 32) & 0xFF] ^ t[2][(c >> 40) & 0xFF] ^ t[1][(c >> 48) & 0xFF] ^ t[0][c >> 56];
	}
	for (; len; p++, len--)
		c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
	return c;
}

#if defined(__x86_64__)
/* Three streams of the crc32 instruction at once (its latency is three
 * cycles, its throughput one a cycle): a run of 3 * LONG bytes is summed
 * as three runs of LONG, the first two then moved past the others' bytes
 * by the tables of "LONG zero bytes" (make_zeros()) and XORed in. Mark
 * Adler's crc32c.c does the same. */
#define HW_LONG 8192
#define HW_SHORT 256
static uint32_t zeros_long[4][256], zeros_short[4][256];

/* @c's register after @len zero bytes, by the byte-wise table */
static uint32_t zero_bytes(uint32_t c, size_t len)
{
	while (len--)
		c = crc32c_table[0][c & 0xFF] ^ (c >> 8);
	return c;
}

/* The tables of "@len zero bytes" for CRC32C: linear in the register, so
 * built from its 32 bits' images. */
static void make_zeros(uint32_t z[4][256], size_t len)
{
	uint32_t bit[32];

	for (int b = 0; b < 32; b++)
		bit[b] = zero_bytes(1u << b, len);
	for (int k = 0; k < 4; k++)
		for (uint32_t v = 0; v < 256; v++) {
			uint32_t c = 0;

			for (int b = 0; b < 8; b++)
				if (v >> b & 1)
					c ^= bit[8 * k + b];
			z[k][v] = c;
		}
}

static uint32_t shift(uint32_t z[4][256], uint32_t c)
{
	return z[0][c & 0xFF] ^ z[1][(c >> 8) & 0xFF] ^ z[2][(c >> 16) & 0xFF] ^ z[3][c >> 24];
}

/* @len bytes of @p at @stride apart, three streams, @stride bytes each */
__attribute__((target("sse4.2"))) static uint32_t hw_streams(uint32_t c, const unsigned char **pp, size_t *len,
							      size_t stride, uint32_t z[4][256])
{
	const unsigned char *p = *pp;

	while (*len >= 3 * stride) {
		uint64_t c0 = c, c1 = 0, c2 = 0;

		for (const unsigned char *end = p + stride; p < end; p += 8) {
			c0 = _mm_crc32_u64(c0, le64(p));
			c1 = _mm_crc32_u64(c1, le64(p + stride));
			c2 = _mm_crc32_u64(c2, le64(p + 2 * stride));
		}
		c = shift(z, (uint32_t)c0) ^ (uint32_t)c1;
		c = shift(z, c) ^ (uint32_t)c2;
		p += 2 * stride;
		*len -= 3 * stride;
	}
	*pp = p;
	return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const unsigned char *p, size_t len)
{
	/* byte by byte up to an 8-byte boundary */
	for (; len && ((uintptr_t)p & 7); p++, len--)
		c = _mm_crc32_u8(c, *p);
	c = hw_streams(c, &p, &len, HW_LONG, zeros_long);
	c = hw_streams(c, &p, &len, HW_SHORT, zeros_short);
	for (; len >= 8; p += 8, len -= 8)
		c = (uint32_t)_mm_crc32_u64(c, le64(p));
	for (; len; p++, len--)
		c = _mm_crc32_u8(c, *p);
	return c;
}

/* CRC64NVME by folding (Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ"): the message in 128-bit lanes, bit k of a
 * lane the coefficient of x^(127 - k) (a reflected CRC's order), each lane
 * X = H x^64 + L carried forward d bits as H (x^(d+64) mod P) + L (x^d mod
 * P), two carry-less multiplies. Four lanes at once, then one; the last
 * lane is 16 bytes of a message whose register the tables give. The
 * constants come from the polynomial at start (xpow()). */
#define FOLD_MIN 256
static __m128i fold_512, fold_128; /* {x^(d+63) mod P, x^(d-1) mod P}, d = 512, 128 */

/* x^n mod P, reflected (bit i: x^(63 - i)); a multiply's product comes
 * one bit low in the lane, hence d - 1 in the constants */
static uint64_t xpow(unsigned n)
{
	uint64_t r = (uint64_t)1 << 63;

	while (n--)
		r = r & 1 ? (r >> 1) ^ 0x9A6C9329AC4BC9B5u : r >> 1;
	return r;
}

static void make_folds(void)
{
	fold_512 = _mm_set_epi64x((long long)xpow(511), (long long)xpow(575));
	fold_128 = _mm_set_epi64x((long long)xpow(127), (long long)xpow(191));
}

__attribute__((target("pclmul"))) static __m128i fold(__m128i x, __m128i k, __m128i next)
{
	return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)),
			     next);
}

__attribute__((target("pclmul"))) static uint64_t crc64_hw(uint64_t c, const unsigned char *p, size_t len)
{
	__m128i x[4], one;
	unsigned char last[16];

	if (len < FOLD_MIN)
		return crc64_update(c, p, len);
	for (int i = 0; i < 4; i++)
		x[i] = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
	/* the register goes into the first 8 bytes, as the tables' step does */
	x[0] = _mm_xor_si128(x[0], _mm_set_epi64x(0, (long long)c));
	for (p += 64, len -= 64; len >= 64; p += 64, len -= 64)
		for (int i = 0; i < 4; i++)
			x[i] = fold(x[i], fold_512, _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)));
	one = fold(fold(fold(x[0], fold_128, x[1]), fold_128, x[2]), fold_128, x[3]);
	for (; len >= 16; p += 16, len -= 16)
		one = fold(one, fold_128, _mm_loadu_si128((const __m128i *)(const void *)p));
	_mm_storeu_si128((__m128i *)(void *)last, one);
	return crc64_update(crc64_update(0, last, 16), p, len);
}
#endif

static void make_tables(void)
{
	make_table(crc32_table, 0xEDB88320u);
	make_table(crc32c_table, 0x82F63B78u);
	/* NVM Express's CRC-64 (AWS's CRC64NVME), reflected */
	make_table64(crc64_table, 0x9A6C9329AC4BC9B5u);
#if defined(__x86_64__)
	have_sse42 = __builtin_cpu_supports("sse4.2");
	have_pclmul = __builtin_cpu_supports("pclmul");
	if (have_pclmul)
		make_folds();
	if (have_sse42) {
		make_zeros(zeros_long, HW_LONG);
		make_zeros(zeros_short, HW_SHORT);
	}
#endif
}

static uint32_t crc_update(uint32_t t[8][256], uint32_t c, const unsigned char *p, size_t len)
{
	for (; len >= 8; p += 8, len -= 8) {
		uint32_t lo = c ^ le32(p), hi = le32(p + 4);

		c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
		    t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
	}
	for (; len; p++, len--)
		c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
	return c;
}

uint64_t sum_crc_portable(enum sum_kind kind, uint64_t reg, const void *p, size_t len)
{
	pthread_once(&tables_once, make_tables);
	if (kind == SUM_CRC64NVME)
		return crc64_update(reg, p, len);
	return crc_update(kind == SUM_CRC32C ? crc32c_table : crc32_table, (uint32_t)reg, p, len);
}

uint64_t sum_crc(enum sum_kind kind, uint64_t reg, const void *p, size_t len)
{
	pthread_once(&tables_once, make_tables);
	if (kind == SUM_CRC32) {
		/* zlib's takes and gives the CRC, not the register; its length is a
		 * z_size_t */
		return ~(uint32_t)crc32_z(~(uint32_t)reg, p, len);
	}
#if defined(__x86_64__)
	if (kind == SUM_CRC64NVME && have_pclmul)
		return crc64_hw(reg, p, len);
	if (kind == SUM_CRC32C && have_sse42)
		return crc32c_hw((uint32_t)reg, p, len);
#endif
	return sum_crc_portable(kind, reg, p, len);
}

const char *sum_crc_impl(enum sum_kind kind)
{
	pthread_once(&tables_once, make_tables);
	if (kind == SUM_CRC32)
		return "zlib";
	if (kind == SUM_CRC64NVME)
		return have_pclmul ? "pclmul" : "table";
	return have_sse42 ? "sse4.2" : "table";
}

/* the sines' constants of RFC 1321 */
static const uint32_t sine[64] = {
	0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
	0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
	0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
	0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
	0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
	0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
	0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
	0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
};

static uint32_t rotl(uint32_t x, unsigned n)
{
	return (x << n) | (x >> (32 - n));
}

/* The 64 steps unrolled: constant indices and shifts, and the round
 * functions in their forms of fewer operations (F and G as a select, I with
 * one complement): 1.6 times the looped form's speed here. */
#define MD5_F(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define MD5_G(x, y, z) ((y) ^ ((z) & ((x) ^ (y))))
#define MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))
#define MD5_STEP(f, a, b, c, d, x, t, s) \
	do { \
		(a) += f((b), (c), (d)) + (x) + (t); \
		(a) = rotl((a), (s)) + (b); \
	} while (0)

static void md5_block(uint32_t h[8], const unsigned char *p)
{
	uint32_t w[16], a = h[0], b = h[1], c = h[2], d = h[3];

	for (int i = 0; i < 16; i++)
		w[i] = le32(p + 4 * i);
	MD5_STEP(MD5_F, a, b, c, d, w[0], sine[0], 7);
	MD5_STEP(MD5_F, d, a, b, c, w[1], sine[1], 12);
	MD5_STEP(MD5_F, c, d, a, b, w[2], sine[2], 17);
	MD5_STEP(MD5_F, b, c, d, a, w[3], sine[3], 22);
	MD5_STEP(MD5_F, a, b, c, d, w[4], sine[4], 7);
	MD5_STEP(MD5_F, d, a, b, c, w[5], sine[5], 12);
	MD5_STEP(MD5_F, c, d, a, b, w[6], sine[6], 17);
	MD5_STEP(MD5_F, b, c, d, a, w[7], sine[7], 22);
	MD5_STEP(MD5_F, a, b, c, d, w[8], sine[8], 7);
	MD5_STEP(MD5_F, d, a, b, c, w[9], sine[9], 12);
	MD5_STEP(MD5_F, c, d, a, b, w[10], sine[10], 17);
	MD5_STEP(MD5_F, b, c, d, a, w[11], sine[11], 22);
	MD5_STEP(MD5_F, a, b, c, d, w[12], sine[12], 7);
	MD5_STEP(MD5_F, d, a, b, c, w[13], sine[13], 12);
	MD5_STEP(MD5_F, c, d, a, b, w[14], sine[14], 17);
	MD5_STEP(MD5_F, b, c, d, a, w[15], sine[15], 22);
	MD5_STEP(MD5_G, a, b, c, d, w[1], sine[16], 5);
	MD5_STEP(MD5_G, d, a, b, c, w[6], sine[17], 9);
	MD5_STEP(MD5_G, c, d, a, b, w[11], sine[18], 14);
	MD5_STEP(MD5_G, b, c, d, a, w[0], sine[19], 20);
	MD5_STEP(MD5_G, a, b, c, d, w[5], sine[20], 5);
	MD5_STEP(MD5_G, d, a, b, c, w[10], sine[21], 9);
	MD5_STEP(MD5_G, c, d, a, b, w[15], sine[22], 14);
	MD5_STEP(MD5_G, b, c, d, a, w[4], sine[23], 20);
	MD5_STEP(MD5_G, a, b, c, d, w[9], sine[24], 5);
	MD5_STEP(MD5_G, d, a, b, c, w[14], sine[25], 9);
	MD5_STEP(MD5_G, c, d, a, b, w[3], sine[26], 14);
	MD5_STEP(MD5_G, b, c, d, a, w[8], sine[27], 20);
	MD5_STEP(MD5_G, a, b, c, d, w[13], sine[28], 5);
	MD5_STEP(MD5_G, d, a, b, c, w[2], sine[29], 9);
	MD5_STEP(MD5_G, c, d, a, b, w[7], sine[30], 14);
	MD5_STEP(MD5_G, b, c, d, a, w[12], sine[31], 20);
	MD5_STEP(MD5_H, a, b, c, d, w[5], sine[32], 4);
	MD5_STEP(MD5_H, d, a, b, c, w[8], sine[33], 11);
	MD5_STEP(MD5_H, c, d, a, b, w[11], sine[34], 16);
	MD5_STEP(MD5_H, b, c, d, a, w[14], sine[35], 23);
	MD5_STEP(MD5_H, a, b, c, d, w[1], sine[36], 4);
	MD5_STEP(MD5_H, d, a, b, c, w[4], sine[37], 11);
	MD5_STEP(MD5_H, c, d, a, b, w[7], sine[38], 16);
	MD5_STEP(MD5_H, b, c, d, a, w[10], sine[39], 23);
	MD5_STEP(MD5_H, a, b, c, d, w[13], sine[40], 4);
	MD5_STEP(MD5_H, d, a, b, c, w[0], sine[41], 11);
	MD5_STEP(MD5_H, c, d, a, b, w[3], sine[42], 16);
	MD5_STEP(MD5_H, b, c, d, a, w[6], sine[43], 23);
	MD5_STEP(MD5_H, a, b, c, d, w[9], sine[44], 4);
	MD5_STEP(MD5_H, d, a, b, c, w[12], sine[45], 11);
	MD5_STEP(MD5_H, c, d, a, b, w[15], sine[46], 16);
	MD5_STEP(MD5_H, b, c, d, a, w[2], sine[47], 23);
	MD5_STEP(MD5_I, a, b, c, d, w[0], sine[48], 6);
	MD5_STEP(MD5_I, d, a, b, c, w[7], sine[49], 10);
	MD5_STEP(MD5_I, c, d, a, b, w[14], sine[50], 15);
	MD5_STEP(MD5_I, b, c, d, a, w[5], sine[51], 21);
	MD5_STEP(MD5_I, a, b, c, d, w[12], sine[52], 6);
	MD5_STEP(MD5_I, d, a, b, c, w[3], sine[53], 10);
	MD5_STEP(MD5_I, c, d, a, b, w[10], sine[54], 15);
	MD5_STEP(MD5_I, b, c, d, a, w[1], sine[55], 21);
	MD5_STEP(MD5_I, a, b, c, d, w[8], sine[56], 6);
	MD5_STEP(MD5_I, d, a, b, c, w[15], sine[57], 10);
	MD5_STEP(MD5_I, c, d, a, b, w[6], sine[58], 15);
	MD5_STEP(MD5_I, b, c, d, a, w[13], sine[59], 21);
	MD5_STEP(MD5_I, a, b, c, d, w[4], sine[60], 6);
	MD5_STEP(MD5_I, d, a, b, c, w[11], sine[61], 10);
	MD5_STEP(MD5_I, c, d, a, b, w[2], sine[62], 15);
	MD5_STEP(MD5_I, b, c, d, a, w[9], sine[63], 21);
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
}

static const uint32_t k256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static void sha256_block(uint32_t h[8], const unsigned char *p)
{
	uint32_t w[64], v[8];

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
		       (uint32_t)p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(v, h, sizeof v);
	for (int i = 0; i < 64; i++) {
		uint32_t s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
		uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
		uint32_t t1 = v[7] + s1 + ch + k256[i] + w[i];
		uint32_t s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
		uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);

		memmove(v + 1, v, 7 * sizeof v[0]);
		v[4] += t1;
		v[0] = t1 + s0 + maj;
	}
	for (int i = 0; i < 8; i++)
		h[i] += v[i];
}

const char *sum_name(enum sum_kind kind)
{
	return kind == SUM_CRC32 ? "crc32" : kind == SUM_CRC32C ? "crc32c" : kind == SUM_CRC64NVME ? "crc64nvme" :
	       kind == SUM_SHA256 ? "sha256" : kind == SUM_MD5 ? "md5" : "none";
}

const char *sum_label(enum sum_kind kind)
{
	return kind == SUM_CRC32 ? "CRC32" : kind == SUM_CRC32C ? "CRC32C" : kind == SUM_CRC64NVME ? "CRC64NVME" :
	       kind == SUM_SHA256 ? "SHA-256" : kind == SUM_MD5 ? "MD5" : "none";
}

/* measured here (docs/benchmarks.md, "Checksums"): CRC32C with SSE4.2's
 * instruction, CRC64NVME folded with PCLMULQDQ, CRC32 (zlib), MD5,
 * SHA-256, from fastest */
static int sum_rank(enum sum_kind kind)
{
	static const enum sum_kind order[] = { SUM_CRC32C, SUM_CRC64NVME, SUM_CRC32, SUM_MD5, SUM_SHA256 };
	int i = 0;

	while (i < 5 && order[i] != kind)
		i++;
	return i;
}

bool sum_cheaper(enum sum_kind a, enum sum_kind b)
{
	return sum_rank(a) < sum_rank(b);
}

void sum_init(struct sum *s, enum sum_kind kind)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	static const uint32_t md5_h0[8] = { 0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476 };

	pthread_once(&tables_once, make_tables);
	s->kind = kind;
	s->crc = kind == SUM_CRC64NVME ? ~(uint64_t)0 : 0xFFFFFFFFu;
	s->len = 0;
	memcpy(s->h, kind == SUM_MD5 ? md5_h0 : h0, sizeof h0);
}

/* @len bytes into the 64-byte blocks of MD5 or SHA-256 */
static void blocks_update(struct sum *s, const unsigned char *p, size_t len)
{
	void (*block)(uint32_t h[8], const unsigned char *p) = s->kind == SUM_MD5 ? md5_block : sha256_block;
	size_t have = (size_t)(s->len % 64);

	s->len += len;
	if (have) {
		size_t take = 64 - have < len ? 64 - have : len;

		memcpy(s->buf + have, p, take);
		p += take;
		len -= take;
		if (have + take < 64)
			return;
		block(s->h, s->buf);
	}
	for (; len >= 64; p += 64, len -= 64)
		block(s->h, p);
	memcpy(s->buf, p, len);
}

void sum_update(struct sum *s, const void *data, size_t len)
{
	if (s->kind == SUM_MD5 || s->kind == SUM_SHA256) {
		blocks_update(s, data, len);
		return;
	}
	s->crc = sum_crc(s->kind, s->crc, data, len);
	s->len += len;
}

uint32_t sum_crc32_value(const struct sum *s)
{
	return ~(uint32_t)s->crc;
}

static void base64(const unsigned char *in, size_t n, char *out)
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i;

	for (i = 0; i + 2 < n; i += 3) {
		*out++ = tab[in[i] >> 2];
		*out++ = tab[(in[i] & 3) << 4 | in[i + 1] >> 4];
		*out++ = tab[(in[i + 1] & 15) << 2 | in[i + 2] >> 6];
		*out++ = tab[in[i + 2] & 63];
	}
	if (i < n) {
		*out++ = tab[in[i] >> 2];
		*out++ = tab[(in[i] & 3) << 4 | (i + 1 < n ? in[i + 1] >> 4 : 0)];
		*out++ = i + 1 < n ? tab[(in[i + 1] & 15) << 2] : '=';
		*out++ = '=';
	}
	*out = '\0';
}

/* The digest of @s into @d: its length. */
static size_t digest(struct sum *s, unsigned char d[32])
{
	size_t n;

	if (s->kind == SUM_MD5 || s->kind == SUM_SHA256) {
		unsigned char pad[72] = { 0x80 };
		uint64_t bits = s->len * 8;
		size_t have = (size_t)(s->len % 64), k = have < 56 ? 56 - have : 120 - have;
		bool md5 = s->kind == SUM_MD5;

		/* the length in bits: little-endian for MD5, big-endian for SHA-256 */
		for (int i = 0; i < 8; i++)
			pad[k + (size_t)i] = (unsigned char)(bits >> (md5 ? 8 * i : 56 - 8 * i));
		blocks_update(s, pad, k + 8);
		for (int i = 0; i < (md5 ? 16 : 32); i++)
			d[i] = (unsigned char)(s->h[i / 4] >> (md5 ? 8 * (i % 4) : 24 - 8 * (i % 4)));
		return md5 ? 16 : 32;
	}
	n = s->kind == SUM_CRC64NVME ? 8 : 4;
	for (size_t i = 0; i < n; i++)
		d[i] = (unsigned char)(~s->crc >> (8 * (n - 1 - i)));
	return n;
}

void sum_base64(struct sum *s, char *out)
{
	unsigned char d[32];

	base64(d, digest(s, d), out);
}

void sum_hex(struct sum *s, char *out)
{
	unsigned char d[32];
	size_t n = digest(s, d);

	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}
