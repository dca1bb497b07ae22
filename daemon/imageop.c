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
 *   same float32 operations as torchvision, so they are exact too.
 *
 * A flip is applied while writing a row; with a flip before a resize the
 * result can differ from torchvision's by a rounding step, as PIL's filter
 * positions are not exactly mirror-symmetric.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "imageop.h"

#define PRECISION_BITS (32 - 8 - 2)

__attribute__((format(printf, 4, 5)))
static int fail(int r, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return r;
}

/* ---- random draws ---- */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t splitmix64(uint64_t x)
{
	return mix64(x + 0x9e3779b97f4a7c15ull);
}

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
	}
}

/* ---- planning ---- */

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
				return fail(-EINVAL, err, errlen,
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
					return fail(-EINVAL, err, errlen,
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
		return fail(-EINVAL, err, errlen, "transforms give %dx%d, not the pipeline's %ux%u",
			    st->ow, st->oh, op->out_w, op->out_h);
	return 0;
}

/* ---- resampling (PIL's, 8 bits per channel) ---- */

static inline double bilinear(double x)
{
	if (x < 0.0)
		x = -x;
	return x < 1.0 ? 1.0 - x : 0.0;
}

static int ksize_of(int in_size_window, double in0, double in1, int out_size)
{
	double scale = (in1 - in0) / out_size;
	double support = scale < 1.0 ? 1.0 : scale;

	(void)in_size_window;
	return (int)ceil(support) * 2 + 1;
}

/*
 * PIL's precompute_coeffs() and normalize_coeffs_8bpc() for the target
 * positions [first, first + count); positions outside [0, out_size) get
 * bounds {0, -1}: padding.
 */
static void coeffs(int in_size, double in0, double in1, int out_size, int first, int count,
		   int ksize, int *bounds, int32_t *kk)
{
	double scale = (in1 - in0) / out_size;
	double filterscale = scale < 1.0 ? 1.0 : scale;
	double support = filterscale; /* bilinear: support 1 */
	double ss = 1.0 / filterscale;

	for (int c = 0; c < count; c++) {
		int xx = first + c, xmin, xmax;
		int32_t *k = kk + (size_t)c * ksize;
		double center, ww = 0.0;

		if (xx < 0 || xx >= out_size) {
			bounds[2 * c] = 0;
			bounds[2 * c + 1] = -1;
			continue;
		}
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
		bounds[2 * c] = xmin;
		bounds[2 * c + 1] = xmax;
	}
}

static inline uint8_t clip8(int32_t in)
{
	if (in >= (1 << PRECISION_BITS << 8))
		return 255;
	if (in <= 0)
		return 0;
	return (uint8_t)(in >> PRECISION_BITS);
}

/* Where a stage writes its rows: the next stage's input, or the sample. */
struct sink {
	const struct imageop *op;
	bool final;
	uint8_t *buf;                 /* !final: packed RGB, ow x oh */
	void *dst;                    /* final: the sample in the slot */
	int ow, oh;
};

static void sink_row(const struct sink *k, int y, const uint8_t *row, bool flip)
{
	const struct imageop *op = k->op;
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
	case LDR_DTYPE_UINT8: {
		uint8_t *d = k->dst;

		if (op->nhwc) {
			d += (size_t)y * w * 3;
			if (!flip) {
				memcpy(d, row, (size_t)w * 3);
			} else {
				for (int x = 0; x < w; x++)
					memcpy(d + 3 * x, row + 3 * (w - 1 - x), 3);
			}
		} else {
			d += (size_t)y * w;
			for (int x = 0; x < w; x++) {
				const uint8_t *p = row + 3 * (flip ? w - 1 - x : x);

				d[x] = p[0];
				d[plane + x] = p[1];
				d[2 * plane + x] = p[2];
			}
		}
		break;
	}
	case LDR_DTYPE_FLOAT32: {
		float *d = k->dst;

		if (op->nhwc) {
			d += (size_t)y * w * 3;
			for (int x = 0; x < w; x++) {
				const uint8_t *p = row + 3 * (flip ? w - 1 - x : x);

				d[3 * x] = op->lut[0][p[0]];
				d[3 * x + 1] = op->lut[1][p[1]];
				d[3 * x + 2] = op->lut[2][p[2]];
			}
		} else {
			d += (size_t)y * w;
			for (int x = 0; x < w; x++) {
				const uint8_t *p = row + 3 * (flip ? w - 1 - x : x);

				d[x] = op->lut[0][p[0]];
				d[plane + x] = op->lut[1][p[1]];
				d[2 * plane + x] = op->lut[2][p[2]];
			}
		}
		break;
	}
	default: { /* float16, bfloat16 */
		uint16_t *d = k->dst;

		if (op->nhwc) {
			d += (size_t)y * w * 3;
			for (int x = 0; x < w; x++) {
				const uint8_t *p = row + 3 * (flip ? w - 1 - x : x);

				d[3 * x] = op->lut16[0][p[0]];
				d[3 * x + 1] = op->lut16[1][p[1]];
				d[3 * x + 2] = op->lut16[2][p[2]];
			}
		} else {
			d += (size_t)y * w;
			for (int x = 0; x < w; x++) {
				const uint8_t *p = row + 3 * (flip ? w - 1 - x : x);

				d[x] = op->lut16[0][p[0]];
				d[plane + x] = op->lut16[1][p[1]];
				d[2 * plane + x] = op->lut16[2][p[2]];
			}
		}
		break;
	}
	}
}

