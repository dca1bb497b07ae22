/* SPDX-License-Identifier: MIT */
/* image - decode JPEG (libjpeg-turbo) and PNG (libpng) to 8-bit RGB */

/*
 * Image files are untrusted: a corrupt, truncated, empty or foreign file must
 * give an error message, never a crash. TurboJPEG reports errors as return
 * values; libpng reports them through longjmp, so its decode runs under
 * setjmp with every buffer it allocates reachable from a volatile pointer.
 * Progressive JPEGs are decoded with TJFLAG_LIMITSCANS (at most 500 scans),
 * so that a crafted file cannot keep a worker busy for minutes.
 *
 * The outputs match PIL's, which torchvision's ImageFolder uses: libjpeg's
 * default (islow DCT, fancy upsampling), and PIL's conversions of CMYK and of
 * palette and gray PNGs. One exception: a 16-bit grayscale PNG becomes its
 * high byte here, where PIL clips the 16-bit value at 255.
 */
#include <errno.h>
#include <png.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <jpeglib.h>
#include <jerror.h>

#include "common.h"
#include "image.h"

#if JPEG_LIB_VERSION >= 70
#define MIN_DCT_H_SIZE(d) ((d)->min_DCT_h_scaled_size)
#define MIN_DCT_V_SIZE(d) ((d)->min_DCT_v_scaled_size)
#else
#define MIN_DCT_H_SIZE(d) ((d)->min_DCT_scaled_size)
#define MIN_DCT_V_SIZE(d) ((d)->min_DCT_scaled_size)
#endif

/* ---- per-thread scratch ---- */

static void jdec_free(void *p);

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
	struct image_scratch *s = p;

	if (!s)
		return;
	if (s->tj)
		tjDestroy(s->tj);
	jdec_free(s->dj);
	free(s->file);
	free(s->pix);
	free(s->stage[0]);
	free(s->stage[1]);
	free(s->tmp);
	free(s->row);
	free(s->coef);
	free(s->reduced);
	free(s);
}

static void scratch_init(void)
{
	if (pthread_key_create(&scratch_key, scratch_free) != 0)
		abort();
}

struct image_scratch *image_scratch_get(void)
{
	struct image_scratch *s;

	pthread_once(&scratch_once, scratch_init);
	s = pthread_getspecific(scratch_key);
	if (s)
		return s;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->tj = tjInitDecompress();
	if (!s->tj || pthread_setspecific(scratch_key, s) != 0) {
		scratch_free(s);
		return NULL;
	}
	return s;
}

int image_scratch_grow(void *p, size_t *cap, size_t need)
{
	void **buf = p;
	void *n;

	if (*buf && *cap >= need)
		return 0;
	if (need < 4096)
		need = 4096;
	free(*buf);
	*buf = NULL;
	*cap = 0;
	n = malloc(need);
	if (!n)
		return -ENOMEM;
	*buf = n;
	*cap = need;
	return 0;
}

/* The scratch's buffers and their sizes, for image_scratch_trim(). */
#define SCRATCH_BUFS 8

static void scratch_bufs(struct image_scratch *s, void **bufs[SCRATCH_BUFS],
			 size_t *caps[SCRATCH_BUFS])
{
	bufs[0] = (void **)&s->file, caps[0] = &s->file_cap;
	bufs[1] = (void **)&s->pix, caps[1] = &s->pix_cap;
	bufs[2] = (void **)&s->stage[0], caps[2] = &s->stage_cap[0];
	bufs[3] = (void **)&s->stage[1], caps[3] = &s->stage_cap[1];
	bufs[4] = (void **)&s->tmp, caps[4] = &s->tmp_cap;
	bufs[5] = (void **)&s->row, caps[5] = &s->row_cap;
	bufs[6] = &s->coef, caps[6] = &s->coef_cap;
	bufs[7] = (void **)&s->reduced, caps[7] = &s->reduced_cap;
}

size_t image_scratch_bytes(const struct image_scratch *s)
{
	void **bufs[SCRATCH_BUFS];
	size_t *caps[SCRATCH_BUFS], total = 0;

	scratch_bufs((struct image_scratch *)s, bufs, caps);
	for (int i = 0; i < SCRATCH_BUFS; i++)
		total += *bufs[i] ? *caps[i] : 0;
	return total;
}

