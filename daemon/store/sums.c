/* SPDX-License-Identifier: MIT */
/* sums - MD5 (RFC 1321), CRC32, CRC32C and SHA-256 (FIPS 180-4) of a body
 * as it streams in (see sums.h). The CRCs are sliced by 8 (eight tables, eight bytes a
 * step: several times a byte-wise table's speed, no instruction set
 * assumed); a body is summed only when its store gave the sum. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sums.h"

/* [0]: the byte-wise table of the (reflected) polynomial; [k]: a byte's
 * CRC followed by k zero bytes */
static uint32_t crc32_table[8][256], crc32c_table[8][256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void make_table(uint32_t t[8][256], uint32_t poly)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ poly : c >> 1;
		t[0][i] = c;
	}
	for (int k = 1; k < 8; k++)
		for (uint32_t i = 0; i < 256; i++)
			t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
}

static void make_tables(void)
{
	make_table(crc32_table, 0xEDB88320u);
	make_table(crc32c_table, 0x82F63B78u);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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
	return kind == SUM_CRC32 ? "crc32" : kind == SUM_CRC32C ? "crc32c" : kind == SUM_SHA256 ? "sha256" :
	       kind == SUM_MD5 ? "md5" : "none";
}

const char *sum_label(enum sum_kind kind)
{
	return kind == SUM_CRC32 ? "CRC32" : kind == SUM_CRC32C ? "CRC32C" : kind == SUM_SHA256 ? "SHA-256" :
	       kind == SUM_MD5 ? "MD5" : "none";
}

void sum_init(struct sum *s, enum sum_kind kind)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	static const uint32_t md5_h0[8] = { 0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476 };

	pthread_once(&tables_once, make_tables);
	s->kind = kind;
	s->crc = 0xFFFFFFFFu;
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
	s->crc = crc_update(s->kind == SUM_CRC32C ? crc32c_table : crc32_table, s->crc, data, len);
	s->len += len;
}

uint32_t sum_crc(const struct sum *s)
{
	return ~s->crc;
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
	for (int i = 0; i < 4; i++)
		d[i] = (unsigned char)(~s->crc >> (24 - 8 * i));
	return 4;
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
