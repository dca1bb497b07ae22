/* SPDX-License-Identifier: MIT */
/* imageop - torchvision-equivalent image transforms, written into the batch slot */

/*
 * torchvision's ImageFolder pipeline works on PIL images: crop, resize with
 * PIL's bilinear filter (which widens its support when it downscales: that is
 * its antialiasing), flip, then ToTensor (x / 255 in float32) and Normalize
 * ((x - mean) / std in float32). This module reproduces that bit for bit when
 * DCT scaling is off:
 *
 * - resampling is PIL's ImagingResample for 8-bit images: separable, the
 *   horizontal pass first over the rows the vertical pass needs, each rounded
 *   to 8 bits, with PIL's coefficients (precompute_coeffs) in 22-bit fixed
 *   point (normalize_coeffs_8bpc);
 * - a crop followed by a resize is one pass whose filter is clipped at the
 *   crop's edges, as resizing the cropped image is; a resize followed by a
 *   crop computes only the kept pixels of the resized image; so the common
 *   pipelines take a single pass and never materialize an intermediate image.
 *   A resize after a resize needs the first one's pixels: a new stage;
 * - float outputs go through a 256-entry table per channel computed with the
 *   same float32 operations as torchvision, so they are exact too; float32
 *   NCHW goes through SIMD kernels instead where they give the table's values
 *   (checked at init for all 256 values of each channel).
 *
 * A flip is applied while writing a row; with a flip before a resize the
 * result can differ from torchvision's by a rounding step, as PIL's filter
 * positions are not exactly mirror-symmetric.
 */
#include <errno.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "imageop.h"

#define PRECISION_BITS (32 - 8 - 2)
#define RESAMPLE_SLACK 16          /* bytes past a row that the kernels may touch */

/* ---- random draws ---- */


uint64_t imageop_key(uint64_t seed, uint64_t epoch, uint64_t idx)
{
	return splitmix64(splitmix64(splitmix64(seed ^ 0x696d616765ull) ^ epoch) ^ idx);
}

double imageop_uniform(uint64_t key, uint64_t n)
{
	return (double)(splitmix64(key + n) >> 11) * 0x1.0p-53;
}

/* An integer in [lo, hi), as torch.randint(lo, hi). */
static int randint(uint64_t key, uint64_t *draw, int lo, int hi)
{
	int v = lo + (int)floor(imageop_uniform(key, (*draw)++) * (double)(hi - lo));

	return v < hi ? v : hi - 1;
}

/* Python's round(): half to even (the default rounding mode). */
static int round_even(double x)
{
	return (int)nearbyint(x);
}

void imageop_rrc_params(const struct transform *t, int w, int h, uint64_t key, uint64_t *draw,
			int *top, int *left, int *ch, int *cw)
{
	double area = (double)h * (double)w;
	double lr0 = log(t->ratio[0]), lr1 = log(t->ratio[1]);
	double in_ratio;

	for (int attempt = 0; attempt < 10; attempt++) {
		double s = t->scale[0] + (t->scale[1] - t->scale[0]) * imageop_uniform(key, (*draw)++);
		double target = area * s;
		double ar = exp(lr0 + (lr1 - lr0) * imageop_uniform(key, (*draw)++));
		int cww = round_even(sqrt(target * ar));
		int chh = round_even(sqrt(target / ar));

		if (cww > 0 && cww <= w && chh > 0 && chh <= h) {
			*top = randint(key, draw, 0, h - chh + 1);
			*left = randint(key, draw, 0, w - cww + 1);
			*ch = chh;
			*cw = cww;
			return;
		}
	}
	/* fallback: a central crop of the ratio nearest the image's */
	in_ratio = (double)w / (double)h;
	if (in_ratio < t->ratio[0]) {
		*cw = w;
		*ch = round_even(*cw / t->ratio[0]);
	} else if (in_ratio > t->ratio[1]) {
		*ch = h;
		*cw = round_even(*ch * t->ratio[1]);
	} else {
		*cw = w;
		*ch = h;
	}
	if (*ch < 1)
		*ch = 1;
	if (*cw < 1)
		*cw = 1;
	*top = (h - *ch) / 2;
	*left = (w - *cw) / 2;
}

/* ---- output conversion ---- */

uint16_t imageop_f32_to_f16(float fl)
{
	/* round to nearest even (F. Giesen's float_to_half_fast3_rtne) */
	union { uint32_t u; float f; } f = { .f = fl }, infty = { .u = 255u << 23 },
		max = { .u = (127u + 16u) << 23 }, magic = { .u = ((127u - 15u) + (23u - 10u) + 1u) << 23 };
	uint32_t sign = f.u & 0x80000000u;
	uint16_t o;

	f.u ^= sign;
	if (f.u >= max.u) {
		o = f.u > infty.u ? 0x7e00 : 0x7c00;
	} else if (f.u < (113u << 23)) {
		f.f += magic.f;
		o = (uint16_t)(f.u - magic.u);
	} else {
		uint32_t odd = (f.u >> 13) & 1;

		f.u += ((uint32_t)(15 - 127) << 23) + 0xfff;
		f.u += odd;
		o = (uint16_t)(f.u >> 13);
	}
	return (uint16_t)(o | (sign >> 16));
}

