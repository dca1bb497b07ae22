/* SPDX-License-Identifier: MIT */
/* imageop - torchvision-equivalent image transforms, written into the batch slot */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "image.h"
#include "sources/spec.h"

#define IMAGEOP_STAGES_MAX (SPEC_TRANSFORMS_MAX + 1)

/* The transforms of a pipeline, compiled once from its spec. */
struct imageop {
	struct transform t[SPEC_TRANSFORMS_MAX];
	size_t n;
	int dtype;                    /* uint8, float16, bfloat16, float32 */
	bool nhwc;
	uint32_t out_h, out_w;
	bool dct_scaling;
	float lut[3][256];            /* float32: channel value -> output */
	bool f32_simd;                /* float32 NCHW: the SIMD kernel gives lut's values */
	float f32k[3][4];             /* its constants: 1/255, mean, std, 1/std */
	uint16_t lut16[3][256];       /* float16 / bfloat16 */
};

/*
 * One resampling pass: a window of the stage's input image is resized to a
 * target size, of which a region (possibly reaching past the target: zero
 * padding) is kept, optionally mirrored. Crops, resizes and flips compose into
 * one such pass until a resize follows a resize.
 */
struct imageop_stage {
	int in_w, in_h;               /* this stage's input image */
	int wx, wy, ww, wh;           /* the window of it that is resampled */
	bool resized;
	int tw, th;                   /* the window resampled to this size */
	int ox, oy, ow, oh;           /* the region of the target kept */
	bool flip;
};

struct imageop_plan {
	struct imageop_stage st[IMAGEOP_STAGES_MAX];
	int n;
};

/* Compile the transforms, output dtype and layout of an image spec. */
void imageop_init(struct imageop *op, const struct spec *spec);

/* The key of sample @idx's random draws in @epoch (docs/spec.md). */
uint64_t imageop_key(uint64_t seed, uint64_t epoch, uint64_t idx);

/**
 * imageop_plan() - fix the geometry of one sample: draw its random crop and
 * flip from @key, for an image of @w x @h.
 * Return: 0, or -EINVAL when an intermediate image would exceed
 * IMAGE_MAX_PIXELS or the result is not the pipeline's size.
 */
int imageop_plan(const struct imageop *op, int w, int h, uint64_t key, struct imageop_plan *plan,
		 char *err, size_t errlen);

/**
 * imageop_run() - resample the decoded image @pix (@pw x @ph, packed RGB; may
 * be a DCT-scaled decode of the plan's input) and write the sample into @dst
 * in the output dtype and layout.
 * Return: 0 or -ENOMEM.
 */
int imageop_run(const struct imageop *op, struct image_scratch *s, const struct imageop_plan *plan,
		const uint8_t *pix, int pw, int ph, void *dst, char *err, size_t errlen);

/**
 * imageop_window() - the rectangle [@x0, @x1) x [@y0, @y1) of the decoded
 * image (@pw x @ph: the plan's input, possibly DCT-scaled) that
 * imageop_run() reads.
 */
void imageop_window(const struct imageop_plan *plan, int pw, int ph, int *x0, int *y0, int *x1,
		    int *y1);

/**
 * imageop_run_region() - imageop_run() from a decoded region: @pix holds the
 * rectangle @got (which contains imageop_window()) of the @pw x @ph image.
 */
int imageop_run_region(const struct imageop *op, struct image_scratch *s,
		       const struct imageop_plan *plan, const uint8_t *pix, int pw, int ph,
		       const struct image_region *got, void *dst, char *err, size_t errlen);

/**
 * imageop_decode_run() - decode the encoded image @data (probed into @info,
 * planned into @plan) and write the sample into @dst: picks the DCT scale
 * (when op->dct_scaling and the first pass reduces), decodes only the window
 * the plan reads (image_decode_region()), then resamples it.
 * Return: 0, or -EINVAL with the decoder's message in @err, or -ENOMEM.
 */
int imageop_decode_run(const struct imageop *op, struct image_scratch *s,
		       const struct imageop_plan *plan, const uint8_t *data, size_t len,
		       const struct image_info *info, void *dst, char *err, size_t errlen);

/**
 * imageop_resize_rgb() - resize the whole packed RGB image @pix (@pw x @ph)
 * to @ow x @oh into @out (packed RGB), with the transforms' bilinear filter
 * (antialiased when it reduces): the decoded-image cache's max_side.
 * Return: 0 or -ENOMEM.
 */
int imageop_resize_rgb(const struct imageop *op, struct image_scratch *s, const uint8_t *pix,
		       int pw, int ph, uint8_t *out, int ow, int oh);

/**
 * imageop_decode_run_many() - imageop_decode_run() for @n (at most 32) plans
 * of one image (one per augment seed), plan i's sample into @dsts[i]: one
 * decode per distinct DCT scale among them, of the union of their windows,
 * so each sample equals imageop_decode_run()'s for its plan, bit for bit.
 * @decodes: the decodes made. Adds the resampling time to @s->transform_ns.
 */
int imageop_decode_run_many(const struct imageop *op, struct image_scratch *s,
			    const struct imageop_plan *plans, size_t n, const uint8_t *data,
			    size_t len, const struct image_info *info, void *const *dsts,
			    unsigned *decodes, char *err, size_t errlen);

/*
 * The size of an image of @h x @w after resize @t, as torchvision computes it
 * (an integer size is the shorter side: long = int(size * long / short)):
 * the plans here, and the spec's output size (source-images.c).
 */
void transform_resize_dims(const struct transform *t, uint32_t h, uint32_t w, uint64_t *oh,
			   uint64_t *ow);

/* The @n-th uniform draw in [0, 1) of @key. */
double imageop_uniform(uint64_t key, uint64_t n);

/* random_resized_crop's parameters as torchvision draws them (for tests). */
void imageop_rrc_params(const struct transform *t, int w, int h, uint64_t key, uint64_t *draw,
			int *top, int *left, int *ch, int *cw);

/* Tests: use the portable kernels only (not the SIMD ones), process-wide. */
void imageop_portable_only(bool on);

uint16_t imageop_f32_to_f16(float f);
uint16_t imageop_f32_to_bf16(float f);