void image_scratch_trim(struct image_scratch *s)
{
	void **bufs[SCRATCH_BUFS];
	size_t *caps[SCRATCH_BUFS];

	scratch_bufs(s, bufs, caps);
	while (image_scratch_bytes(s) > IMAGE_SCRATCH_KEEP) {
		int big = 0;

		for (int i = 1; i < SCRATCH_BUFS; i++)
			if ((*bufs[i] ? *caps[i] : 0) > (*bufs[big] ? *caps[big] : 0))
				big = i;
		free(*bufs[big]);
		*bufs[big] = NULL;
		*caps[big] = 0;
	}
}

/*
 * A new TurboJPEG handle, as every file gets one. libjpeg keeps the Huffman
 * and quantization tables of the files it read in its decompressor (for
 * abbreviated datastreams), and libjpeg-turbo fills the Huffman slots still
 * empty with the standard tables at its first decode. A file that uses a
 * table it does not define would otherwise decode with the tables the
 * thread's previous file left there, or fail on a fresh thread ("Huffman
 * table 0x01 was not defined"): whether a sample decodes, and its pixels,
 * would depend on which worker decoded what before it (found by
 * fuzz/fuzz-image.c; fuzz/regress/image/). A handle costs two small
 * allocations, little next to a decode.
 */
static int tj_fresh(struct image_scratch *s)
{
	if (s->tj)
		tjDestroy(s->tj);
	s->tj = tjInitDecompress();
	return s->tj ? 0 : -ENOMEM;
}

/*
 * After a failed tjDecompressHeader3() libjpeg-turbo 2.1 leaves the handle in
 * the middle of a header, and the next call would go on parsing the next
 * file from there: start over with a new handle.
 */
static int tj_reset(struct image_scratch *s)
{
	return tj_fresh(s) < 0 ? -ENOMEM : -EINVAL;
}

/* ---- probing ---- */

static const uint8_t png_sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int image_probe(struct image_scratch *s, const uint8_t *data, size_t len, struct image_info *info,
		char *err, size_t errlen)
{
	memset(info, 0, sizeof(*info));
	if (len == 0)
		return errfmt(-EINVAL, err, errlen, "empty file");
	if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
		/* 0: libjpeg-turbo 2.1's tjDecompressHeader3() returns 0 without
		 * setting them for a datastream that ends before a frame header
		 * (a "tables-only" one, an EOI, or EOF, which libjpeg takes for
		 * one), and they were read uninitialized: a size off the stack, a
		 * probe that came out differently from one call to the next
		 * (found by fuzz/fuzz-image.c; fuzz/regress/image/) */
		int w = 0, h = 0, subsamp = -1, cs = -1;

		if (tj_fresh(s) < 0)
			return errfmt(-ENOMEM, err, errlen, "out of memory for the JPEG decoder");
		if (len > (size_t)0xffffffffu)
			return errfmt(-EINVAL, err, errlen, "JPEG file too large");
		if (tjDecompressHeader3(s->tj, data, (unsigned long)len, &w, &h, &subsamp, &cs) < 0) {
			errfmt(-EINVAL, err, errlen, "bad JPEG header: %s", tjGetErrorStr2(s->tj));
			return tj_reset(s);
		}
		if (w < 1 || h < 1)
			return errfmt(-EINVAL, err, errlen, "bad JPEG header: no image (no frame "
				      "header before the end of the file)");
		info->format = IMAGE_JPEG;
		info->width = w;
		info->height = h;
		info->jpeg_colorspace = cs;
	} else if (len >= 8 && memcmp(data, png_sig, 8) == 0) {
		if (len < 33 || be32(data + 8) != 13 || memcmp(data + 12, "IHDR", 4) != 0)
			return errfmt(-EINVAL, err, errlen, "bad PNG file: no IHDR chunk");
		if (be32(data + 16) > 0x7fffffff || be32(data + 20) > 0x7fffffff)
			return errfmt(-EINVAL, err, errlen, "bad PNG file: invalid size");
		info->format = IMAGE_PNG;
		info->width = (int)be32(data + 16);
		info->height = (int)be32(data + 20);
	} else {
		return errfmt(-EINVAL, err, errlen, "not a JPEG or PNG image");
	}
	if (info->width < 1 || info->height < 1)
		return errfmt(-EINVAL, err, errlen, "bad image size %dx%d", info->width, info->height);
	if ((uint64_t)info->width * (uint64_t)info->height > IMAGE_MAX_PIXELS)
		return errfmt(-EINVAL, err, errlen, "image of %dx%d is larger than %u pixels",
			    info->width, info->height, IMAGE_MAX_PIXELS);
	return 0;
}