uint16_t imageop_f32_to_bf16(float fl)
{
	uint32_t u;

	memcpy(&u, &fl, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/*
 * float32 NCHW rows without the tables. The table's value of v is
 * ((float)v / 255 - mean) / std in float32; the kernels compute the same
 * two correctly rounded divisions as a product and one FMA correction step
 * each (q = a * (1/b), q += (a - q * b) * (1/b)), which is exact for most but
 * not all divisors. So imageop_init() runs them over all 256 values of each
 * channel and uses them only when they reproduce the table bit for bit.
 *
 * AVX2: 8 pixels at a time, de-interleaved with byte shuffles (mirrored for
 * a flip). AVX-512 VBMI, when the planes are 64-byte aligned (a slot's rows
 * are): 16 pixels at a time, one byte permutation per channel straight into
 * 32-bit lanes, stored as whole 64-byte lines of non-temporal stores. The
 * slot is read by the clients, never by this thread again, so fetching its
 * lines into the cache first (read for ownership) is wasted; 32-byte
 * non-temporal stores (half lines) overlapped less with the arithmetic than
 * plain stores did.
 */
static bool portable_only;

#if defined(__x86_64__) && defined(__GNUC__)
static bool have_avx2_fma(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !portable_only;
}

static bool have_avx512(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vbmi") && !portable_only;
}

/* Channel c of 8 pixels (bytes 0..15 and 8..23), of 16 (into 32-bit lanes): plain, mirrored. */
static uint8_t f32_shuf[2][3][2][16];
static uint8_t f32_perm[2][3][64];
static pthread_once_t f32_shuf_once = PTHREAD_ONCE_INIT;

static void f32_shuf_init(void)
{
	for (int flip = 0; flip < 2; flip++)
		for (int c = 0; c < 3; c++)
			for (int j = 0; j < 16; j++) {
				int b = c + 3 * (flip ? 7 - j : j);

				f32_shuf[flip][c][0][j] = j < 8 && b < 16 ? (uint8_t)b : 0x80;
				f32_shuf[flip][c][1][j] = j < 8 && b >= 16 ? (uint8_t)(b - 8) : 0x80;
				f32_perm[flip][c][4 * j] = (uint8_t)(c + 3 * (flip ? 15 - j : j));
			}
}

/* 8 pixels' channel c, converted: the table's values. */
__attribute__((target("avx2,fma"))) static inline __m256
f32_block(__m128i lo, __m128i hi, __m128i sh0, __m128i sh1, const __m256 k[4])
{
	__m128i b = _mm_or_si128(_mm_shuffle_epi8(lo, sh0), _mm_shuffle_epi8(hi, sh1));
	__m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
	__m256 q = _mm256_mul_ps(v, k[0]);

	q = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, _mm256_set1_ps(255.0f), v), k[0], q);
	v = _mm256_sub_ps(q, k[1]);
	q = _mm256_mul_ps(v, k[3]);
	return _mm256_fmadd_ps(_mm256_fnmadd_ps(q, k[2], v), k[3], q);
}

/* One channel at a time: the constants stay in registers. */
__attribute__((target("avx2,fma"))) static void
f32_planes_avx2(const struct imageop *op, const uint8_t *row, int w, bool flip, float *const d[3])
{
	for (int c = 0; c < 3; c++) {
		const __m128i sh0 = _mm_loadu_si128((const __m128i *)f32_shuf[flip][c][0]);
		const __m128i sh1 = _mm_loadu_si128((const __m128i *)f32_shuf[flip][c][1]);
		const __m256 k[4] = { _mm256_set1_ps(op->f32k[c][0]), _mm256_set1_ps(op->f32k[c][1]),
				      _mm256_set1_ps(op->f32k[c][2]), _mm256_set1_ps(op->f32k[c][3]) };
		float *dc = d[c];
		int x = 0;

		for (; x + 8 <= w; x += 8) {
			const uint8_t *p = row + 3 * (size_t)(flip ? w - 8 - x : x);

			_mm256_storeu_ps(dc + x, f32_block(_mm_loadu_si128((const __m128i *)p),
							   _mm_loadu_si128((const __m128i *)(p + 8)),
							   sh0, sh1, k));
		}
		for (; x < w; x++)
			dc[x] = op->lut[c][row[3 * (size_t)(flip ? w - 1 - x : x) + c]];
	}
}

__attribute__((target("avx512f,avx512bw,avx512vbmi,avx2,fma"))) static void
f32_planes_vbmi(const struct imageop *op, const uint8_t *row, int w, bool flip, float *const d[3])
{
	for (int c = 0; c < 3; c++) {
		const __m512i perm = _mm512_loadu_si512(f32_perm[flip][c]);
		const __m512 k0 = _mm512_set1_ps(op->f32k[c][0]), k1 = _mm512_set1_ps(op->f32k[c][1]);
		const __m512 k2 = _mm512_set1_ps(op->f32k[c][2]), k3 = _mm512_set1_ps(op->f32k[c][3]);
		const __m512 c255 = _mm512_set1_ps(255.0f);
		float *dc = d[c];
		int x = 0;

		for (; x + 16 <= w; x += 16) {
			const uint8_t *p = row + 3 * (size_t)(flip ? w - 16 - x : x);
			__m512i b = _mm512_maskz_loadu_epi8(0xffffffffffffull, p); /* 48 bytes */
			__m512 v = _mm512_cvtepi32_ps(
				_mm512_maskz_permutexvar_epi8(0x1111111111111111ull, perm, b));
			__m512 q = _mm512_mul_ps(v, k0);

			q = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, c255, v), k0, q);
			v = _mm512_sub_ps(q, k1);
			q = _mm512_mul_ps(v, k3);
			_mm512_stream_ps(dc + x, _mm512_fmadd_ps(_mm512_fnmadd_ps(q, k2, v), k3, q));
		}
		for (; x < w; x++)
			dc[x] = op->lut[c][row[3 * (size_t)(flip ? w - 1 - x : x) + c]];
	}
}

