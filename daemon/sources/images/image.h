/* SPDX-License-Identifier: MIT */
/* image - decode JPEG (libjpeg-turbo) and PNG (libpng) to 8-bit RGB */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define IMAGE_MAX_PIXELS (1u << 27)   /* larger images are refused */

enum image_format {
	IMAGE_JPEG = 1,
	IMAGE_PNG,
};

struct image_info {
	int format;
	int width, height;
	int jpeg_colorspace;          /* TJCS_* */
};

/*
 * Per-thread buffers, kept between samples and freed when the thread exits:
 * the decoder handle, the encoded file, the decoded pixels and the
 * transforms' intermediate images.
 */
struct image_scratch {
	void *tj;                     /* tjhandle */
	void *dj;                     /* libjpeg decompressor (region decoding) */
	uint8_t *file;
	size_t file_cap;
	uint8_t *pix;                 /* decoded RGB (or CMYK before conversion) */
	size_t pix_cap;
	uint8_t *stage[2];            /* multi-stage transforms */
	size_t stage_cap[2];
	uint8_t *tmp;                 /* horizontal resampling pass */
	size_t tmp_cap;
	uint8_t *row;                 /* one output row */
	size_t row_cap;
	void *coef;                   /* resampling coefficients and bounds */
	size_t coef_cap;
	uint8_t *reduced;             /* a decoded image reduced to cache.max_side, not cached */
	size_t reduced_cap;
	uint64_t transform_ns;        /* ns imageop_decode_run() last spent transforming */
};

/* This thread's scratch, or NULL when out of memory. */
struct image_scratch *image_scratch_get(void);
/* Grow *@p to at least @need bytes (contents are not kept). */
int image_scratch_grow(void *p, size_t *cap, size_t need);

/* What a worker's scratch keeps between samples, at most. */
#define IMAGE_SCRATCH_KEEP (64u << 20)
/**
 * image_scratch_trim() - give back buffers beyond IMAGE_SCRATCH_KEEP.
 *
 * After an outsize image (decode.max_pixels allows 192 MiB of pixels, and a
 * 16 KB PNG may declare them) the buffers it grew would stay with the worker
 * until it exits, for every pipeline after; this frees the largest ones
 * until what is left is at most IMAGE_SCRATCH_KEEP. Ordinary images keep
 * theirs (no reallocation per sample).
 */
void image_scratch_trim(struct image_scratch *s);
/* The bytes the scratch's buffers hold. */
size_t image_scratch_bytes(const struct image_scratch *s);

/**
 * image_probe() - the format and size of an encoded image, from its header.
 * Return: 0, or -EINVAL with @err set ("empty file", "not a JPEG or PNG
 * image", the decoder's message, or a size beyond IMAGE_MAX_PIXELS).
 */
int image_probe(struct image_scratch *s, const uint8_t *data, size_t len, struct image_info *info,
		char *err, size_t errlen);

/**
 * image_pick_scale() - the JPEG DCT scaling factor for a region.
 *
 * The smallest factor num/denom of libjpeg-turbo's 1/8, 1/4, 3/8 and 1/2
 * at which a @win_w x @win_h window of the image still has at least
 * @need_w x @need_h pixels; 1/1 where none does, and for PNG. 5/8 to 7/8
 * are never chosen: slower than a whole decode. (Not PIL's rule, which
 * skips 3/8: image_draft_scale() is that one.)
 */
void image_pick_scale(const struct image_info *info, int win_w, int win_h, int need_w, int need_h,
		      int *num, int *denom);
/**
 * image_draft_scale() - the JPEG DCT scale PIL's Image.draft() picks.
 *
 * For a reduction of the whole image to @need_w x @need_h: 1/8, 1/4, 1/2 or
 * 1/1, the largest 1/s with s <= min(width / @need_w, height / @need_h)
 * (integer divisions), as Pillow's JpegImageFile.draft(); 1/1 for PNG. The
 * decoded-image cache reduces with it, so that its pixels are PIL's.
 */
void image_draft_scale(const struct image_info *info, int need_w, int need_h, int *num,
		       int *denom);
/* The image's size when decoded at @num/@denom (libjpeg rounds up). */
void image_scaled_size(const struct image_info *info, int num, int denom, int *w, int *h);

/**
 * image_decode() - decode to packed 8-bit RGB in @s->pix.
 *
 * JPEG: baseline and progressive, grayscale and CMYK/YCCK converted to RGB
 * (CMYK as PIL converts it, Adobe-inverted), at @num/@denom. PNG: 1..16-bit
 * gray, RGB and palette, alpha dropped, 16-bit reduced to the high byte.
 * Truncated files are errors; libjpeg's other warnings (extraneous bytes...)
 * are not, as with PIL.
 * Return: 0, or -EINVAL with the decoder's message in @err, or -ENOMEM.
 */
int image_decode(struct image_scratch *s, const uint8_t *data, size_t len,
		 const struct image_info *info, int num, int denom, char *err, size_t errlen);

/* A rectangle of an image (decoded at some scale). */
struct image_region {
	int x, y, w, h;
};

/**
 * image_decode_region() - decode at least the window [@x0, @x1) x [@y0, @y1)
 * of the image scaled by @num/@denom, to packed 8-bit RGB in @s->pix.
 *
 * @got: the rectangle of the scaled image that @s->pix holds (@got->w
 * pixels a row, @got->h rows); it contains the window. The window's pixels
 * equal those of image_decode() at the same scale, bit for bit; the pixels
 * of @got outside the window may not (the margin decoded for that).
 *
 * JPEG: libjpeg's jpeg_crop_scanline() for the columns (whole iMCU columns
 * on the left), jpeg_skip_scanlines() for the rows above, each with a margin
 * of two chroma samples and a pixel (fancy upsampling changes the pixels at a
 * cropped decode's edges), and decoding stops after the window's last row. A file that ends before its
 * EOI marker is refused as by image_decode() even when the window lies
 * before the truncation (so whether a file is good does not depend on the
 * crop drawn). PNG: the whole image.
 * Return: as image_decode().
 */
int image_decode_region(struct image_scratch *s, const uint8_t *data, size_t len,
			const struct image_info *info, int num, int denom, int x0, int y0, int x1,
			int y1, struct image_region *got, char *err, size_t errlen);

/* Region decoding on (default) or off (whole image, for comparisons), process-wide. */
void image_set_roi(int on);