void image_scaled_size(const struct image_info *info, int num, int denom, int *w, int *h)
{
	*w = (int)(((int64_t)info->width * num + denom - 1) / denom);
	*h = (int)(((int64_t)info->height * num + denom - 1) / denom);
}

static pthread_once_t factors_once = PTHREAD_ONCE_INIT;
static tjscalingfactor *factors_table;
static int factors_n;

/* tjGetScalingFactors() returns a static table; read it once. */
static void factors_init(void)
{
	factors_table = tjGetScalingFactors(&factors_n);
	if (!factors_table)
		factors_n = 0;
}

void image_pick_scale(const struct image_info *info, int win_w, int win_h, int need_w, int need_h,
		      int *num, int *denom)
{
	int best_num = 1, best_denom = 1;

	*num = 1;
	*denom = 1;
	if (info->format != IMAGE_JPEG)
		return;
	pthread_once(&factors_once, factors_init);
	for (int i = 0; i < factors_n; i++) {
		int n = factors_table[i].num, d = factors_table[i].denom, sw, sh;

		/* at most 1/2: 5/8, 3/4 and 7/8 decode slower than the whole
		 * image (their IDCTs are libjpeg-turbo's scalar ones, the 8x8 one
		 * is SIMD, and they save too few pixels to pay for it; measured in
		 * docs/benchmarks.md, "DCT scales") */
		if (2 * n > d || (int64_t)n * best_denom >= (int64_t)best_num * d)
			continue;
		image_scaled_size(info, n, d, &sw, &sh);
		/* the window's share of the scaled image must cover need_w x need_h */
		if ((int64_t)sw * win_w >= (int64_t)need_w * info->width &&
		    (int64_t)sh * win_h >= (int64_t)need_h * info->height) {
			best_num = n;
			best_denom = d;
		}
	}
	*num = best_num;
	*denom = best_denom;
}

void image_draft_scale(const struct image_info *info, int need_w, int need_h, int *num,
		       int *denom)
{
	int sw, sh, scale;

	*num = 1;
	*denom = 1;
	if (info->format != IMAGE_JPEG || need_w < 1 || need_h < 1)
		return;
	/* Pillow's JpegImageFile.draft(): min(W // w, H // h), then 8, 4, 2 or 1 */
	sw = info->width / need_w;
	sh = info->height / need_h;
	scale = sw < sh ? sw : sh;
	for (int s = 8; s > 1; s /= 2) {
		if (scale >= s) {
			*denom = s;
			return;
		}
	}
}

/* ---- JPEG ---- */

static inline uint8_t muldiv255(int a, int b)
{
	int t = a * b + 128;

	return (uint8_t)(((t >> 8) + t) >> 8);
}

/* In place, 4 bytes a pixel to 3, as PIL does it: CMYK;I (Adobe) then
 * cmyk2rgb, nk - nk * c / 255. */
static void cmyk_to_rgb(uint8_t *pix, size_t px)
{
	const uint8_t *in = pix;
	uint8_t *out = pix;

	for (size_t i = 0; i < px; i++, in += 4, out += 3) {
		int nk = in[3];

		out[0] = (uint8_t)(nk - muldiv255(255 - in[0], nk));
		out[1] = (uint8_t)(nk - muldiv255(255 - in[1], nk));
		out[2] = (uint8_t)(nk - muldiv255(255 - in[2], nk));
	}
}

static int jpeg_decode_region(struct image_scratch *s, const uint8_t *data, size_t len,
			      const struct image_info *info, int num, int denom, int x0, int y0,
			      int x1, int y1, struct image_region *got, char *err, size_t errlen);

