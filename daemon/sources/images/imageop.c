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
#include "resample.h"


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

#if defined(__x86_64__) && defined(__GNUC__)
static bool have_avx2_fma(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !resample_portable_only;
}

static bool have_avx512(void)
{
	/* no cache: worker threads ask at once, and this is a load */
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vbmi") && !resample_portable_only;
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

void imageop_portable_only(bool on)
{
	resample_portable_only = on;
}

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
	int ksx = need_h ? resample_ksize(in0x, in1x, st->tw) : 1;
	int ksy = need_v ? resample_ksize(in0y, in1y, st->th) : 1;
	int Kx = 1, Ky = 1, yfirst = in_h, ylast = 0, c0 = 0, c1 = 0, hnext;
	size_t rowlen = (size_t)ow * 3, stride_t = rowlen + RESAMPLE_SLACK;
	size_t need = (size_t)ow * (2 * sizeof(int32_t) + ksx * sizeof(int32_t) + 1) +
		      (size_t)oh * (2 * sizeof(int32_t) + ksy * sizeof(int32_t) + 1) +
		      rowlen * sizeof(int32_t) + 64;
	bool simd = need_h && resample_have_sse41();
	bool vbmi = simd && resample_have_vbmi() && ksx <= 2 * HV_PAIRS_MAX + 1;
	bool v512 = need_v && resample_have_avx512bw();
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
		resample_coeffs(in_w, in0x, in1x, st->tw, st->ox, ow, ksx, &Kx, xs, kx, padx, nsx);
		if (simd) {
			/* each coefficient four times, 16-byte aligned */
			uintptr_t a = (uintptr_t)(pady + oh);

			int rest = 1;

			kx4 = (int32_t *)((a + 15) & ~(uintptr_t)15);
			if (vbmi) {
				/* after kx4, 64-byte aligned */
				a = (uintptr_t)(kx4 + (size_t)ow * Kx * 4);
				hg = (struct hgroup *)((a + 63) & ~(uintptr_t)63);
				rest = resample_hgroups_init(hg, ow, xs, kx, Kx);
				vbmi = rest < (ow + 15) / 16;
			}
			/* for the SSE4.1 kernel: the groups VBMI does not take, or all */
			for (size_t i = 0; rest > 0 && i < (size_t)ow * Kx; i++)
				for (int l = 0; l < 4; l++)
					kx4[4 * i + l] = kx[i];
		}
	} else {
		resample_coeffs_copy(st->tw, st->ox, ow, xs, kx, padx);
	}
	if (need_v)
		resample_coeffs(in_h, in0y, in1y, st->th, st->oy, oh, ksy, &Ky, ys, ky, pady, nsy);
	else
		resample_coeffs_copy(st->th, st->oy, oh, ys, ky, pady);
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
				resample_hrow_c(hin, hout, ow, xs, kx, Kx);
				continue;
			}
			if (lo_y + hnext == src_h - 1) {
				/* 4-byte reads: the image's last row goes through a copy with slack */
				last = row + 2 * stride_t;
				memcpy(last, hin, (size_t)in_w * 3);
				hin = last;
			}
			if (vbmi)
				resample_hrow_vbmi(hin, (size_t)in_w * 3, hout, ow, xs, kx4, Kx, hg);
			else
				resample_hrow_sse41(hin, hout, ow, xs, kx4, Kx);
		}
		/* the vertical pass, then the output conversion */
		in = tmp + (size_t)(ys[r] - yfirst) * stride_t;
		if (pady[r])
			memset(row, 0, rowlen);
		else if (!need_v)
			out = in;
		else if (v512 && Ky <= 16)
			resample_vrow_avx512(in, stride_t, ky + (size_t)r * Ky, row, rowlen, Ky);
		else
			resample_vrow(in, stride_t, ky + (size_t)r * Ky, row, rowlen, Ky, acc);
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
