/* SPDX-License-Identifier: MIT */
/* resample - PIL's bilinear resampling, 8 bits per channel (resample.h)
 *
 * The kernels imageop.c's stages run per row: the coefficients, the
 * horizontal pass (portable C, SSE4.1, AVX-512 VBMI) and the vertical pass
 * (portable C built for x86-64-v3 too, AVX-512BW), each giving PIL's values
 * exactly (tests/unit/sources/test-image.c checks the kernels against the
 * portable ones).
 */
#include <math.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "resample.h"

bool resample_portable_only;

/*
 * The arithmetic is PIL's, exactly: per output value, 2^21 plus the sum of
 * pixel x coefficient (22-bit fixed point) in int32, shifted right by 22 and
 * clipped to 0..255. What differs is the arrangement, for speed:
 *
 * - every output position of a pass has the same number K of taps: PIL's
 *   coefficients, shifted to a window of K source positions that stays
 *   inside the image (xmin moved left where needed) and padded with zero
 *   coefficients, which add nothing to the sum;
 * - the horizontal pass works on a whole pixel at once (R, G, B and one
 *   ignored byte as four int32 lanes, SSE4.1 when the CPU has it, else
 *   portable C), so reads and writes 4 bytes per pixel: its output rows have
 *   RESAMPLE_SLACK bytes of slack, and the input image's last row is read
 *   through a copy, so that no read passes the end of the caller's buffer;
 * - the vertical pass works along the row (contiguous bytes), with K
 *   fixed at compile time for the usual sizes, built for x86-64-v3 (AVX2)
 *   too and chosen at load time; the sample's flip, dtype and layout
 *   conversion follow on the row while it is in L1.
 */

#define HALF (1 << (PRECISION_BITS - 1))

/*
 * Not under ASan or TSan: the clones' ifunc resolver runs while the dynamic
 * linker relocates, before the sanitizer's runtime is up, and the
 * instrumented resolver crashes there.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
	!defined(__SANITIZE_THREAD__)
#define KERNEL __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define KERNEL
#endif


static inline double bilinear(double x)
{
	if (x < 0.0)
		x = -x;
	return x < 1.0 ? 1.0 - x : 0.0;
}

int resample_ksize(double in0, double in1, int out_size)
{
	double scale = (in1 - in0) / out_size;
	double support = scale < 1.0 ? 1.0 : scale;

	return (int)ceil(support) * 2 + 1;
}

/*
 * PIL's precompute_coeffs() and normalize_coeffs_8bpc() for the target
 * positions [first, first + count). Each position gets *K taps from xs[c]
 * (xs[c] + *K <= in_size): PIL's nonzero coefficients, moved into that
 * window, the rest zero. *K is the widest run of nonzero coefficients (at
 * most @ksize). Positions outside [0, out_size) are padding: pad[c] set,
 * coefficients zero. @kk holds count x ksize values. Returns the number of
 * padding positions.
 */