/* One output row of float32 planes; imageop_run_region() fences the non-temporal stores. */
static void f32_planes(const struct imageop *op, const uint8_t *row, int w, bool flip,
		       float *const d[3])
{
	if (have_avx512() && (((uintptr_t)d[0] | (uintptr_t)d[1] | (uintptr_t)d[2]) & 63) == 0)
		f32_planes_vbmi(op, row, w, flip, d);
	else
		f32_planes_avx2(op, row, w, flip, d);
}

/* Whether the kernels give op->lut's values (all 256 of each channel). */
static bool f32_simd_check(const struct imageop *op)
{
	_Alignas(64) float out[3][256];
	float *d[3] = { out[0], out[1], out[2] };
	uint8_t row[256 * 3 + 64];

	if (!have_avx2_fma())
		return false;
	pthread_once(&f32_shuf_once, f32_shuf_init);
	for (int v = 0; v < 256; v++)
		row[3 * v] = row[3 * v + 1] = row[3 * v + 2] = (uint8_t)v;
	for (int i = 0; i < 4; i++) {
		bool flip = i & 1;

		memset(out, 0, sizeof(out));
		if (i < 2)
			f32_planes_avx2(op, row, 256, flip, d);
		else if (have_avx512())
			f32_planes_vbmi(op, row, 256, flip, d);
		else
			break;
		_mm_sfence();
		for (int c = 0; c < 3; c++)
			for (int v = 0; v < 256; v++)
				if (memcmp(&out[c][flip ? 255 - v : v], &op->lut[c][v], sizeof(float)))
					return false;
	}
	return true;
}
#else
static bool have_avx2_fma(void)
{
	return false;
}

static void f32_planes(const struct imageop *op, const uint8_t *row, int w, bool flip,
		       float *const d[3])
{
	(void)op, (void)row, (void)w, (void)flip, (void)d;
}

static bool f32_simd_check(const struct imageop *op)
{
	(void)op;
	return false;
}
#endif

void imageop_init(struct imageop *op, const struct spec *spec)
{
	float mean[3] = { 0, 0, 0 }, std[3] = { 1, 1, 1 };
	bool normalize = false;

	memset(op, 0, sizeof(*op));
	op->n = spec->ntransforms;
	memcpy(op->t, spec->transforms, sizeof(op->t));
	op->dtype = spec->image_dtype;
	op->nhwc = spec->image_nhwc;
	op->out_h = spec->image_h;
	op->out_w = spec->image_w;
	op->dct_scaling = spec->dct_scaling;
	for (size_t i = 0; i < op->n; i++) {
		if (op->t[i].op != TRANSFORM_NORMALIZE)
			continue;
		normalize = true;
		for (int c = 0; c < 3; c++) {
			mean[c] = (float)op->t[i].mean[c];
			std[c] = (float)op->t[i].std[c];
		}
	}
	for (int c = 0; c < 3; c++) {
		for (int v = 0; v < 256; v++) {
			/* torchvision: img.float().div(255), then .sub_(mean).div_(std) */
			volatile float x = (float)v / 255.0f;

			if (normalize)
				x = (x - mean[c]) / std[c];
			op->lut[c][v] = x;
			op->lut16[c][v] = op->dtype == LDR_DTYPE_BFLOAT16 ? imageop_f32_to_bf16(x)
									 : imageop_f32_to_f16(x);
		}
		op->f32k[c][0] = 1.0f / 255.0f;
		op->f32k[c][1] = mean[c];
		op->f32k[c][2] = std[c];
		op->f32k[c][3] = 1.0f / std[c];
	}
	op->f32_simd = op->dtype == LDR_DTYPE_FLOAT32 && !op->nhwc && f32_simd_check(op);
}

/* ---- planning ---- */

void transform_resize_dims(const struct transform *t, uint32_t h, uint32_t w, uint64_t *oh,
			   uint64_t *ow)
{
	uint64_t shorter, longer, nlong;

	if (t->size[1]) {
		*oh = t->size[0];
		*ow = t->size[1];
		return;
	}
	/* torchvision: new_long = int(size * long / short), in double */
	shorter = w <= h ? w : h;
	longer = w <= h ? h : w;
	nlong = (uint64_t)((double)((uint64_t)t->size[0] * longer) / (double)shorter);
	if (w <= h) {
		*ow = t->size[0];
		*oh = nlong;
	} else {
		*oh = t->size[0];
		*ow = nlong;
	}
}