/*
 * Run one stage: the window [lo_x, lo_x + in_w) x [lo_y, lo_y + in_h) of
 * @src, whose box in0..in1 (relative to the window) maps onto the target.
 */
static int stage_run(struct image_scratch *s, const struct imageop_stage *st, const uint8_t *src,
		     size_t stride, int lo_x, int lo_y, int in_w, int in_h, double in0x, double in1x,
		     double in0y, double in1y, const struct sink *sink)
{
	int ow = st->ow, oh = st->oh;
	bool need_h = st->tw != in_w || in0x != 0.0 || in1x != (double)in_w;
	bool need_v = st->th != in_h || in0y != 0.0 || in1y != (double)in_h;
	int ksx = need_h ? ksize_of(in_w, in0x, in1x, st->tw) : 1;
	int ksy = need_v ? ksize_of(in_h, in0y, in1y, st->th) : 1;
	size_t rowlen = (size_t)ow * 3;
	size_t need = (size_t)ow * (2 * sizeof(int) + ksx * sizeof(int32_t)) +
		      (size_t)oh * (2 * sizeof(int) + ksy * sizeof(int32_t)) + rowlen * sizeof(int32_t) + 64;
	int *bx, *by;
	int32_t *kx, *ky, *acc;
	uint8_t *row, *tmp;
	int yfirst = in_h, ylast = 0;

	if (image_scratch_grow(&s->coef, &s->coef_cap, need) < 0 ||
	    image_scratch_grow(&s->row, &s->row_cap, rowlen) < 0)
		return -ENOMEM;
	bx = s->coef;
	by = bx + 2 * (size_t)ow;
	kx = (int32_t *)(by + 2 * (size_t)oh);
	ky = kx + (size_t)ow * ksx;
	acc = ky + (size_t)oh * ksy;
	row = s->row;

	/* columns: the coefficients, or the source column (bounds {x, 1}) */
	if (need_h) {
		coeffs(in_w, in0x, in1x, st->tw, st->ox, ow, ksx, bx, kx);
	} else {
		for (int c = 0; c < ow; c++) {
			int tx = st->ox + c;

			bx[2 * c] = tx;
			bx[2 * c + 1] = tx >= 0 && tx < st->tw ? 1 : -1;
			kx[c] = 1 << PRECISION_BITS;
		}
	}
	if (need_v) {
		coeffs(in_h, in0y, in1y, st->th, st->oy, oh, ksy, by, ky);
	} else {
		for (int r = 0; r < oh; r++) {
			int ty = st->oy + r;

			by[2 * r] = ty;
			by[2 * r + 1] = ty >= 0 && ty < st->th ? 1 : -1;
			ky[r] = 1 << PRECISION_BITS;
		}
	}
	for (int r = 0; r < oh; r++) {
		if (by[2 * r + 1] <= 0)
			continue;
		if (by[2 * r] < yfirst)
			yfirst = by[2 * r];
		if (by[2 * r] + by[2 * r + 1] > ylast)
			ylast = by[2 * r] + by[2 * r + 1];
	}
	if (yfirst > ylast)
		yfirst = ylast = 0;

	/* horizontal pass over the rows the vertical pass reads */
	if (image_scratch_grow(&s->tmp, &s->tmp_cap, (size_t)(ylast - yfirst) * rowlen + 1) < 0)
		return -ENOMEM;
	tmp = s->tmp;
	for (int y = yfirst; y < ylast; y++) {
		const uint8_t *in = src + (size_t)(lo_y + y) * stride + (size_t)lo_x * 3;
		uint8_t *out = tmp + (size_t)(y - yfirst) * rowlen;

		for (int c = 0; c < ow; c++) {
			int xmin = bx[2 * c], n = bx[2 * c + 1];

			if (n < 0) {
				out[3 * c] = out[3 * c + 1] = out[3 * c + 2] = 0;
			} else if (!need_h) {
				memcpy(out + 3 * c, in + 3 * xmin, 3);
			} else {
				const int32_t *k = kx + (size_t)c * ksx;
				const uint8_t *p = in + 3 * xmin;
				int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;

				for (int x = 0; x < n; x++) {
					s0 += p[3 * x] * k[x];
					s1 += p[3 * x + 1] * k[x];
					s2 += p[3 * x + 2] * k[x];
				}
				out[3 * c] = clip8(s0);
				out[3 * c + 1] = clip8(s1);
				out[3 * c + 2] = clip8(s2);
			}
		}
	}

	/* vertical pass, one output row at a time */
	for (int r = 0; r < oh; r++) {
		int ymin = by[2 * r], n = by[2 * r + 1];

		if (n < 0) {
			memset(row, 0, rowlen);
		} else if (!need_v) {
			memcpy(row, tmp + (size_t)(ymin - yfirst) * rowlen, rowlen);
		} else {
			const int32_t *k = ky + (size_t)r * ksy;

			for (size_t e = 0; e < rowlen; e++)
				acc[e] = 1 << (PRECISION_BITS - 1);
			for (int y = 0; y < n; y++) {
				const uint8_t *in = tmp + (size_t)(ymin + y - yfirst) * rowlen;
				int32_t w = k[y];

				for (size_t e = 0; e < rowlen; e++)
					acc[e] += in[e] * w;
			}
			for (size_t e = 0; e < rowlen; e++)
				row[e] = clip8(acc[e]);
		}
		sink_row(sink, r, row, st->flip);
	}
	return 0;
}