static int jpeg_decode(struct image_scratch *s, const uint8_t *data, size_t len,
		       const struct image_info *info, int num, int denom, char *err, size_t errlen)
{
	bool cmyk = info->jpeg_colorspace == TJCS_CMYK || info->jpeg_colorspace == TJCS_YCCK;
	int w, h, pf = cmyk ? TJPF_CMYK : TJPF_RGB;
	size_t px;

	if (tj_fresh(s) < 0)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the JPEG decoder");
	image_scaled_size(info, num, denom, &w, &h);
	px = (size_t)w * (size_t)h;
	if (image_scratch_grow(&s->pix, &s->pix_cap, px * (cmyk ? 4 : 3)) < 0)
		return errfmt(-ENOMEM, err, errlen, "out of memory for a %dx%d image", w, h);
	if (tjDecompress2(s->tj, data, (unsigned long)len, s->pix, w, 0, h, pf,
			  TJFLAG_LIMITSCANS) < 0) {
		const char *msg = tjGetErrorStr2(s->tj);

		struct image_region got;

		/* A warning leaves a whole image; only a truncated one is refused. */
		if (tjGetErrorCode(s->tj) != TJERR_WARNING || strstr(msg, "Premature end")) {
			errfmt(-EINVAL, err, errlen, "JPEG: %s", msg);
			return tj_reset(s);
		}
		/*
		 * But once a warning was emitted, TurboJPEG reports every later
		 * error as a warning too (tjGetErrorCode() says TJERR_WARNING
		 * whenever one was seen), and a fatal one ("Huffman table 0x01
		 * was not defined" after "extraneous bytes") leaves the rest of
		 * s->pix as it was: the thread's previous image, or
		 * uninitialized memory, handed out as this sample (found by
		 * fuzz/fuzz-image.c; fuzz/regress/image/). Decode it again with
		 * the libjpeg API, whose error_exit tells the two apart: the
		 * whole image as a region is the same pixels (image.h), and a
		 * file that only warns costs this second decode, a clean one
		 * nothing.
		 */
		return jpeg_decode_region(s, data, len, info, num, denom, 0, 0, w, h, &got, err,
					  errlen);
	}
	if (cmyk)
		cmyk_to_rgb(s->pix, px);
	return 0;
}

/* ---- JPEG regions (libjpeg API) ---- */

/*
 * libjpeg reports errors through error_exit(), which must not return: it
 * longjmps back into image_decode_region(). Everything that call allocates
 * belongs to the decompressor kept in the scratch, so nothing leaks; after an
 * error jpeg_abort_decompress() makes it reusable (as TurboJPEG does).
 * Warnings are tolerated except a premature end of file, as in
 * jpeg_decode(); the scan limit is TurboJPEG's TJFLAG_LIMITSCANS.
 */
#define JDEC_MAX_SCANS 500

struct jdec {
	struct jpeg_decompress_struct d;
	struct jpeg_error_mgr e;
	struct jpeg_progress_mgr prog;
	jmp_buf jb;
	bool eof;                     /* JWRN_JPEG_EOF seen */
	char msg[JMSG_LENGTH_MAX];
	char eof_msg[JMSG_LENGTH_MAX];
};

static int roi_on = 1;

void image_set_roi(int on)
{
	roi_on = on;
}

static void jdec_error_exit(j_common_ptr c)
{
	struct jdec *j = (struct jdec *)c->client_data;

	c->err->format_message(c, j->msg);
	longjmp(j->jb, 1);
}

static void jdec_emit_message(j_common_ptr c, int level)
{
	struct jdec *j = (struct jdec *)c->client_data;

	if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF && !j->eof) {
		j->eof = true;
		c->err->format_message(c, j->eof_msg);
	}
}

static void jdec_output_message(j_common_ptr c)
{
}

static void jdec_progress(j_common_ptr c)
{
	struct jdec *j = (struct jdec *)c->client_data;

	if (j->d.input_scan_number > JDEC_MAX_SCANS) {
		snprintf(j->msg, sizeof(j->msg), "Progressive JPEG image has more than %d scans",
			 JDEC_MAX_SCANS);
		longjmp(j->jb, 1);
	}
}

static void jdec_free(void *p)
{
	struct jdec *j = p;

	if (!j)
		return;
	jpeg_destroy_decompress(&j->d);
	free(j);
}