static void stage_reset(struct imageop_stage *st, int w, int h)
{
	memset(st, 0, sizeof(*st));
	st->in_w = st->ww = st->tw = st->ow = w;
	st->in_h = st->wh = st->th = st->oh = h;
}

/* Crop rows [top, top+h) and columns [left, left+w) of the current image. */
static void plan_crop(struct imageop_stage *st, int top, int left, int h, int w)
{
	if (st->flip)
		left = st->ow - left - w;
	if (!st->resized) {
		if (top >= 0 && left >= 0 && top + h <= st->wh && left + w <= st->ww) {
			st->wx += left;
			st->wy += top;
			st->ww = st->tw = st->ow = w;
			st->wh = st->th = st->oh = h;
			return;
		}
		st->resized = true; /* padding: an identity "resize" with a wider region */
	}
	st->ox += left;
	st->oy += top;
	st->ow = w;
	st->oh = h;
}

/* torchvision's center_crop offset, padding (negative) included. */
static int center_offset(int have, int want)
{
	int d;

	if (want > have)
		return -((want - have) / 2);
	d = have - want;
	if (d % 2 == 0)
		return d / 2;
	return (d / 2) % 2 == 0 ? d / 2 : d / 2 + 1; /* round(k + 0.5) to even */
}

int imageop_plan(const struct imageop *op, int w, int h, uint64_t key, struct imageop_plan *plan,
		 char *err, size_t errlen)
{
	struct imageop_stage *st = &plan->st[0];
	uint64_t draw = 0;

	plan->n = 1;
	stage_reset(st, w, h);
	for (size_t i = 0; i < op->n; i++) {
		const struct transform *t = &op->t[i];
		int top, left, ch, cw;
		uint64_t nh, nw;

		switch (t->op) {
		case TRANSFORM_RANDOM_RESIZED_CROP:
			imageop_rrc_params(t, st->ow, st->oh, key, &draw, &top, &left, &ch, &cw);
			plan_crop(st, top, left, ch, cw);
			nh = t->size[0];
			nw = t->size[1];
			goto resize;
		case TRANSFORM_CENTER_CROP:
			ch = (int)t->size[0];
			cw = (int)t->size[1];
			plan_crop(st, center_offset(st->oh, ch), center_offset(st->ow, cw), ch, cw);
			break;
		case TRANSFORM_RESIZE:
			transform_resize_dims(t, (uint32_t)st->oh, (uint32_t)st->ow, &nh, &nw);
			if (nh < 1 || nw < 1 || nh * nw > IMAGE_MAX_PIXELS)
				return errfmt(-EINVAL, err, errlen,
					    "transforms[%zu]: resizing %dx%d gives %llux%llu", i,
					    st->ow, st->oh, (unsigned long long)nw,
					    (unsigned long long)nh);
resize:
			if ((int)nh == st->oh && (int)nw == st->ow)
				break; /* PIL returns a copy */
			if (st->resized) {
				/* a resize of resized pixels: materialize them first */
				int pw = st->ow, ph = st->oh;

				if ((uint64_t)pw * (uint64_t)ph > IMAGE_MAX_PIXELS)
					return errfmt(-EINVAL, err, errlen,
						    "transforms[%zu]: intermediate image too large", i);
				st = &plan->st[plan->n++];
				stage_reset(st, pw, ph);
			}
			st->resized = true;
			st->tw = st->ow = (int)nw;
			st->th = st->oh = (int)nh;
			st->ox = st->oy = 0;
			break;
		case TRANSFORM_HORIZONTAL_FLIP:
			if (imageop_uniform(key, draw++) < t->p)
				st->flip = !st->flip;
			break;
		case TRANSFORM_NORMALIZE:
			break;
		}
	}
	if (st->oh != (int)op->out_h || st->ow != (int)op->out_w)
		return errfmt(-EINVAL, err, errlen, "transforms give %dx%d, not the pipeline's %ux%u",
			    st->ow, st->oh, op->out_w, op->out_h);
	return 0;
}

/* ---- resampling (PIL's, 8 bits per channel) ---- */

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