int resample_coeffs(int in_size, double in0, double in1, int out_size, int first, int count,
		  int ksize, int *K, int32_t *xs, int32_t *kk, uint8_t *pad, int32_t *ns)
{
	double scale = (in1 - in0) / out_size;
	double filterscale = scale < 1.0 ? 1.0 : scale;
	double support = filterscale; /* bilinear: support 1 */
	double ss = 1.0 / filterscale;
	int npad = 0, kmax = 1;

	/* PIL's coefficients, ksize apart; xs[c] = first nonzero, ns = count */
	for (int c = 0; c < count; c++) {
		int xx = first + c, xmin, xmax, lo, hi;
		int32_t *k = kk + (size_t)c * ksize;
		double center, ww = 0.0;

		if (xx < 0 || xx >= out_size) {
			xs[c] = 0;
			ns[c] = 0;
			pad[c] = 1;
			npad++;
			continue;
		}
		pad[c] = 0;
		center = in0 + (xx + 0.5) * scale;
		xmin = (int)(center - support + 0.5);
		if (xmin < 0)
			xmin = 0;
		xmax = (int)(center + support + 0.5);
		if (xmax > in_size)
			xmax = in_size;
		xmax -= xmin;
		if (xmax > ksize)
			xmax = ksize;
		for (int x = 0; x < xmax; x++)
			ww += bilinear((x + xmin - center + 0.5) * ss);
		for (int x = 0; x < xmax; x++) {
			double w = bilinear((x + xmin - center + 0.5) * ss);
			double v = ww != 0.0 ? w / ww : w;

			k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
				     : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
		}
		lo = 0;
		hi = xmax;
		while (hi > 0 && k[hi - 1] == 0)
			hi--;
		while (lo < hi && k[lo] == 0)
			lo++;
		if (lo == hi)
			lo = hi = 0;
		if (lo > 0)
			memmove(k, k + lo, (size_t)(hi - lo) * sizeof(*k));
		xs[c] = xmin + lo;
		ns[c] = hi - lo;
		if (hi - lo > kmax)
			kmax = hi - lo;
	}
	/* to kmax taps each, in place (kmax <= ksize: rows only move down) */
	for (int c = 0; c < count; c++) {
		int32_t *from = kk + (size_t)c * ksize, *to = kk + (size_t)c * kmax;
		int n = ns[c], shift = 0;

		if (xs[c] + kmax > in_size)
			shift = xs[c] + kmax - in_size;
		memmove(to + shift, from, (size_t)n * sizeof(*to));
		for (int x = 0; x < shift; x++)
			to[x] = 0;
		for (int x = shift + n; x < kmax; x++)
			to[x] = 0;
		xs[c] -= shift;
	}
	*K = kmax;
	return npad;
}

/* Identity along an axis: one tap of weight 1 at the source position. */
int resample_coeffs_copy(int out_size, int first, int count, int32_t *xs, int32_t *kk, uint8_t *pad)
{
	int npad = 0;

	for (int c = 0; c < count; c++) {
		int t = first + c;

		pad[c] = t < 0 || t >= out_size;
		npad += pad[c];
		xs[c] = pad[c] ? 0 : t;
		kk[c] = pad[c] ? 0 : 1 << PRECISION_BITS;
	}
	return npad;
}

/* One row of the horizontal pass, portable: K taps from xs[c] per output pixel. */
void resample_hrow_c(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk,
		   int K)
{
	for (int c = 0; c < ow; c++) {
		const uint8_t *p = in + 3 * (size_t)xs[c];
		const int32_t *k = kk + (size_t)c * K;
		int32_t s0 = HALF, s1 = HALF, s2 = HALF;

		for (int j = 0; j < K; j++) {
			s0 += p[3 * j] * k[j];
			s1 += p[3 * j + 1] * k[j];
			s2 += p[3 * j + 2] * k[j];
		}
		s0 >>= PRECISION_BITS;
		s1 >>= PRECISION_BITS;
		s2 >>= PRECISION_BITS;
		out[3 * c] = (uint8_t)(s0 > 255 ? 255 : s0);
		out[3 * c + 1] = (uint8_t)(s1 > 255 ? 255 : s1);
		out[3 * c + 2] = (uint8_t)(s2 > 255 ? 255 : s2);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * SSE4.1: a pixel's R, G, B (and the next byte, ignored) as four int32
 * lanes; the coefficients are stored four times over (kk4). The sum is
 * >= 2^21 > 0, so the saturating packs clip exactly as PIL's clip8().
 */
__attribute__((target("sse4.1"))) static inline void
hrow_sse41_k(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk4,
	     const int K)
{
	const __m128i half = _mm_set1_epi32(HALF);

	for (int c = 0; c < ow; c++) {
		const uint8_t *p = in + 3 * (size_t)xs[c];
		const __m128i *k = (const __m128i *)(kk4 + (size_t)c * K * 4);
		__m128i acc = half;
		int32_t v;

		for (int j = 0; j < K; j++) {
			memcpy(&v, p + 3 * j, 4);
			acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)),
								 _mm_load_si128(k + j)));
		}
		acc = _mm_srai_epi32(acc, PRECISION_BITS);
		acc = _mm_packus_epi16(_mm_packus_epi32(acc, acc), acc);
		v = _mm_cvtsi128_si32(acc);
		memcpy(out + 3 * c, &v, 4);
	}
}