static struct jdec *jdec_get(struct image_scratch *s)
{
	/* volatile: live across the setjmp below (-Wclobbered) */
	struct jdec *volatile j = s->dj;

	if (j)
		return j;
	j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->d.err = jpeg_std_error(&j->e);
	j->e.error_exit = jdec_error_exit;
	j->e.emit_message = jdec_emit_message;
	j->e.output_message = jdec_output_message;
	j->d.client_data = j;
	if (setjmp(j->jb)) {
		free(j); /* jpeg_create_decompress() failed: out of memory */
		return NULL;
	}
	jpeg_create_decompress(&j->d);
	j->prog.progress_monitor = jdec_progress;
	s->dj = j;
	return j;
}

/* Whether an EOI marker (FF D9) lies in the @n bytes at @p. */
static bool has_eoi(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i + 1 < n; i++) {
		const uint8_t *q = memchr(p + i, 0xff, n - 1 - i);

		if (!q)
			return false;
		i = (size_t)(q - p);
		if (q[1] == 0xd9)
			return true;
	}
	return false;
}

/* The decode itself: libjpeg errors longjmp out of it to jpeg_decode_region(). */
static int jpeg_region_body(struct image_scratch *s, struct jdec *j, const uint8_t *data,
			    size_t len, const struct image_info *info, int num, int denom, int x0,
			    int y0, int x1, int y1, struct image_region *got, char *err,
			    size_t errlen)
{
	bool cmyk = info->jpeg_colorspace == TJCS_CMYK || info->jpeg_colorspace == TJCS_YCCK;
	j_decompress_ptr d = &j->d;
	JDIMENSION xo, cw, W, H, ys, align, valign, mx, my;
	size_t stride, px;

	jpeg_mem_src(d, data, (unsigned long)len);
	d->progress = &j->prog;
	jpeg_read_header(d, TRUE);
	if ((int)d->image_width != info->width || (int)d->image_height != info->height) {
		snprintf(j->msg, sizeof(j->msg), "size changed between probe and decode");
		longjmp(j->jb, 1);
	}
	d->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
	d->scale_num = (unsigned)num;
	d->scale_denom = (unsigned)denom;
	d->dct_method = JDCT_ISLOW;
	d->do_fancy_upsampling = TRUE;
	jpeg_start_decompress(d);
	W = d->output_width;
	H = d->output_height;
	if (x0 < 0)
		x0 = 0;
	if (y0 < 0)
		y0 = 0;
	if (x1 > (int)W)
		x1 = (int)W;
	if (y1 > (int)H)
		y1 = (int)H;
	if (x1 <= x0 || y1 <= y0) {
		snprintf(j->msg, sizeof(j->msg), "empty decoding window");
		longjmp(j->jb, 1);
	}
	/* as jpeg_crop_scanline() aligns: the iMCU's width in output pixels */
	if (d->comps_in_scan == 1 && d->num_components == 1)
		align = (JDIMENSION)MIN_DCT_H_SIZE(d);
	else
		align = (JDIMENSION)MIN_DCT_H_SIZE(d) * (JDIMENSION)d->max_h_samp_factor;
	valign = (JDIMENSION)MIN_DCT_V_SIZE(d) * (JDIMENSION)d->max_v_samp_factor;
	/*
	 * The margins: a subsampled chroma sample covers up to align / 8
	 * output pixels (valign / 8 rows), and fancy upsampling reads one
	 * chroma sample each side; the pixels within a chroma sample of the
	 * decoded region's edge (left, right, and the first rows after a skip)
	 * may differ from a whole decode. Two chroma samples and a pixel more
	 * keep the window exact (test-image checks thousands of windows);
	 * jpeg_crop_scanline() widens to whole iMCU columns on the left anyway.
	 */
	mx = 2 * ((align + 7) / 8) + 1;
	my = 2 * ((valign + 7) / 8) + 1;
	/*
	 * A progressive file whose scans leave coefficients out (a corrupt
	 * or truncated scan) gets libjpeg's block smoothing, which estimates
	 * them from the neighbouring blocks, two each side; a cropped decode
	 * takes its left and right edge for the image's and smooths the
	 * blocks there differently (found by fuzz/fuzz-image.c;
	 * fuzz/regress/image/). Two iMCUs more each side keep them out of
	 * the window; rows skipped above still have their coefficients.
	 */
	if (d->progressive_mode)
		mx += 2 * align;
	xo = (JDIMENSION)x0 > mx ? (JDIMENSION)x0 - mx : 0;
	cw = ((JDIMENSION)x1 + mx < W ? (JDIMENSION)x1 + mx : W) - xo;
	if (xo > 0 || cw < W)
		jpeg_crop_scanline(d, &xo, &cw);
	else
		xo = 0, cw = W;
	ys = (JDIMENSION)y0 > my ? (JDIMENSION)y0 - my : 0;
	if (ys > 0)
		jpeg_skip_scanlines(d, ys);
	ys = d->output_scanline;
	stride = (size_t)cw * (cmyk ? 4 : 3);
	px = (size_t)cw * (size_t)((JDIMENSION)y1 - ys);
	if (image_scratch_grow(&s->pix, &s->pix_cap, px * (cmyk ? 4 : 3) + 16) < 0) {
		snprintf(j->msg, sizeof(j->msg), "out of memory for a %ux%u image", cw,
			 (unsigned)y1 - ys);
		jpeg_abort_decompress(d);
		return errfmt(-ENOMEM, err, errlen, "%s", j->msg);
	}
	while (d->output_scanline < (JDIMENSION)y1) {
		JSAMPROW rows[16];
		JDIMENSION n = (JDIMENSION)y1 - d->output_scanline;

		if (n > 16)
			n = 16;
		for (JDIMENSION i = 0; i < n; i++)
			rows[i] = s->pix + (size_t)(d->output_scanline - ys + i) * stride;
		jpeg_read_scanlines(d, rows, n);
	}
	if ((JDIMENSION)y1 < H) {
		/*
		 * Stopped early. A full decode reads on to the EOI marker and
		 * refuses a file without one: so do the same here. Markers
		 * cannot occur in entropy-coded data (0xff is stuffed), so an
		 * FF D9 from the two bytes before the decoder's position on is
		 * the EOI (just consumed, with a progressive file, or ahead).
		 */
		const uint8_t *p = d->src->next_input_byte;
		size_t left = d->src->bytes_in_buffer;

		if (!j->eof && p >= data && p <= data + len) {
			size_t back = (size_t)(p - data) < 2 ? (size_t)(p - data) : 2;

			if (!has_eoi(p - back, left + back)) {
				j->eof = true;
				snprintf(j->eof_msg, sizeof(j->eof_msg), "Premature end of JPEG file");
			}
		}
		jpeg_abort_decompress(d);
	} else {
		jpeg_finish_decompress(d);
	}
	if (j->eof)
		return errfmt(-EINVAL, err, errlen, "JPEG: %s", j->eof_msg);
	if (cmyk)
		cmyk_to_rgb(s->pix, px);
	got->x = (int)xo;
	got->y = (int)ys;
	got->w = (int)cw;
	got->h = y1 - (int)ys;
	return 0;
}