static int ksize_of(double in0, double in1, int out_size)
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
static int coeffs(int in_size, double in0, double in1, int out_size, int first, int count,
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
static int coeffs_copy(int out_size, int first, int count, int32_t *xs, int32_t *kk, uint8_t *pad)
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
static void hrow_c(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk,
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

void imageop_portable_only(bool on)
{
	portable_only = on;
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

__attribute__((target("sse4.1"))) static void
hrow_sse41(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk4, int K)
{
	switch (K) {
	case 1: hrow_sse41_k(in, out, ow, xs, kk4, 1); break;
	case 2: hrow_sse41_k(in, out, ow, xs, kk4, 2); break;
	case 3: hrow_sse41_k(in, out, ow, xs, kk4, 3); break;
	case 4: hrow_sse41_k(in, out, ow, xs, kk4, 4); break;
	default: hrow_sse41_k(in, out, ow, xs, kk4, K); break;
	}
}

static bool have_sse41(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("sse4.1") && !portable_only;
}
#else
static bool have_sse41(void)
{
	return false;
}

static void hrow_sse41(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs,
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
#define HV_PAIRS_MAX 2

struct hgroup {
	int32_t base;                 /* first source pixel of the 64 bytes; -1: not eligible */
	int32_t pad[15];              /* the vectors below 64-byte aligned */
	/* [pair][third]: the permutation, high and low coefficients */
	uint8_t idx[HV_PAIRS_MAX][3][64];
	int16_t hi[HV_PAIRS_MAX][3][32];
	int16_t lo[HV_PAIRS_MAX][3][32];
};

static bool have_vbmi(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512vbmi") && !portable_only;
#else
	return false;
#endif
}

/* The groups of 16 output pixels of a horizontal pass; returns how many are not eligible. */
static int hgroups_init(struct hgroup *g, int ow, const int32_t *xs, const int32_t *kx, int K)
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
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static void
hrow_vbmi(const uint8_t *in, size_t in_bytes, uint8_t *out, int ow, const int32_t *xs,
	  const int32_t *kx4, int K, const struct hgroup *g)
{
	for (int c0 = 0; c0 < ow; c0 += 16, g++) {
		size_t at, left;
		__m512i data;

		if (g->base < 0) {
			hrow_sse41(in, out + 3 * (size_t)c0, ow - c0 < 16 ? ow - c0 : 16, xs + c0,
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
static void hrow_vbmi(const uint8_t *in, size_t in_bytes, uint8_t *out, int ow, const int32_t *xs,
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
KERNEL static void vrow(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row,
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
 * and vpmaddwd with the coefficients' high and low 11 bits, as hrow_vbmi().
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

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
vrow_avx512(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row, size_t len, int K)
{
	switch (K) {
	case 1: vrow_avx512_k(in, stride, k, row, len, 1); return;
	case 2: vrow_avx512_k(in, stride, k, row, len, 2); return;
	case 3: vrow_avx512_k(in, stride, k, row, len, 3); return;
	case 4: vrow_avx512_k(in, stride, k, row, len, 4); return;
	default: vrow_avx512_k(in, stride, k, row, len, K); return;
	}
}

static bool have_avx512bw(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && !portable_only;
}
#else
static void vrow_avx512(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row,
			size_t len, int K)
{
	(void)in, (void)stride, (void)k, (void)row, (void)len, (void)K;
}

static bool have_avx512bw(void)
{
	return false;
}
#endif

/* Where a stage writes its rows: the next stage's input, or the sample. */
struct sink {
	const struct imageop *op;
	bool final;
	uint8_t *buf;                 /* !final: packed RGB, ow x oh */
	void *dst;                    /* final: the sample in the slot */
	int ow, oh;
};

#define SINK_ROW(T, CONV)                                                              \
	do {                                                                           \
		T *d = k->dst;                                                         \
		if (op->nhwc) {                                                        \
			d += (size_t)y * w * 3;                                        \
			if (!flip) {                                                   \
				for (int x = 0; x < w; x++) {                          \
					d[3 * x] = CONV(0, row[3 * x]);                \
					d[3 * x + 1] = CONV(1, row[3 * x + 1]);        \
					d[3 * x + 2] = CONV(2, row[3 * x + 2]);        \
				}                                                      \
			} else {                                                       \
				for (int x = 0; x < w; x++) {                          \
					const uint8_t *p = row + 3 * (w - 1 - x);      \
					d[3 * x] = CONV(0, p[0]);                      \
					d[3 * x + 1] = CONV(1, p[1]);                  \
					d[3 * x + 2] = CONV(2, p[2]);                  \
				}                                                      \
			}                                                              \
		} else {                                                               \
			T *d0 = d + (size_t)y * w, *d1 = d0 + plane, *d2 = d1 + plane; \
			if (!flip) {                                                   \
				for (int x = 0; x < w; x++) {                          \
					d0[x] = CONV(0, row[3 * x]);                   \
					d1[x] = CONV(1, row[3 * x + 1]);               \
					d2[x] = CONV(2, row[3 * x + 2]);               \
				}                                                      \
			} else {                                                       \
				for (int x = 0; x < w; x++) {                          \
					const uint8_t *p = row + 3 * (w - 1 - x);      \
					d0[x] = CONV(0, p[0]);                         \
					d1[x] = CONV(1, p[1]);                         \
					d2[x] = CONV(2, p[2]);                         \
				}                                                      \
			}                                                              \
		}                                                                      \
	} while (0)

#define CONV_U8(c, v) (v)
#define CONV_F32(c, v) (lut[c][v])
#define CONV_F16(c, v) (lut16[c][v])

static void sink_row(const struct sink *k, int y, const uint8_t *row, bool flip)
{
	const struct imageop *op = k->op;
	const float (*lut)[256] = op->lut;
	const uint16_t (*lut16)[256] = op->lut16;
	int w = k->ow;
	size_t plane = (size_t)k->ow * k->oh;

	if (!k->final) {
		uint8_t *out = k->buf + (size_t)y * w * 3;

		if (!flip) {
			memcpy(out, row, (size_t)w * 3);
		} else {
			for (int x = 0; x < w; x++)
				memcpy(out + 3 * x, row + 3 * (w - 1 - x), 3);
		}
		return;
	}
	switch (op->dtype) {
	case LDR_DTYPE_UINT8:
		if (op->nhwc && !flip)
			memcpy((uint8_t *)k->dst + (size_t)y * w * 3, row, (size_t)w * 3);
		else
			SINK_ROW(uint8_t, CONV_U8);
		break;
	case LDR_DTYPE_FLOAT32:
		if (op->f32_simd && have_avx2_fma()) {
			float *d0 = (float *)k->dst + (size_t)y * w;
			float *const d[3] = { d0, d0 + plane, d0 + 2 * plane };

			f32_planes(op, row, w, flip, d);
			break;
		}
		SINK_ROW(float, CONV_F32);
		break;
	default: /* float16, bfloat16 */
		SINK_ROW(uint16_t, CONV_F16);
		break;
	}
}

/*
 * Run one stage: the window [lo_x, lo_x + in_w) x [lo_y, lo_y + in_h) of
 * @src (@src_h rows of @stride bytes), whose box in0..in1 (relative to the
 * window) maps onto the target.
 */
static int stage_run(struct image_scratch *s, const struct imageop_stage *st, const uint8_t *src,
		     size_t stride, int src_h, int lo_x, int lo_y, int in_w, int in_h, double in0x,
		     double in1x, double in0y, double in1y, const struct sink *sink)
{
	int ow = st->ow, oh = st->oh;
	bool need_h = st->tw != in_w || in0x != 0.0 || in1x != (double)in_w;
	bool need_v = st->th != in_h || in0y != 0.0 || in1y != (double)in_h;
	int ksx = need_h ? ksize_of(in0x, in1x, st->tw) : 1;
	int ksy = need_v ? ksize_of(in0y, in1y, st->th) : 1;
	int Kx = 1, Ky = 1, yfirst = in_h, ylast = 0, c0 = 0, c1 = 0, hnext;
	size_t rowlen = (size_t)ow * 3, stride_t = rowlen + RESAMPLE_SLACK;
	size_t need = (size_t)ow * (2 * sizeof(int32_t) + ksx * sizeof(int32_t) + 1) +
		      (size_t)oh * (2 * sizeof(int32_t) + ksy * sizeof(int32_t) + 1) +
		      rowlen * sizeof(int32_t) + 64;
	bool simd = need_h && have_sse41();
	bool vbmi = simd && have_vbmi() && ksx <= 2 * HV_PAIRS_MAX + 1;
	bool v512 = need_v && have_avx512bw();
	int32_t *xs, *ys, *nsx, *nsy, *kx, *ky, *acc, *kx4 = NULL;
	uint8_t *padx, *pady, *row, *tmp, *last = NULL;
	struct hgroup *hg = NULL;

	if (simd)
		need += (size_t)ow * ksx * 4 * sizeof(int32_t) + 16;
	if (vbmi)
		need += (size_t)(ow + 15) / 16 * sizeof(struct hgroup) + 64;
	if (image_scratch_grow(&s->coef, &s->coef_cap, need) < 0 ||
	    image_scratch_grow(&s->row, &s->row_cap, 2 * stride_t + (size_t)in_w * 3 + 64) < 0)
		return -ENOMEM;
	acc = s->coef;
	xs = acc + rowlen;
	nsx = xs + ow;
	ys = nsx + ow;
	nsy = ys + oh;
	kx = nsy + oh;
	ky = kx + (size_t)ow * ksx;
	padx = (uint8_t *)(ky + (size_t)oh * ksy);
	pady = padx + ow;
	row = s->row;

	if (need_h) {
		coeffs(in_w, in0x, in1x, st->tw, st->ox, ow, ksx, &Kx, xs, kx, padx, nsx);
		if (simd) {
			/* each coefficient four times, 16-byte aligned */
			uintptr_t a = (uintptr_t)(pady + oh);

			int rest = 1;

			kx4 = (int32_t *)((a + 15) & ~(uintptr_t)15);
			if (vbmi) {
				/* after kx4, 64-byte aligned */
				a = (uintptr_t)(kx4 + (size_t)ow * Kx * 4);
				hg = (struct hgroup *)((a + 63) & ~(uintptr_t)63);
				rest = hgroups_init(hg, ow, xs, kx, Kx);
				vbmi = rest < (ow + 15) / 16;
			}
			/* for the SSE4.1 kernel: the groups VBMI does not take, or all */
			for (size_t i = 0; rest > 0 && i < (size_t)ow * Kx; i++)
				for (int l = 0; l < 4; l++)
					kx4[4 * i + l] = kx[i];
		}
	} else {
		coeffs_copy(st->tw, st->ox, ow, xs, kx, padx);
	}
	if (need_v)
		coeffs(in_h, in0y, in1y, st->th, st->oy, oh, ksy, &Ky, ys, ky, pady, nsy);
	else
		coeffs_copy(st->th, st->oy, oh, ys, ky, pady);
	for (int r = 0; r < oh; r++) {
		if (pady[r])
			continue;
		if (ys[r] < yfirst)
			yfirst = ys[r];
		if (ys[r] + Ky > ylast)
			ylast = ys[r] + Ky;
	}
	if (yfirst > ylast)
		yfirst = ylast = 0;
	if (!need_h) {
		/* the kept columns: [c0, c1) of the output are source columns */
		c0 = st->ox < 0 ? -st->ox : 0;
		c1 = st->tw - st->ox < ow ? st->tw - st->ox : ow;
		if (c1 < c0)
			c1 = c0;
	}

	/*
	 * The horizontal pass over the rows the vertical pass reads, each row
	 * computed when the first output row that needs it comes: the output
	 * row's stores (to memory, non-temporal) then overlap with the
	 * arithmetic of the next rows, and the rows just written are still in
	 * L1 when the vertical pass reads them.
	 */
	if (image_scratch_grow(&s->tmp, &s->tmp_cap, (size_t)(ylast - yfirst) * stride_t + 64) < 0)
		return -ENOMEM;
	tmp = s->tmp;
	hnext = yfirst;
	for (int r = 0; r < oh; r++) {
		const uint8_t *in, *out = row;

		for (; !pady[r] && hnext < ys[r] + Ky; hnext++) {
			const uint8_t *hin = src + (size_t)(lo_y + hnext) * stride + (size_t)lo_x * 3;
			uint8_t *hout = tmp + (size_t)(hnext - yfirst) * stride_t;

			if (!need_h) {
				memset(hout, 0, (size_t)c0 * 3);
				memcpy(hout + (size_t)c0 * 3, hin + (size_t)(st->ox + c0) * 3,
				       (size_t)(c1 - c0) * 3);
				memset(hout + (size_t)c1 * 3, 0, (size_t)(ow - c1) * 3);
				continue;
			}
			if (!simd) {
				hrow_c(hin, hout, ow, xs, kx, Kx);
				continue;
			}
			if (lo_y + hnext == src_h - 1) {
				/* 4-byte reads: the image's last row goes through a copy with slack */
				last = row + 2 * stride_t;
				memcpy(last, hin, (size_t)in_w * 3);
				hin = last;
			}
			if (vbmi)
				hrow_vbmi(hin, (size_t)in_w * 3, hout, ow, xs, kx4, Kx, hg);
			else
				hrow_sse41(hin, hout, ow, xs, kx4, Kx);
		}
		/* the vertical pass, then the output conversion */
		in = tmp + (size_t)(ys[r] - yfirst) * stride_t;
		if (pady[r])
			memset(row, 0, rowlen);
		else if (!need_v)
			out = in;
		else if (v512 && Ky <= 16)
			vrow_avx512(in, stride_t, ky + (size_t)r * Ky, row, rowlen, Ky);
		else
			vrow(in, stride_t, ky + (size_t)r * Ky, row, rowlen, Ky, acc);
		sink_row(sink, r, out, st->flip);
	}
	return 0;
}

/* Stage 0's window in the decoded image (@sw x @sh), and its box within it. */
static void window0(const struct imageop_stage *st, int sw, int sh, int *lo_x, int *lo_y,
		    int *in_w, int *in_h, double *in0x, double *in1x, double *in0y, double *in1y)
{
	*lo_x = st->wx;
	*lo_y = st->wy;
	*in_w = st->ww;
	*in_h = st->wh;
	*in0x = 0;
	*in1x = st->ww;
	*in0y = 0;
	*in1y = st->wh;
	if (sw != st->in_w || sh != st->in_h) {
		/* a DCT-scaled decode: the window in scaled coordinates */
		double fx = (double)sw / st->in_w, fy = (double)sh / st->in_h;
		double bx0 = st->wx * fx, bx1 = (st->wx + st->ww) * fx;
		double by0 = st->wy * fy, by1 = (st->wy + st->wh) * fy;
		int hx = (int)ceil(bx1), hy = (int)ceil(by1);

		*lo_x = (int)floor(bx0);
		*lo_y = (int)floor(by0);
		*in_w = (hx < sw ? hx : sw) - *lo_x;
		*in_h = (hy < sh ? hy : sh) - *lo_y;
		*in0x = bx0 - *lo_x;
		*in1x = bx1 - *lo_x;
		*in0y = by0 - *lo_y;
		*in1y = by1 - *lo_y;
		if (*in1x > *in_w)
			*in1x = *in_w;
		if (*in1y > *in_h)
			*in1y = *in_h;
	}
}

void imageop_window(const struct imageop_plan *plan, int pw, int ph, int *x0, int *y0, int *x1,
		    int *y1)
{
	int in_w, in_h;
	double a, b, c, d;

	window0(&plan->st[0], pw, ph, x0, y0, &in_w, &in_h, &a, &b, &c, &d);
	*x1 = *x0 + in_w;
	*y1 = *y0 + in_h;
}

int imageop_run_region(const struct imageop *op, struct image_scratch *s,
		       const struct imageop_plan *plan, const uint8_t *pix, int pw, int ph,
		       const struct image_region *got, void *dst, char *err, size_t errlen)
{
	const uint8_t *src = pix;
	int sw = got->w, sh = got->h;

	for (int i = 0; i < plan->n; i++) {
		const struct imageop_stage *st = &plan->st[i];
		struct sink sink = { .op = op, .final = i == plan->n - 1, .dst = dst,
				     .ow = st->ow, .oh = st->oh };
		int lo_x = st->wx, lo_y = st->wy, in_w = st->ww, in_h = st->wh;
		double in0x = 0, in1x = st->ww, in0y = 0, in1y = st->wh;
		int r;

		if (i == 0) {
			window0(st, pw, ph, &lo_x, &lo_y, &in_w, &in_h, &in0x, &in1x, &in0y,
				&in1y);
			/* relative to the decoded region */
			lo_x -= got->x;
			lo_y -= got->y;
			if (lo_x < 0 || lo_y < 0 || lo_x + in_w > got->w || lo_y + in_h > got->h)
				return errfmt(-EINVAL, err, errlen,
					    "decoded region misses the crop window");
		}
		if (!sink.final) {
			uint8_t **b = &s->stage[i % 2];

			if (image_scratch_grow(b, &s->stage_cap[i % 2],
					       (size_t)st->ow * st->oh * 3) < 0)
				return errfmt(-ENOMEM, err, errlen, "out of memory for a %dx%d image",
					    st->ow, st->oh);
			sink.buf = *b;
		}
		r = stage_run(s, st, src, (size_t)sw * 3, sh, lo_x, lo_y, in_w, in_h, in0x, in1x,
			      in0y, in1y, &sink);
		if (r < 0)
			return errfmt(r, err, errlen, "out of memory resampling to %dx%d", st->ow,
				    st->oh);
		src = sink.buf;
		sw = st->ow;
		sh = st->oh;
	}
#if defined(__x86_64__) && defined(__GNUC__)
	if (op->f32_simd)
		_mm_sfence(); /* the non-temporal stores, before the sample is handed on */
#endif
	return 0;
}

int imageop_run(const struct imageop *op, struct image_scratch *s, const struct imageop_plan *plan,
		const uint8_t *pix, int pw, int ph, void *dst, char *err, size_t errlen)
{
	struct image_region all = { 0, 0, pw, ph };

	return imageop_run_region(op, s, plan, pix, pw, ph, &all, dst, err, errlen);
}

int imageop_resize_rgb(const struct imageop *op, struct image_scratch *s, const uint8_t *pix,
		       int pw, int ph, uint8_t *out, int ow, int oh)
{
	struct imageop_stage st;
	struct sink sink = { .op = op, .final = false, .buf = out, .ow = ow, .oh = oh };

	stage_reset(&st, pw, ph);
	st.resized = true;
	st.tw = st.ow = ow;
	st.th = st.oh = oh;
	return stage_run(s, &st, pix, (size_t)pw * 3, ph, 0, 0, pw, ph, 0, pw, 0, ph, &sink);
}

/* The DCT scale a decode for @plan uses, and the image's size at it. */
static void plan_scale(const struct imageop *op, const struct imageop_plan *plan,
		       const struct image_info *info, int *num, int *denom, int *pw, int *ph)
{
	const struct imageop_stage *st = &plan->st[0];

	*num = *denom = 1;
	if (op->dct_scaling && st->resized)
		image_pick_scale(info, st->ww, st->wh, st->tw, st->th, num, denom);
	image_scaled_size(info, *num, *denom, pw, ph);
}

int imageop_decode_run_many(const struct imageop *op, struct image_scratch *s,
			    const struct imageop_plan *plans, size_t n, const uint8_t *data,
			    size_t len, const struct image_info *info, void *const *dsts,
			    unsigned *decodes, char *err, size_t errlen)
{
	uint32_t done = 0; /* bit i: plans[i] written */

	*decodes = 0;
	for (size_t i = 0; i < n; i++) {
		int num, denom, pw, ph, x0, y0, x1, y1, r;
		struct image_region got;

		if (done & (1u << i))
			continue;
		/* one decode for every plan at this DCT scale: the union of their
		 * windows, whose pixels are each window's, bit for bit (image.h) */
		plan_scale(op, &plans[i], info, &num, &denom, &pw, &ph);
		imageop_window(&plans[i], pw, ph, &x0, &y0, &x1, &y1);
		for (size_t k = i + 1; k < n; k++) {
			int kn, kd, kw, kh, a0, b0, a1, b1;

			plan_scale(op, &plans[k], info, &kn, &kd, &kw, &kh);
			if (kn * denom != num * kd)
				continue;
			imageop_window(&plans[k], pw, ph, &a0, &b0, &a1, &b1);
			x0 = a0 < x0 ? a0 : x0;
			y0 = b0 < y0 ? b0 : y0;
			x1 = a1 > x1 ? a1 : x1;
			y1 = b1 > y1 ? b1 : y1;
		}
		r = image_decode_region(s, data, len, info, num, denom, x0, y0, x1, y1, &got, err,
					errlen);
		if (r < 0)
			return r;
		++*decodes;
		uint64_t t = mono_ns();
		for (size_t k = i; k < n; k++) {
			int kn, kd, kw, kh;

			if (done & (1u << k))
				continue;
			plan_scale(op, &plans[k], info, &kn, &kd, &kw, &kh);
			if (kn * denom != num * kd)
				continue;
			r = imageop_run_region(op, s, &plans[k], s->pix, pw, ph, &got, dsts[k], err,
					       errlen);
			if (r < 0)
				return r;
			done |= 1u << k;
		}
		s->transform_ns += mono_ns() - t;
	}
	return 0;
}

int imageop_decode_run(const struct imageop *op, struct image_scratch *s,
		       const struct imageop_plan *plan, const uint8_t *data, size_t len,
		       const struct image_info *info, void *dst, char *err, size_t errlen)
{
	unsigned decodes;

	s->transform_ns = 0;
	return imageop_decode_run_many(op, s, plan, 1, data, len, info, &dst, &decodes, err,
				       errlen);
}