__attribute__((target("sse4.1"))) void
resample_hrow_sse41(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk4, int K)
{
	switch (K) {
	case 1: hrow_sse41_k(in, out, ow, xs, kk4, 1); break;
	case 2: hrow_sse41_k(in, out, ow, xs, kk4, 2); break;
	case 3: hrow_sse41_k(in, out, ow, xs, kk4, 3); break;
	case 4: hrow_sse41_k(in, out, ow, xs, kk4, 4); break;
	default: hrow_sse41_k(in, out, ow, xs, kk4, K); break;
	}
}

bool resample_have_sse41(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("sse4.1") && !resample_portable_only;
}
#else
bool resample_have_sse41(void)
{
	return false;
}

void resample_hrow_sse41(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs,
		       const int32_t *kk4, int K)
{
	(void)in, (void)out, (void)ow, (void)xs, (void)kk4, (void)K;
}
#endif

/*
 * AVX-512 VBMI: 16 output pixels at a time, when their taps lie within 64
 * bytes of the row (an enlargement, or a slight reduction, with K <= 4).
 * One masked 64-byte load; per pair of taps, a byte permutation (vpermb)
 * puts each (pixel, channel)'s two source values into the 16-bit halves of
 * a 32-bit lane, and two vpmaddwd multiply them by the coefficients' high
 * and low 11 bits: sum = (high << 11) + low, the same int32 as PIL's
 * (integer sums: the order does not matter). 48 lanes (16 pixels x RGB) in
 * three registers, then PIL's shift, and vpmovusdb clips to 0..255 as
 * clip8() (the sum is never negative).
 */

bool resample_have_vbmi(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512vbmi") && !resample_portable_only;
#else
	return false;
#endif
}

/* The groups of 16 output pixels of a horizontal pass; returns how many are not eligible. */
int resample_hgroups_init(struct hgroup *g, int ow, const int32_t *xs, const int32_t *kx, int K)
{
	int ng = (ow + 15) / 16, pairs = (K + 1) / 2, rest = 0;

	for (int gi = 0; gi < ng; gi++, g++) {
		int c0 = gi * 16, n = ow - c0 < 16 ? ow - c0 : 16, lo = xs[c0], hi = xs[c0];

		for (int j = 1; j < n; j++) {
			lo = xs[c0 + j] < lo ? xs[c0 + j] : lo;
			hi = xs[c0 + j] > hi ? xs[c0 + j] : hi;
		}
		g->base = -1;
		if (pairs > HV_PAIRS_MAX || 3 * (hi + K - lo) > 64) {
			rest++;
			continue;
		}
		g->base = lo;
		for (int p = 0; p < pairs; p++) {
			uint8_t *idx = &g->idx[p][0][0];
			int16_t *kh = &g->hi[p][0][0], *kl = &g->lo[p][0][0];
			int t0 = 2 * p, t1 = 2 * p + 1;

			/* lane l = 3 j + ch: bytes 4 l, 4 l + 2 and words 2 l, 2 l + 1 of the three registers */
			for (int j = 0; j < 16; j++) {
				int32_t k0 = 0, k1 = 0;
				int b0 = 0, b1 = 0;

				if (j < n) {
					const int32_t *kk = kx + (size_t)(c0 + j) * K;
					int x = xs[c0 + j] - lo;

					k0 = kk[t0];
					b0 = b1 = 3 * (x + t0);
					if (t1 < K) {
						k1 = kk[t1];
						b1 = 3 * (x + t1);
					}
				}
				for (int ch = 0, l = 3 * j; ch < 3; ch++, l++) {
					idx[4 * l] = (uint8_t)(b0 + ch);
					idx[4 * l + 1] = 0;
					idx[4 * l + 2] = (uint8_t)(b1 + ch);
					idx[4 * l + 3] = 0;
					/* k = hi * 2^11 + lo, lo in 0..2047 */
					kh[2 * l] = (int16_t)(k0 >> 11);
					kh[2 * l + 1] = (int16_t)(k1 >> 11);
					kl[2 * l] = (int16_t)(k0 & 2047);
					kl[2 * l + 1] = (int16_t)(k1 & 2047);
				}
			}
		}
	}
	return rest;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* One group's three registers (48 bytes: 16 pixels), @pairs of taps. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static inline
__attribute__((always_inline)) void hgroup_run(__m512i data, const struct hgroup *g, uint8_t *out,
					       const int pairs)
{
	for (int q = 0; q < 3; q++) {
		__m512i h = _mm512_setzero_si512(), l = _mm512_set1_epi32(HALF);

		for (int p = 0; p < pairs; p++) {
			__m512i v = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull,
								  _mm512_load_si512(g->idx[p][q]), data);

			h = _mm512_add_epi32(h, _mm512_madd_epi16(v, _mm512_load_si512(g->hi[p][q])));
			l = _mm512_add_epi32(l, _mm512_madd_epi16(v, _mm512_load_si512(g->lo[p][q])));
		}
		h = _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 11), l), PRECISION_BITS);
		_mm_storeu_si128((__m128i *)(out + 16 * q), _mm512_cvtusepi32_epi8(h));
	}
}