/* A new decompressor for every file, that no table of the thread's previous
 * file is used for this one (tj_fresh()). */
static void jdec_renew(struct image_scratch *s)
{
	jdec_free(s->dj);
	s->dj = NULL;
}

static int jpeg_decode_region(struct image_scratch *s, const uint8_t *data, size_t len,
			      const struct image_info *info, int num, int denom, int x0, int y0,
			      int x1, int y1, struct image_region *got, char *err, size_t errlen)
{
	struct jdec *j = (jdec_renew(s), jdec_get(s));

	if (!j)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the JPEG decoder");
	j->eof = false;
	j->msg[0] = '\0';
	if (setjmp(j->jb)) {
		jpeg_abort_decompress(&j->d);
		return errfmt(-EINVAL, err, errlen, "JPEG: %s", j->msg);
	}
	return jpeg_region_body(s, j, data, len, info, num, denom, x0, y0, x1, y1, got, err,
				errlen);
}

int image_decode_region(struct image_scratch *s, const uint8_t *data, size_t len,
			const struct image_info *info, int num, int denom, int x0, int y0, int x1,
			int y1, struct image_region *got, char *err, size_t errlen)
{
	int w, h;

	if (info->format == IMAGE_JPEG && roi_on) {
		if (len > (size_t)0xffffffffu)
			return errfmt(-EINVAL, err, errlen, "JPEG file too large");
		return jpeg_decode_region(s, data, len, info, num, denom, x0, y0, x1, y1, got, err,
					  errlen);
	}
	image_scaled_size(info, num, denom, &w, &h);
	got->x = got->y = 0;
	got->w = w;
	got->h = h;
	return image_decode(s, data, len, info, num, denom, err, errlen);
}