int imageop_run(const struct imageop *op, struct image_scratch *s, const struct imageop_plan *plan,
		const uint8_t *pix, int pw, int ph, void *dst, char *err, size_t errlen)
{
	const uint8_t *src = pix;
	int sw = pw, sh = ph;

	for (int i = 0; i < plan->n; i++) {
		const struct imageop_stage *st = &plan->st[i];
		struct sink sink = { .op = op, .final = i == plan->n - 1, .dst = dst,
				     .ow = st->ow, .oh = st->oh };
		int lo_x = st->wx, lo_y = st->wy, in_w = st->ww, in_h = st->wh;
		double in0x = 0, in1x = st->ww, in0y = 0, in1y = st->wh;
		int r;

		if (i == 0 && (sw != st->in_w || sh != st->in_h)) {
			/* a DCT-scaled decode: the window in scaled coordinates */
			double fx = (double)sw / st->in_w, fy = (double)sh / st->in_h;
			double bx0 = st->wx * fx, bx1 = (st->wx + st->ww) * fx;
			double by0 = st->wy * fy, by1 = (st->wy + st->wh) * fy;
			int hx = (int)ceil(bx1), hy = (int)ceil(by1);

			lo_x = (int)floor(bx0);
			lo_y = (int)floor(by0);
			in_w = (hx < sw ? hx : sw) - lo_x;
			in_h = (hy < sh ? hy : sh) - lo_y;
			in0x = bx0 - lo_x;
			in1x = bx1 - lo_x;
			in0y = by0 - lo_y;
			in1y = by1 - lo_y;
			if (in1x > in_w)
				in1x = in_w;
			if (in1y > in_h)
				in1y = in_h;
		}
		if (!sink.final) {
			uint8_t **b = &s->stage[i % 2];

			if (image_scratch_grow(b, &s->stage_cap[i % 2],
					       (size_t)st->ow * st->oh * 3) < 0)
				return fail(-ENOMEM, err, errlen, "out of memory for a %dx%d image",
					    st->ow, st->oh);
			sink.buf = *b;
		}
		r = stage_run(s, st, src, (size_t)sw * 3, lo_x, lo_y, in_w, in_h, in0x, in1x, in0y,
			      in1y, &sink);
		if (r < 0)
			return fail(r, err, errlen, "out of memory resampling to %dx%d", st->ow,
				    st->oh);
		src = sink.buf;
		sw = st->ow;
		sh = st->oh;
	}
	return 0;
}