/*
 * The row's output has RESAMPLE_SLACK bytes of slack: a last, partial
 * group is stored whole too (its extra bytes are never read).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) void
resample_hrow_vbmi(const uint8_t *in, size_t in_bytes, uint8_t *out, int ow, const int32_t *xs,
	  const int32_t *kx4, int K, const struct hgroup *g)
{
	for (int c0 = 0; c0 < ow; c0 += 16, g++) {
		size_t at, left;
		__m512i data;

		if (g->base < 0) {
			resample_hrow_sse41(in, out + 3 * (size_t)c0, ow - c0 < 16 ? ow - c0 : 16, xs + c0,
				   kx4 + (size_t)c0 * K * 4, K);
			continue;
		}
		at = 3 * (size_t)g->base;
		left = in_bytes - at;
		data = _mm512_maskz_loadu_epi8(left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1,
					       in + at);
		if (K <= 2)
			hgroup_run(data, g, out + 3 * (size_t)c0, 1);
		else
			hgroup_run(data, g, out + 3 * (size_t)c0, 2);
	}
}
#else
void resample_hrow_vbmi(const uint8_t *in, size_t in_bytes, uint8_t *out, int ow, const int32_t *xs,
		      const int32_t *kx4, int K, const struct hgroup *g)
{
	(void)in, (void)in_bytes, (void)out, (void)ow, (void)xs, (void)kx4, (void)K, (void)g;
}
#endif

static inline __attribute__((always_inline)) void vrow_k(const uint8_t *in, size_t stride,
							 const int32_t *k, uint8_t *row,
							 size_t len, const int K)
{
	for (size_t e = 0; e < len; e++) {
		int32_t s = HALF;

		for (int j = 0; j < K; j++)
			s += in[(size_t)j * stride + e] * k[j];
		s >>= PRECISION_BITS;
		row[e] = (uint8_t)(s > 255 ? 255 : s);
	}
}

/* One row of the vertical pass: K input rows from @in, @stride apart. */
KERNEL void resample_vrow(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row,
			size_t len, int K, int32_t *acc)
{
	switch (K) {
	case 1: vrow_k(in, stride, k, row, len, 1); return;
	case 2: vrow_k(in, stride, k, row, len, 2); return;
	case 3: vrow_k(in, stride, k, row, len, 3); return;
	case 4: vrow_k(in, stride, k, row, len, 4); return;
	case 5: vrow_k(in, stride, k, row, len, 5); return;
	}
	for (size_t e = 0; e < len; e++)
		acc[e] = HALF;
	for (int j = 0; j < K; j++) {
		const uint8_t *r = in + (size_t)j * stride;
		int32_t w = k[j];

		for (size_t e = 0; e < len; e++)
			acc[e] += r[e] * w;
	}
	for (size_t e = 0; e < len; e++) {
		int32_t s = acc[e] >> PRECISION_BITS;

		row[e] = (uint8_t)(s > 255 ? 255 : s);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * The vertical pass with AVX-512BW: 32 bytes of the row at a time, the K
 * input rows in pairs, each byte pair in the 16-bit halves of a 32-bit lane
 * and vpmaddwd with the coefficients' high and low 11 bits, as resample_hrow_vbmi().
 */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __attribute__((always_inline)) void
vrow_avx512_k(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row, size_t len,
	      const int K)
{
	enum { PMAX = 8 };
	__m512i kh[PMAX], kl[PMAX];
	const int pairs = (K + 1) / 2;

	for (int p = 0; p < pairs; p++) {
		int32_t k0 = k[2 * p], k1 = 2 * p + 1 < K ? k[2 * p + 1] : 0;

		kh[p] = _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)(k1 >> 11) << 16 |
						    (uint16_t)(k0 >> 11)));
		kl[p] = _mm512_set1_epi32((int32_t)((uint32_t)(k1 & 2047) << 16 | (uint32_t)(k0 & 2047)));
	}
	for (size_t e = 0; e < len; e += 32) {
		__mmask32 m = len - e >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (len - e)) - 1;
		__m512i h0 = _mm512_setzero_si512(), h1 = h0;
		__m512i l0 = _mm512_set1_epi32(HALF), l1 = l0;
		__m256i out;

		for (int p = 0; p < pairs; p++) {
			const uint8_t *r0 = in + (size_t)(2 * p) * stride + e;
			const uint8_t *r1 = 2 * p + 1 < K ? r0 + stride : r0;
			__m512i a = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, r0));
			__m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, r1));
			__m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);

			h0 = _mm512_add_epi32(h0, _mm512_madd_epi16(lo, kh[p]));
			l0 = _mm512_add_epi32(l0, _mm512_madd_epi16(lo, kl[p]));
			h1 = _mm512_add_epi32(h1, _mm512_madd_epi16(hi, kh[p]));
			l1 = _mm512_add_epi32(l1, _mm512_madd_epi16(hi, kl[p]));
		}
		h0 = _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(h0, 11), l0), PRECISION_BITS);
		h1 = _mm512_srai_epi32(_mm512_add_epi32(_mm512_slli_epi32(h1, 11), l1), PRECISION_BITS);
		/* to a register first: vpmovuswb to memory is slow on some CPUs */
		out = _mm512_cvtusepi16_epi8(_mm512_packus_epi32(h0, h1));
		if (len - e >= 32)
			_mm256_storeu_si256((__m256i *)(row + e), out);
		else
			_mm256_mask_storeu_epi8(row + e, m, out);
	}
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void
resample_vrow_avx512(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row, size_t len, int K)
{
	switch (K) {
	case 1: vrow_avx512_k(in, stride, k, row, len, 1); return;
	case 2: vrow_avx512_k(in, stride, k, row, len, 2); return;
	case 3: vrow_avx512_k(in, stride, k, row, len, 3); return;
	case 4: vrow_avx512_k(in, stride, k, row, len, 4); return;
	default: vrow_avx512_k(in, stride, k, row, len, K); return;
	}
}

bool resample_have_avx512bw(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && !resample_portable_only;
}
#else
void resample_vrow_avx512(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row,
			size_t len, int K)
{
	(void)in, (void)stride, (void)k, (void)row, (void)len, (void)K;
}

bool resample_have_avx512bw(void)
{
	return false;
}
#endif