/* ---- PNG ---- */

struct png_state {
	const uint8_t *data;
	size_t len, pos;
	char msg[200];
};

static void png_read_cb(png_structp png, png_bytep out, size_t n)
{
	struct png_state *st = png_get_io_ptr(png);

	if (n > st->len - st->pos)
		png_error(png, "truncated file");
	memcpy(out, st->data + st->pos, n);
	st->pos += n;
}

static void png_error_cb(png_structp png, png_const_charp msg)
{
	struct png_state *st = png_get_error_ptr(png);

	snprintf(st->msg, sizeof(st->msg), "%s", msg);
	png_longjmp(png, 1);
}

static void png_warning_cb(png_structp png, png_const_charp msg)
{
}

static int png_decode(struct image_scratch *s, const uint8_t *data, size_t len,
		      const struct image_info *info, char *err, size_t errlen)
{
	struct png_state st = { .data = data, .len = len };
	png_structp png;
	png_infop pinfo;
	png_bytep *volatile rows = NULL;
	png_uint_32 w, h;
	int depth, color;
	size_t stride;

	png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &st, png_error_cb, png_warning_cb);
	if (!png)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the PNG decoder");
	pinfo = png_create_info_struct(png);
	if (!pinfo) {
		png_destroy_read_struct(&png, NULL, NULL);
		return errfmt(-ENOMEM, err, errlen, "out of memory for the PNG decoder");
	}
	if (setjmp(png_jmpbuf(png))) {
		free(rows);
		png_destroy_read_struct(&png, &pinfo, NULL);
		return errfmt(-EINVAL, err, errlen, "PNG: %s", st.msg[0] ? st.msg : "decoding failed");
	}
	png_set_read_fn(png, &st, png_read_cb);
	png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
	png_read_info(png, pinfo);
	w = png_get_image_width(png, pinfo);
	h = png_get_image_height(png, pinfo);
	depth = png_get_bit_depth(png, pinfo);
	color = png_get_color_type(png, pinfo);
	if ((int)w != info->width || (int)h != info->height)
		png_error(png, "size changed between probe and decode");
	if (color == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if ((color & PNG_COLOR_MASK_COLOR) == 0 && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png);
	if (depth == 16)
		png_set_strip_16(png);
	png_set_strip_alpha(png);
	if ((color & PNG_COLOR_MASK_COLOR) == 0)
		png_set_gray_to_rgb(png);
	png_set_interlace_handling(png);
	png_read_update_info(png, pinfo);
	stride = (size_t)w * 3;
	if (png_get_rowbytes(png, pinfo) != stride || png_get_channels(png, pinfo) != 3 ||
	    png_get_bit_depth(png, pinfo) != 8)
		png_error(png, "unsupported pixel layout");
	if (image_scratch_grow(&s->pix, &s->pix_cap, stride * h) < 0)
		png_error(png, "out of memory");
	rows = malloc(h * sizeof(*rows));
	if (!rows)
		png_error(png, "out of memory");
	for (png_uint_32 y = 0; y < h; y++)
		rows[y] = s->pix + y * stride;
	png_read_image(png, rows);
	free(rows);
	png_destroy_read_struct(&png, &pinfo, NULL);
	return 0;
}

int image_decode(struct image_scratch *s, const uint8_t *data, size_t len,
		 const struct image_info *info, int num, int denom, char *err, size_t errlen)
{
	if (info->format == IMAGE_JPEG)
		return jpeg_decode(s, data, len, info, num, denom, err, errlen);
	if (num != denom)
		return errfmt(-EINVAL, err, errlen, "PNG cannot be decoded scaled");
	return png_decode(s, data, len, info, err, errlen);
}
