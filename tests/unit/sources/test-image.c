/* SPDX-License-Identifier: MIT */
/* test-image - decoding, transforms, tar indexing and image sources */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <jpeglib.h>

#include "brace.h"
#include "image.h"
#include "imagecache.h"
#include "imageop.h"
#include "image-golden.h"
#include "imageset.h"
#include "source.h"
#include "spec.h"
#include "tar.h"

static char dir[] = "/tmp/ldr-img-XXXXXX";
static char err[512];

static const char *path_of(const char *name)
{
	static char buf[8][512];
	static int i;

	i = (i + 1) % 8;
	snprintf(buf[i], sizeof(buf[i]), "%s/%s", dir, name);
	return buf[i];
}

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert(fd >= 0);
	assert(len == 0 || write(fd, data, len) == (ssize_t)len);
	close(fd);
}

/* A smooth RGB (or CMYK) test pattern with some edges. */
static unsigned char *pattern(int w, int h, int ch, unsigned seed)
{
	unsigned char *p = malloc((size_t)w * h * ch);

	for (int y = 0; y < h; y++)
		for (int x = 0; x < w; x++)
			for (int c = 0; c < ch; c++) {
				int v = (x * (3 + c) + y * (5 - c) + (int)seed * 17) & 0xff;

				if (((x / 7) ^ (y / 5)) & 1)
					v = 255 - v;
				p[((size_t)y * w + x) * ch + c] = (unsigned char)v;
			}
	return p;
}

static unsigned char *jpeg_encode(int w, int h, int pf, int subsamp, int flags, unsigned long *len)
{
	tjhandle tj = tjInitCompress();
	unsigned char *src = pattern(w, h, tjPixelSize[pf], (unsigned)w), *out = NULL;

	assert(tj);
	assert(tjCompress2(tj, src, w, 0, h, pf, &out, len, subsamp, 90, flags) == 0);
	tjDestroy(tj);
	free(src);
	return out;
}

/* Our decode equals TurboJPEG's own decode of the same file, bit for bit. */
static void check_jpeg_exact(const unsigned char *jpg, unsigned long len, int num, int denom)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	tjhandle tj = tjInitDecompress();
	int w, h, ss, cs, sw, sh;
	unsigned char *ref;

	assert(s && tj);
	assert(image_probe(s, jpg, len, &info, err, sizeof(err)) == 0);
	assert(tjDecompressHeader3(tj, jpg, len, &w, &h, &ss, &cs) == 0);
	assert(info.format == IMAGE_JPEG && info.width == w && info.height == h);
	assert(image_decode(s, jpg, len, &info, num, denom, err, sizeof(err)) == 0);
	image_scaled_size(&info, num, denom, &sw, &sh);
	assert(sw == TJSCALED(w, ((tjscalingfactor){ num, denom })));
	if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
		ref = malloc((size_t)sw * sh * 4);
		assert(tjDecompress2(tj, jpg, len, ref, sw, 0, sh, TJPF_CMYK, 0) == 0);
		for (size_t i = 0; i < (size_t)sw * sh; i++) {
			int k = ref[4 * i + 3];

			for (int c = 0; c < 3; c++) {
				int t = (255 - ref[4 * i + c]) * k + 128;
				int want = k - (((t >> 8) + t) >> 8);

				assert(s->pix[3 * i + c] == want);
			}
		}
	} else {
		ref = malloc((size_t)sw * sh * 3);
		assert(tjDecompress2(tj, jpg, len, ref, sw, 0, sh, TJPF_RGB, 0) == 0);
		assert(memcmp(ref, s->pix, (size_t)sw * sh * 3) == 0);
	}
	free(ref);
	tjDestroy(tj);
}

static void test_jpeg(void)
{
	static const int subsamps[] = { TJSAMP_444, TJSAMP_420, TJSAMP_422 };
	unsigned long len;
	unsigned char *jpg;

	for (size_t i = 0; i < 3; i++) {
		for (int prog = 0; prog < 2; prog++) {
			jpg = jpeg_encode(67, 45, TJPF_RGB, subsamps[i], prog ? TJFLAG_PROGRESSIVE : 0,
					  &len);
			check_jpeg_exact(jpg, len, 1, 1);
			check_jpeg_exact(jpg, len, 1, 2);
			check_jpeg_exact(jpg, len, 3, 8);
			check_jpeg_exact(jpg, len, 1, 8);
			tjFree(jpg);
		}
	}
	jpg = jpeg_encode(40, 33, TJPF_GRAY, TJSAMP_GRAY, 0, &len);
	check_jpeg_exact(jpg, len, 1, 1);
	tjFree(jpg);
	jpg = jpeg_encode(40, 33, TJPF_CMYK, TJSAMP_444, 0, &len);
	check_jpeg_exact(jpg, len, 1, 1);
	tjFree(jpg);
}

/* The DCT scale keeps the window at least as large as the target. */
static void test_pick_scale(void)
{
	struct image_info info = { .format = IMAGE_JPEG, .width = 1000, .height = 800 };
	int num, denom;

	image_pick_scale(&info, 1000, 800, 224, 224, &num, &denom);
	assert(num * 8 == denom * 2); /* 1/4: 250x200 >= 224? no: 200 < 224 */
	(void)0;
}

static void test_pick_scale_real(void)
{
	struct image_info info = { .format = IMAGE_JPEG, .width = 1000, .height = 800 };
	int num, denom, sw, sh;

	image_pick_scale(&info, 1000, 800, 224, 224, &num, &denom);
	image_scaled_size(&info, num, denom, &sw, &sh);
	assert(sw >= 224 && sh >= 224);
	assert(num * 2 <= denom); /* at most half size here */
	image_pick_scale(&info, 1000, 800, 1000, 800, &num, &denom);
	assert(num == 1 && denom == 1);
	image_pick_scale(&info, 100, 100, 224, 224, &num, &denom); /* upscaling */
	assert(num == 1 && denom == 1);
	/* 3/4 would keep 225 rows of 300, but 5/8..7/8 decode slower than 1/1 */
	info = (struct image_info){ .format = IMAGE_JPEG, .width = 500, .height = 375 };
	image_pick_scale(&info, 400, 300, 224, 224, &num, &denom);
	assert(num == 1 && denom == 1);
	image_pick_scale(&info, 500, 375, 180, 140, &num, &denom); /* 3/8: 188x141 */
	assert(num * 8 == denom * 3);
	info.format = IMAGE_PNG;
	image_pick_scale(&info, 1000, 800, 10, 10, &num, &denom);
	assert(num == 1 && denom == 1);
}

/* The decoded-image cache's reduction: Pillow's draft() rule exactly. */
static void test_draft_scale(void)
{
	static const struct { int w, h, nw, nh, denom; } cases[] = {
		{ 200, 150, 48, 36, 4 },   /* min(4, 4) */
		{ 200, 150, 70, 53, 2 },   /* min(2, 2): not 3/8, which keeps 75x57 */
		{ 200, 150, 99, 75, 2 },
		{ 200, 150, 101, 76, 1 },  /* 200 // 101 = 1 */
		{ 4000, 3000, 400, 300, 8 }, /* 10: 8 at most */
		{ 1000, 100, 100, 40, 2 }, /* the tighter side decides: min(10, 2) */
		{ 64, 64, 64, 64, 1 },
	};
	struct image_info info = { .format = IMAGE_JPEG };
	int num, denom;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		info.width = cases[i].w;
		info.height = cases[i].h;
		image_draft_scale(&info, cases[i].nw, cases[i].nh, &num, &denom);
		assert(num == 1 && denom == cases[i].denom);
	}
	info.format = IMAGE_PNG;
	image_draft_scale(&info, 48, 36, &num, &denom);
	assert(num == 1 && denom == 1);
}

/* libpng writing to memory */
struct membuf {
	unsigned char *p;
	size_t len, cap;
};

static void png_write_cb(png_structp png, png_bytep data, size_t n)
{
	struct membuf *m = png_get_io_ptr(png);

	if (m->len + n > m->cap) {
		m->cap = (m->len + n) * 2;
		m->p = realloc(m->p, m->cap);
	}
	memcpy(m->p + m->len, data, n);
	m->len += n;
}

static void png_flush_cb(png_structp png)
{
}

static struct membuf png_encode(int w, int h, int color, int depth)
{
	struct membuf m = { 0 };
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);
	int ch = color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGB_ALPHA ? 4 :
		 color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
	size_t rowbytes = (size_t)w * ch * (depth == 16 ? 2 : 1);
	unsigned char *pix = pattern((int)rowbytes, h, 1, 3);

	assert(!setjmp(png_jmpbuf(png)));
	png_set_write_fn(png, &m, png_write_cb, png_flush_cb);
	png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color, PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	for (int y = 0; y < h; y++)
		png_write_row(png, pix + (size_t)y * rowbytes);
	png_write_end(png, NULL);
	png_destroy_write_struct(&png, &info);
	free(pix);
	return m;
}

static void test_png(void)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	struct membuf m;

	/* RGB 8-bit: the pixels come back as written */
	m = png_encode(31, 17, PNG_COLOR_TYPE_RGB, 8);
	assert(image_probe(s, m.p, m.len, &info, err, sizeof(err)) == 0);
	assert(info.format == IMAGE_PNG && info.width == 31 && info.height == 17);
	assert(image_decode(s, m.p, m.len, &info, 1, 1, err, sizeof(err)) == 0);
	{
		unsigned char *want = pattern(31 * 3, 17, 1, 3);

		assert(memcmp(want, s->pix, 31 * 17 * 3) == 0);
		free(want);
	}
	/* RGBA 16-bit: alpha dropped, the high byte kept */
	free(m.p);
	m = png_encode(9, 5, PNG_COLOR_TYPE_RGB_ALPHA, 16);
	assert(image_probe(s, m.p, m.len, &info, err, sizeof(err)) == 0);
	assert(image_decode(s, m.p, m.len, &info, 1, 1, err, sizeof(err)) == 0);
	{
		unsigned char *raw = pattern(9 * 8, 5, 1, 3);

		for (int i = 0; i < 9 * 5; i++)
			for (int c = 0; c < 3; c++)
				assert(s->pix[3 * i + c] == raw[8 * i + 2 * c]);
		free(raw);
	}
	/* gray + alpha 8-bit: gray replicated */
	free(m.p);
	m = png_encode(6, 4, PNG_COLOR_TYPE_GRAY_ALPHA, 8);
	assert(image_probe(s, m.p, m.len, &info, err, sizeof(err)) == 0);
	assert(image_decode(s, m.p, m.len, &info, 1, 1, err, sizeof(err)) == 0);
	{
		unsigned char *raw = pattern(6 * 2, 4, 1, 3);

		for (int i = 0; i < 24; i++)
			for (int c = 0; c < 3; c++)
				assert(s->pix[3 * i + c] == raw[2 * i]);
		free(raw);
	}
	free(m.p);
}

/* Every truncation and some corruptions: an error or an image, never a crash. */
static void fuzz_one(const unsigned char *data, size_t len)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;

	if (image_probe(s, data, len, &info, err, sizeof(err)) == 0)
		(void)image_decode(s, data, len, &info, 1, 1, err, sizeof(err));
}

static void test_corrupt(void)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	unsigned long jlen;
	unsigned char *jpg = jpeg_encode(48, 40, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE, &jlen);
	struct membuf png = png_encode(40, 30, PNG_COLOR_TYPE_RGB, 8);
	unsigned char *copy = malloc(jlen > png.len ? jlen : png.len);
	unsigned seed = 1;

	assert(image_probe(s, jpg, 0, &info, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "empty file"));
	assert(image_probe(s, (const uint8_t *)"hello world", 11, &info, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "not a JPEG or PNG"));

	/* a truncated JPEG or PNG is an error */
	assert(image_probe(s, jpg, jlen - 40, &info, err, sizeof(err)) == 0);
	assert(image_decode(s, jpg, jlen - 40, &info, 1, 1, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "JPEG"));
	assert(image_probe(s, png.p, png.len - 30, &info, err, sizeof(err)) == 0);
	assert(image_decode(s, png.p, png.len - 30, &info, 1, 1, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "PNG"));

	for (size_t n = 0; n <= jlen; n += 7)
		fuzz_one(jpg, n);
	for (size_t n = 0; n <= png.len; n += 5)
		fuzz_one(png.p, n);
	for (int round = 0; round < 200; round++) {
		memcpy(copy, jpg, jlen);
		for (int k = 0; k < 4; k++) {
			seed = seed * 1103515245u + 12345u;
			copy[(seed >> 8) % jlen] ^= (unsigned char)(seed >> 20);
		}
		fuzz_one(copy, jlen);
		memcpy(copy, png.p, png.len);
		for (int k = 0; k < 4; k++) {
			seed = seed * 1103515245u + 12345u;
			copy[8 + (seed >> 8) % (png.len - 8)] ^= (unsigned char)(seed >> 20);
		}
		fuzz_one(copy, png.len);
	}
	free(copy);
	free(png.p);
	tjFree(jpg);
}

/* ---- region decoding ---- */

static struct spec *spec_of(const char *transforms, const char *extra);

static unsigned rnd(unsigned *st)
{
	*st = *st * 1103515245u + 12345u;
	return *st >> 8;
}

/* A JPEG with restart markers (libjpeg API: TurboJPEG 2.x has no option). */
static unsigned char *jpeg_encode_rst(int w, int h, int hs, int vs, int rst_mcus, int rst_rows,
				      unsigned long *len)
{
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr e;
	unsigned char *src = pattern(w, h, 3, 7), *out = NULL;

	c.err = jpeg_std_error(&e);
	jpeg_create_compress(&c);
	jpeg_mem_dest(&c, &out, len);
	c.image_width = (JDIMENSION)w;
	c.image_height = (JDIMENSION)h;
	c.input_components = 3;
	c.in_color_space = JCS_RGB;
	jpeg_set_defaults(&c);
	jpeg_set_quality(&c, 90, TRUE);
	c.comp_info[0].h_samp_factor = hs;
	c.comp_info[0].v_samp_factor = vs;
	c.restart_interval = (unsigned)rst_mcus;
	c.restart_in_rows = rst_rows;
	jpeg_start_compress(&c, TRUE);
	while (c.next_scanline < c.image_height) {
		JSAMPROW row = src + (size_t)c.next_scanline * w * 3;

		jpeg_write_scanlines(&c, &row, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	free(src);
	return out;
}

/* TurboJPEG's full decode at num/denom, as packed RGB (CMYK converted as PIL). */
static unsigned char *tj_full(const unsigned char *jpg, unsigned long len, int num, int denom,
			      int *sw, int *sh)
{
	tjhandle tj = tjInitDecompress();
	int w, h, ss, cs;
	unsigned char *ref;

	assert(tjDecompressHeader3(tj, jpg, len, &w, &h, &ss, &cs) == 0);
	*sw = TJSCALED(w, ((tjscalingfactor){ num, denom }));
	*sh = TJSCALED(h, ((tjscalingfactor){ num, denom }));
	ref = malloc((size_t)*sw * *sh * 4);
	if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
		assert(tjDecompress2(tj, jpg, len, ref, *sw, 0, *sh, TJPF_CMYK, 0) == 0);
		for (size_t i = 0; i < (size_t)*sw * *sh; i++) {
			int k = ref[4 * i + 3];

			for (int c = 0; c < 3; c++) {
				int t = (255 - ref[4 * i + c]) * k + 128;

				ref[3 * i + c] = (unsigned char)(k - (((t >> 8) + t) >> 8));
			}
		}
	} else {
		assert(tjDecompress2(tj, jpg, len, ref, *sw, 0, *sh, TJPF_RGB, 0) == 0);
	}
	tjDestroy(tj);
	return ref;
}

/*
 * image_decode_region() over @nwin random windows (and a few at the edges):
 * the window's pixels equal TurboJPEG's full decode at the same scale.
 */
static long check_region_exact(const char *what, const unsigned char *jpg, unsigned long len,
			       int num, int denom, int nwin, unsigned *st)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	struct image_region got;
	int sw, sh;
	unsigned char *ref = tj_full(jpg, len, num, denom, &sw, &sh);
	long bad = 0;

	assert(image_probe(s, jpg, len, &info, err, sizeof(err)) == 0);
	for (int k = 0; k < nwin; k++) {
		int x0, y0, x1, y1;

		if (k == 0) {
			x0 = y0 = 0, x1 = sw, y1 = sh;
		} else if (k == 1) {
			x0 = sw - 1, y0 = sh - 1, x1 = sw, y1 = sh;
		} else if (k == 2) {
			x0 = 0, y0 = 0, x1 = 1, y1 = 1;
		} else {
			x0 = (int)(rnd(st) % (unsigned)sw);
			y0 = (int)(rnd(st) % (unsigned)sh);
			x1 = x0 + 1 + (int)(rnd(st) % (unsigned)(sw - x0));
			y1 = y0 + 1 + (int)(rnd(st) % (unsigned)(sh - y0));
		}
		if (image_decode_region(s, jpg, len, &info, num, denom, x0, y0, x1, y1, &got, err,
					sizeof(err)) != 0) {
			fprintf(stderr, "%s: %s\n", what, err);
			abort();
		}
		assert(got.x <= x0 && got.y <= y0 && got.x + got.w >= x1 && got.y + got.h >= y1);
		for (int y = y0; y < y1; y++) {
			const unsigned char *a = ref + ((size_t)y * sw + x0) * 3;
			const unsigned char *b =
				s->pix + ((size_t)(y - got.y) * got.w + (x0 - got.x)) * 3;

			if (memcmp(a, b, (size_t)(x1 - x0) * 3) != 0) {
				if (!bad)
					fprintf(stderr,
						"%s %d/%d: window %d,%d-%d,%d differs at row %d "
						"(got %d,%d %dx%d)\n", what, num, denom, x0, y0,
						x1, y1, y, got.x, got.y, got.w, got.h);
				bad++;
				break;
			}
		}
	}
	free(ref);
	return bad;
}

static void test_region(void)
{
	static const struct { const char *name; int pf, ss, flags; } kinds[] = {
		{ "444", TJPF_RGB, TJSAMP_444, 0 },
		{ "420", TJPF_RGB, TJSAMP_420, 0 },
		{ "422", TJPF_RGB, TJSAMP_422, 0 },
		{ "440", TJPF_RGB, TJSAMP_440, 0 },
		{ "411", TJPF_RGB, TJSAMP_411, 0 },
		{ "gray", TJPF_GRAY, TJSAMP_GRAY, 0 },
		{ "420 progressive", TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE },
		{ "444 progressive", TJPF_RGB, TJSAMP_444, TJFLAG_PROGRESSIVE },
		{ "cmyk", TJPF_CMYK, TJSAMP_444, 0 },
		{ "cmyk 420", TJPF_CMYK, TJSAMP_420, 0 },
	};
	static const int sizes[][2] = { { 203, 157 }, { 64, 48 }, { 9, 300 }, { 250, 7 } };
	static const int scales[][2] = { { 1, 1 }, { 1, 2 }, { 3, 8 }, { 1, 8 }, { 7, 8 } };
	unsigned st = 99;
	long bad = 0, n = 0;

	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
			unsigned long len;
			unsigned char *jpg = jpeg_encode(sizes[z][0], sizes[z][1], kinds[i].pf,
							 kinds[i].ss, kinds[i].flags, &len);

			for (size_t c = 0; c < sizeof(scales) / sizeof(scales[0]); c++) {
				bad += check_region_exact(kinds[i].name, jpg, len, scales[c][0],
							  scales[c][1], c == 0 ? 120 : 40, &st);
				n += c == 0 ? 120 : 40;
			}
			tjFree(jpg);
		}
	}
	/* restart markers: every 3 MCUs, every MCU row; 4:2:0 and 4:2:2 */
	for (int k = 0; k < 4; k++) {
		unsigned long len = 0;
		unsigned char *jpg = jpeg_encode_rst(211, 163, 2, k < 2 ? 2 : 1, k % 2 ? 0 : 3,
						     k % 2, &len);

		for (size_t c = 0; c < sizeof(scales) / sizeof(scales[0]); c++) {
			bad += check_region_exact("restart", jpg, len, scales[c][0], scales[c][1],
						  c == 0 ? 120 : 40, &st);
			n += c == 0 ? 120 : 40;
		}
		free(jpg);
	}
	printf("test-image: %ld region decodes, %ld differ\n", n, bad);
	assert(bad == 0);
}

/* A truncated file is refused wherever the window lies; corrupt ones never crash. */
static void test_region_corrupt(void)
{
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	struct image_region got;
	unsigned long len, rlen = 0;
	unsigned char *jpg = jpeg_encode(203, 157, TJPF_RGB, TJSAMP_420, 0, &len);
	unsigned char *pjpg, *rjpg = jpeg_encode_rst(211, 163, 2, 2, 3, 0, &rlen);
	unsigned long plen;
	unsigned char *copy = malloc(len + 64);
	unsigned st = 5;

	pjpg = jpeg_encode(120, 90, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE, &plen);
	assert(image_probe(s, jpg, len, &info, err, sizeof(err)) == 0);
	/* the window in the first rows, the end of the file missing */
	assert(image_decode_region(s, jpg, len - 40, &info, 1, 1, 0, 0, 10, 10, &got, err,
				   sizeof(err)) == -EINVAL);
	assert(strstr(err, "JPEG: Premature end of JPEG file"));
	assert(image_decode_region(s, jpg, len - 2, &info, 1, 1, 50, 20, 60, 30, &got, err,
				   sizeof(err)) == -EINVAL);
	assert(strstr(err, "Premature end"));
	/* ... the window at the end: libjpeg's own warning */
	assert(image_decode_region(s, jpg, len - 40, &info, 1, 1, 190, 150, 203, 157, &got, err,
				   sizeof(err)) == -EINVAL);
	assert(strstr(err, "JPEG: Premature end of JPEG file"));
	/* the decoder is reusable after an error; trailing bytes after EOI are fine */
	memcpy(copy, jpg, len);
	memset(copy + len, 0xff, 64);
	assert(image_decode_region(s, copy, len + 64, &info, 1, 1, 0, 0, 10, 10, &got, err,
				   sizeof(err)) == 0);
	assert(image_decode_region(s, jpg, len, &info, 1, 2, 3, 4, 20, 20, &got, err,
				   sizeof(err)) == 0);
	/* progressive: the whole file is read before the first row */
	assert(image_probe(s, pjpg, plen, &info, err, sizeof(err)) == 0);
	assert(image_decode_region(s, pjpg, plen - 30, &info, 1, 1, 0, 0, 10, 10, &got, err,
				   sizeof(err)) == -EINVAL);
	assert(strstr(err, "Premature end"));
	assert(image_decode_region(s, pjpg, plen, &info, 1, 1, 0, 0, 10, 10, &got, err,
				   sizeof(err)) == 0);

	/* every truncation and random corruptions, random windows: never a crash */
	for (int f = 0; f < 3; f++) {
		const unsigned char *d = f == 0 ? jpg : f == 1 ? pjpg : rjpg;
		unsigned long n = f == 0 ? len : f == 1 ? plen : rlen;
		unsigned char *c = malloc(n);

		for (unsigned long cut = 0; cut <= n; cut += 5) {
			if (image_probe(s, d, cut, &info, err, sizeof(err)) == 0) {
				int x0 = (int)(rnd(&st) % (unsigned)info.width);
				int y0 = (int)(rnd(&st) % (unsigned)info.height);

				(void)image_decode_region(s, d, cut, &info, 1, 1 + (int)(rnd(&st) % 2),
							  x0 / 2, y0 / 2, x0 / 2 + 3, y0 / 2 + 3,
							  &got, err, sizeof(err));
			}
		}
		for (int round = 0; round < 300; round++) {
			memcpy(c, d, n);
			for (int k = 0; k < 4; k++) {
				unsigned r = rnd(&st);

				c[r % n] ^= (unsigned char)(r >> 12 | 1);
			}
			if (image_probe(s, c, n, &info, err, sizeof(err)) == 0) {
				int x0 = (int)(rnd(&st) % (unsigned)info.width);
				int y0 = (int)(rnd(&st) % (unsigned)info.height);

				(void)image_decode_region(s, c, n, &info, 1, 1, x0, y0,
							  x0 + 1 + (int)(rnd(&st) % 40),
							  y0 + 1 + (int)(rnd(&st) % 40), &got, err,
							  sizeof(err));
			}
		}
		free(c);
	}
	free(copy);
	free(rjpg);
	tjFree(pjpg);
	tjFree(jpg);
}

/* spec_of() of @transforms with DCT scaling on (@dct) or off. */
static struct spec *spec_dct(const char *transforms, int dct)
{
	return spec_of(transforms, dct ? "" : ", \"decode\": {\"dct_scaling\": false}");
}

/* imageop_decode_run() with region decoding equals a whole decode + imageop_run(). */
static void test_region_pipeline(void)
{
	static const char *const cases[] = {
		"[{\"op\": \"random_resized_crop\", \"size\": 40}, {\"op\": \"horizontal_flip\"}]",
		"[{\"op\": \"random_resized_crop\", \"size\": 224}, {\"op\": \"horizontal_flip\"}]",
		"[{\"op\": \"random_resized_crop\", \"size\": [12, 20], \"scale\": [0.3, 1.0]}]",
		"[{\"op\": \"resize\", \"size\": 20}, {\"op\": \"center_crop\", \"size\": 16}]",
		"[{\"op\": \"center_crop\", \"size\": [70, 45]}]",
		"[{\"op\": \"center_crop\", \"size\": 300}]",
		"[{\"op\": \"center_crop\", \"size\": 50}, {\"op\": \"resize\", \"size\": 11}]",
		"[{\"op\": \"resize\", \"size\": [33, 41]}, {\"op\": \"resize\", \"size\": 17}]",
	};
	static const struct { int pf, ss, flags; } kinds[] = {
		{ TJPF_RGB, TJSAMP_420, 0 }, { TJPF_RGB, TJSAMP_422, TJFLAG_PROGRESSIVE },
		{ TJPF_GRAY, TJSAMP_GRAY, 0 }, { TJPF_CMYK, TJSAMP_444, 0 },
	};
	struct image_scratch *s = image_scratch_get();
	long checked = 0;

	for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]) + 1; ki++) {
		unsigned long len;
		unsigned char *jpg = ki < 4 ? jpeg_encode(263, 187, kinds[ki].pf, kinds[ki].ss,
							   kinds[ki].flags, &len)
					    : jpeg_encode_rst(263, 187, 2, 2, 5, 0, &len);
		struct image_info info;

		assert(image_probe(s, jpg, len, &info, err, sizeof(err)) == 0);
		for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
			for (int dct = 0; dct < 2; dct++) {
				struct spec *spec = spec_dct(cases[ci], dct);
				struct imageop op;
				size_t outlen;
				float *a, *b;

				imageop_init(&op, spec);
				assert(op.dct_scaling == (dct == 1));
				outlen = (size_t)3 * op.out_h * op.out_w * sizeof(float);
				a = malloc(outlen);
				b = malloc(outlen);
				for (uint64_t key = 0; key < 25; key++) {
					struct imageop_plan plan;

					assert(imageop_plan(&op, info.width, info.height, key * 7919,
							    &plan, err, sizeof(err)) == 0);
					image_set_roi(1);
					assert(imageop_decode_run(&op, s, &plan, jpg, len, &info, a,
								  err, sizeof(err)) == 0);
					image_set_roi(0);
					assert(imageop_decode_run(&op, s, &plan, jpg, len, &info, b,
								  err, sizeof(err)) == 0);
					image_set_roi(1);
					if (memcmp(a, b, outlen) != 0) {
						fprintf(stderr, "case %zu kind %zu dct %d key %llu: "
							"region decode differs\n", ci, ki, dct,
							(unsigned long long)key);
						abort();
					}
					checked++;
				}
				free(a);
				free(b);
				spec_free(spec);
			}
		}
		if (ki < 4)
			tjFree(jpg);
		else
			free(jpg);
	}
	printf("test-image: %ld samples equal with and without region decoding\n", checked);
}

/*
 * imageop_decode_run_many() (augment seeds: one decode for several plans)
 * writes each plan's sample exactly as imageop_decode_run() alone does, with
 * DCT scaling on (plans at different scales: a decode each) and off (one).
 */
static void test_decode_many(void)
{
	static const char *const cases[] = {
		"[{\"op\": \"random_resized_crop\", \"size\": 40}, {\"op\": \"horizontal_flip\"}]",
		"[{\"op\": \"random_resized_crop\", \"size\": [12, 20], \"scale\": [0.05, 1.0]}]",
		"[{\"op\": \"resize\", \"size\": 20}, {\"op\": \"random_resized_crop\", \"size\": 16}]",
	};
	struct image_scratch *s = image_scratch_get();
	unsigned long len;
	unsigned char *jpg = jpeg_encode(263, 187, TJPF_RGB, TJSAMP_420, 0, &len);
	struct image_info info;
	long checked = 0, decodes_on = 0, plans_on = 0;

	assert(image_probe(s, jpg, len, &info, err, sizeof(err)) == 0);
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		for (int dct = 0; dct < 2; dct++) {
			struct spec *spec = spec_dct(cases[ci], dct);
			struct imageop op;
			struct imageop_plan plans[8];
			void *many[8];
			size_t outlen;
			uint8_t *one;

			imageop_init(&op, spec);
			outlen = (size_t)3 * op.out_h * op.out_w * sizeof(float);
			one = malloc(outlen);
			for (int i = 0; i < 8; i++)
				many[i] = malloc(outlen);
			for (uint64_t trial = 0; trial < 12; trial++) {
				size_t n = 1 + trial % 8;
				unsigned decodes;

				for (size_t i = 0; i < n; i++)
					assert(imageop_plan(&op, info.width, info.height,
							    imageop_key(trial * 31 + i, 3, 5), &plans[i],
							    err, sizeof(err)) == 0);
				assert(imageop_decode_run_many(&op, s, plans, n, jpg, len, &info, many,
							       &decodes, err, sizeof(err)) == 0);
				assert(decodes >= 1 && decodes <= n);
				if (!dct)
					assert(decodes == 1);
				else {
					decodes_on += decodes;
					plans_on += (long)n;
				}
				for (size_t i = 0; i < n; i++) {
					assert(imageop_decode_run(&op, s, &plans[i], jpg, len, &info, one,
								  err, sizeof(err)) == 0);
					if (memcmp(one, many[i], outlen) != 0) {
						fprintf(stderr, "case %zu dct %d trial %llu plan %zu of %zu: "
							"decode_run_many differs\n", ci, dct,
							(unsigned long long)trial, i, n);
						abort();
					}
					checked++;
				}
			}
			free(one);
			for (int i = 0; i < 8; i++)
				free(many[i]);
			spec_free(spec);
		}
	}
	tjFree(jpg);
	printf("test-image: %ld samples of several plans equal one plan's (DCT scaling on: %ld "
	       "decodes for %ld plans)\n", checked, decodes_on, plans_on);
}

/* ---- transforms ---- */

static struct spec *spec_of(const char *transforms, const char *extra)
{
	char text[2048];
	struct spec *spec;

	snprintf(text, sizeof(text),
		 "{\"name\": \"i\", \"source\": {\"kind\": \"image_folder\", \"path\": \"%s\"}, "
		 "\"transforms\": %s%s}", dir, transforms, extra);
	if (spec_parse(&spec, text, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		abort();
	}
	return spec;
}

static void test_plan(void)
{
	struct spec *spec;
	struct imageop op;
	struct imageop_plan a, b;

	/* center_crop: Python's round half to even, padding when larger */
	spec = spec_of("[{\"op\": \"center_crop\", \"size\": [7, 5]}]", "");
	imageop_init(&op, spec);
	assert(imageop_plan(&op, 10, 10, 0, &a, err, sizeof(err)) == 0);
	assert(a.n == 1 && !a.st[0].resized);
	assert(a.st[0].wy == 2 && a.st[0].wx == 2); /* round(1.5) = 2, round(2.5) = 2 */
	assert(imageop_plan(&op, 12, 8, 0, &a, err, sizeof(err)) == 0);
	assert(a.st[0].wy == 0 && a.st[0].wx == 4); /* round(0.5) = 0, round(3.5) = 4 */
	assert(imageop_plan(&op, 3, 4, 0, &a, err, sizeof(err)) == 0);
	assert(a.st[0].resized && a.st[0].oy == -1 && a.st[0].ox == -1); /* padded */
	spec_free(spec);

	/* resize + center_crop: one pass over the whole image */
	spec = spec_of("[{\"op\": \"resize\", \"size\": 8}, {\"op\": \"center_crop\", \"size\": 8}]",
		       "");
	imageop_init(&op, spec);
	assert(imageop_plan(&op, 20, 10, 0, &a, err, sizeof(err)) == 0);
	assert(a.n == 1 && a.st[0].resized && a.st[0].tw == 16 && a.st[0].th == 8);
	assert(a.st[0].ox == 4 && a.st[0].ow == 8 && a.st[0].oh == 8);
	spec_free(spec);

	/* resize after resize: two stages */
	spec = spec_of("[{\"op\": \"resize\", \"size\": [30, 40]}, {\"op\": \"resize\", \"size\": [6, 7]}]",
		       "");
	imageop_init(&op, spec);
	assert(imageop_plan(&op, 100, 50, 0, &a, err, sizeof(err)) == 0);
	assert(a.n == 2 && a.st[1].in_w == 40 && a.st[1].in_h == 30 && a.st[1].tw == 7);
	spec_free(spec);

	/* random crops depend on (seed, epoch, index) only */
	spec = spec_of("[{\"op\": \"random_resized_crop\", \"size\": 16}, "
		       "{\"op\": \"horizontal_flip\"}]", "");
	imageop_init(&op, spec);
	int differ = 0, flips = 0;
	for (uint64_t i = 0; i < 200; i++) {
		assert(imageop_plan(&op, 64, 48, imageop_key(7, 1, i), &a, err, sizeof(err)) == 0);
		assert(imageop_plan(&op, 64, 48, imageop_key(7, 1, i), &b, err, sizeof(err)) == 0);
		assert(memcmp(&a.st[0], &b.st[0], sizeof(a.st[0])) == 0);
		assert(a.st[0].wx >= 0 && a.st[0].wx + a.st[0].ww <= 64);
		assert(a.st[0].wy >= 0 && a.st[0].wy + a.st[0].wh <= 48);
		assert(a.st[0].tw == 16 && a.st[0].th == 16);
		flips += a.st[0].flip;
		assert(imageop_plan(&op, 64, 48, imageop_key(7, 2, i), &b, err, sizeof(err)) == 0);
		differ += memcmp(&a.st[0], &b.st[0], sizeof(a.st[0])) != 0;
	}
	assert(differ > 190);
	assert(flips > 70 && flips < 130);
	spec_free(spec);

	/* f16 / bf16 conversions: round to nearest even */
	assert(imageop_f32_to_f16(1.0f) == 0x3c00);
	assert(imageop_f32_to_f16(-2.0f) == 0xc000);
	assert(imageop_f32_to_f16(65504.0f) == 0x7bff);
	assert(imageop_f32_to_f16(1e6f) == 0x7c00);
	assert(imageop_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);     /* tie: to even */
	assert(imageop_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
	assert(imageop_f32_to_f16(0x1p-24f) == 0x0001);            /* subnormal */
	assert(imageop_f32_to_bf16(1.0f) == 0x3f80);
	assert(imageop_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie: to even */
	assert(imageop_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-16f) == 0x3f81);
}

/* ---- resampling: the fast kernels against PIL's plain algorithm ---- */

/*
 * The resampler as first written (commit 2a04ebc), a line-by-line port of
 * PIL's ImagingResample for 8-bit images, kept here as the reference: the
 * daemon's kernels rearrange the work (fixed tap counts, SIMD) and must give
 * the same bytes.
 */
#define PRECISION_BITS (32 - 8 - 2)

static int ref_fail(int r, char *e, size_t elen, const char *fmt, ...)
{
	(void)e, (void)elen, (void)fmt;
	return r;
}

static inline double ref_bilinear(double x)
{
	if (x < 0.0)
		x = -x;
	return x < 1.0 ? 1.0 - x : 0.0;
}

static int ref_ksize_of(int in_size_window, double in0, double in1, int out_size)
{
	double scale = (in1 - in0) / out_size;
	double support = scale < 1.0 ? 1.0 : scale;

	(void)in_size_window;
	return (int)ceil(support) * 2 + 1;
}

/*
 * PIL's precompute_ref_coeffs() and normalize_coeffs_8bpc() for the target
 * positions [first, first + count); positions outside [0, out_size) get
 * bounds {0, -1}: padding.
 */
static void ref_coeffs(int in_size, double in0, double in1, int out_size, int first, int count,
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
			ww += ref_bilinear((x + xmin - center + 0.5) * ss);
		for (int x = 0; x < xmax; x++) {
			double w = ref_bilinear((x + xmin - center + 0.5) * ss);
			double v = ww != 0.0 ? w / ww : w;

			k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
				     : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
		}
		bounds[2 * c] = xmin;
		bounds[2 * c + 1] = xmax;
	}
}

static inline uint8_t ref_clip8(int32_t in)
{
	if (in >= (1 << PRECISION_BITS << 8))
		return 255;
	if (in <= 0)
		return 0;
	return (uint8_t)(in >> PRECISION_BITS);
}

/* Where a stage writes its rows: the next stage's input, or the sample. */
struct ref_sink {
	const struct imageop *op;
	bool final;
	uint8_t *buf;                 /* !final: packed RGB, ow x oh */
	void *dst;                    /* final: the sample in the slot */
	int ow, oh;
};

static void ref_sink_row(const struct ref_sink *k, int y, const uint8_t *row, bool flip)
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
	{
		uint8_t *d = (uint8_t *)k->dst + (size_t)y * w * 3;

		(void)op;
		(void)plane;
		for (int x = 0; x < w; x++)
			memcpy(d + 3 * x, row + 3 * (flip ? w - 1 - x : x), 3);
	}
}

/*
 * Run one stage: the window [lo_x, lo_x + in_w) x [lo_y, lo_y + in_h) of
 * @src, whose box in0..in1 (relative to the window) maps onto the target.
 */
static int ref_stage_run(struct image_scratch *s, const struct imageop_stage *st, const uint8_t *src,
		     size_t stride, int lo_x, int lo_y, int in_w, int in_h, double in0x, double in1x,
		     double in0y, double in1y, const struct ref_sink *sink)
{
	int ow = st->ow, oh = st->oh;
	bool need_h = st->tw != in_w || in0x != 0.0 || in1x != (double)in_w;
	bool need_v = st->th != in_h || in0y != 0.0 || in1y != (double)in_h;
	int ksx = need_h ? ref_ksize_of(in_w, in0x, in1x, st->tw) : 1;
	int ksy = need_v ? ref_ksize_of(in_h, in0y, in1y, st->th) : 1;
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
		ref_coeffs(in_w, in0x, in1x, st->tw, st->ox, ow, ksx, bx, kx);
	} else {
		for (int c = 0; c < ow; c++) {
			int tx = st->ox + c;

			bx[2 * c] = tx;
			bx[2 * c + 1] = tx >= 0 && tx < st->tw ? 1 : -1;
			kx[c] = 1 << PRECISION_BITS;
		}
	}
	if (need_v) {
		ref_coeffs(in_h, in0y, in1y, st->th, st->oy, oh, ksy, by, ky);
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
				out[3 * c] = ref_clip8(s0);
				out[3 * c + 1] = ref_clip8(s1);
				out[3 * c + 2] = ref_clip8(s2);
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
				row[e] = ref_clip8(acc[e]);
		}
		ref_sink_row(sink, r, row, st->flip);
	}
	return 0;
}

static int ref_imageop_run(const struct imageop *op, struct image_scratch *s, const struct imageop_plan *plan,
		const uint8_t *pix, int pw, int ph, void *dst, char *e, size_t elen)
{
	const uint8_t *src = pix;
	int sw = pw, sh = ph;

	for (int i = 0; i < plan->n; i++) {
		const struct imageop_stage *st = &plan->st[i];
		struct ref_sink sink = { .op = op, .final = i == plan->n - 1, .dst = dst,
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
				return ref_fail(-ENOMEM, e, elen, "out of memory for a %dx%d image",
					    st->ow, st->oh);
			sink.buf = *b;
		}
		r = ref_stage_run(s, st, src, (size_t)sw * 3, lo_x, lo_y, in_w, in_h, in0x, in1x, in0y,
			      in1y, &sink);
		if (r < 0)
			return ref_fail(r, e, elen, "out of memory resampling to %dx%d", st->ow,
				    st->oh);
		src = sink.buf;
		sw = st->ow;
		sh = st->oh;
	}
	return 0;
}

/*
 * float32 NCHW: the SIMD kernel (when imageop_init() found it exact for the
 * pipeline's mean and std) writes the table's values, at every width (the
 * 8-pixel blocks and the tail), flipped or not, into aligned (non-temporal
 * stores, 32 or 64 bytes) and unaligned rows alike.
 */
static void test_f32_kernel(void)
{
	static const char *const norms[] = {
		"",
		", {\"op\": \"normalize\", \"mean\": [0.485, 0.456, 0.406], \"std\": [0.229, 0.224, 0.225]}",
		", {\"op\": \"normalize\", \"mean\": [0.5, 0.5, 0.5], \"std\": [0.5, 0.5, 0.5]}",
		", {\"op\": \"normalize\", \"mean\": [0.1, -3.7, 100], \"std\": [0.0123, 7.1, 3.3e-3]}",
	};
	struct image_scratch *s = image_scratch_get();
	unsigned rng = 99;
	int simd = 0, total = 0;

	for (size_t ni = 0; ni < sizeof(norms) / sizeof(norms[0]); ni++) {
		static const int widths[] = { 1, 2, 3, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 31, 32,
					      33, 47, 48, 64, 100, 224 };

		for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
			int ow = widths[wi];
			char tf[512];
			struct spec *spec;
			struct imageop op;
			size_t n;
			uint8_t *pix;
			float *a, *b;

			snprintf(tf, sizeof(tf),
				 "[{\"op\": \"random_resized_crop\", \"size\": [5, %d]}, "
				 "{\"op\": \"horizontal_flip\"}%s]", ow, norms[ni]);
			spec = spec_of(tf, ", \"output\": {\"dtype\": \"float32\", \"layout\": \"NCHW\"}");
			imageop_init(&op, spec);
			simd += op.f32_simd;
			total++;
			n = (size_t)3 * 5 * ow;
			/* a size that is a multiple of the alignment, as C11 wants */
			a = aligned_alloc(64, (n + 16 + 15) / 16 * 16 * sizeof(float));
			b = aligned_alloc(64, (n + 16 + 15) / 16 * 16 * sizeof(float));
			pix = malloc(300 * 50 * 3);
			for (int i = 0; i < 300 * 50 * 3; i++)
				pix[i] = (uint8_t)rnd(&rng);
			for (int it = 0; it < 8; it++) {
				struct imageop_plan plan;
				int off = it % 2 ? 1 + it / 2 : 0; /* unaligned rows */

				assert(imageop_plan(&op, 300, 50, imageop_key(5, ni, (uint64_t)(ow * 8 + it)),
						    &plan, err, sizeof(err)) == 0);
				memset(a, 0xaa, (n + 16) * sizeof(float));
				memset(b, 0x55, (n + 16) * sizeof(float));
				assert(imageop_run(&op, s, &plan, pix, 300, 50, a + off, err, sizeof(err)) == 0);
				imageop_portable_only(true);
				assert(imageop_run(&op, s, &plan, pix, 300, 50, b + off, err, sizeof(err)) == 0);
				imageop_portable_only(false);
				if (memcmp(a + off, b + off, n * sizeof(float)) != 0) {
					size_t i = 0;

					while (memcmp(a + off + i, b + off + i, sizeof(float)) == 0)
						i++;
					fprintf(stderr, "f32 norm %zu width %d: value %zu is %a, want %a\n",
						ni, ow, i, (double)a[off + i], (double)b[off + i]);
					abort();
				}
			}
			free(pix);
			free(a);
			free(b);
			spec_free(spec);
		}
	}
	printf("test-image: float32 kernel used for %d of the pipelines\n", simd);
#if defined(__x86_64__) && defined(__GNUC__)
	/* IEEE arithmetic: exact for these constants on every CPU that has the kernel */
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		assert(simd == total);
#endif
}

static void test_resample_reference(void)
{
	static const char *const cases[] = {
		"[{\"op\": \"random_resized_crop\", \"size\": 40}, {\"op\": \"horizontal_flip\"}]",
		"[{\"op\": \"random_resized_crop\", \"size\": [12, 20]}, {\"op\": \"horizontal_flip\"}]",
		"[{\"op\": \"random_resized_crop\", \"size\": 7, \"scale\": [0.5, 1.0]}]",
		"[{\"op\": \"resize\", \"size\": 20}, {\"op\": \"center_crop\", \"size\": 16}]",
		"[{\"op\": \"resize\", \"size\": [13, 29]}]",
		"[{\"op\": \"resize\", \"size\": 90}, {\"op\": \"center_crop\", \"size\": [80, 70]}]",
		"[{\"op\": \"center_crop\", \"size\": [70, 45]}]",
		"[{\"op\": \"center_crop\", \"size\": 30}, {\"op\": \"resize\", \"size\": 11}]",
		"[{\"op\": \"resize\", \"size\": [33, 41]}, {\"op\": \"resize\", \"size\": 17}, "
		"{\"op\": \"center_crop\", \"size\": 15}]",
		"[{\"op\": \"horizontal_flip\", \"p\": 1.0}, {\"op\": \"resize\", \"size\": [17, 9]}]",
		"[{\"op\": \"center_crop\", \"size\": 10}, {\"op\": \"horizontal_flip\", \"p\": 1.0}, "
		"{\"op\": \"resize\", \"size\": [30, 7]}]",
		"[{\"op\": \"resize\", \"size\": [3, 200]}, {\"op\": \"center_crop\", \"size\": [5, 150]}]",
		"[{\"op\": \"resize\", \"size\": [1, 1]}]",
	};
	struct image_scratch *s = image_scratch_get(), *rs = calloc(1, sizeof(*rs));
	unsigned rng = 12345;
	long checked = 0;

	assert(s && rs);
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		struct spec *spec = spec_of(cases[ci], ", \"output\": {\"dtype\": \"uint8\", \"layout\": \"NHWC\"}");
		struct imageop op;
		size_t outlen;
		uint8_t *a, *b;

		imageop_init(&op, spec);
		outlen = (size_t)op.out_w * op.out_h * 3;
		a = malloc(outlen);
		b = malloc(outlen);
		for (int it = 0; it < 60; it++) {
			int w = 1 + (int)((rng = rng * 1103515245u + 12345u) >> 16) % 150;
			int h = 1 + (int)((rng = rng * 1103515245u + 12345u) >> 16) % 150;
			int pw = w, ph = h, ra, rb;
			struct imageop_plan plan;
			uint8_t *pix;

			if (imageop_plan(&op, w, h, imageop_key(3, ci, (uint64_t)it), &plan, err,
					 sizeof(err)) < 0)
				continue;
			if (it % 3 == 2 && w >= 8 && h >= 8) {
				/* a DCT-scaled decode: the window in scaled coordinates */
				pw = (w * 3 + 7) / 8;
				ph = (h * 5 + 7) / 8;
			}
			/* exactly the image's bytes: the kernels must not read past them */
			pix = malloc((size_t)pw * ph * 3);
			for (size_t i = 0; i < (size_t)pw * ph * 3; i++) {
				rng = rng * 1103515245u + 12345u;
				pix[i] = (uint8_t)(it % 2 ? (rng >> 16) : (i * 7 / 3) ^ ((rng >> 28) & 1 ? 0xff : 0));
			}
			memset(a, 0xaa, outlen);
			memset(b, 0x55, outlen);
			ra = imageop_run(&op, s, &plan, pix, pw, ph, a, err, sizeof(err));
			rb = ref_imageop_run(&op, rs, &plan, pix, pw, ph, b, err, sizeof(err));
			assert(ra == 0 && rb == 0);
			if (memcmp(a, b, outlen) != 0) {
				size_t i = 0;

				while (a[i] == b[i])
					i++;
				fprintf(stderr, "case %zu, %dx%d (decoded %dx%d): byte %zu is %u, want %u\n",
					ci, w, h, pw, ph, i, a[i], b[i]);
				abort();
			}
			checked++;
			free(pix);
		}
		free(a);
		free(b);
		spec_free(spec);
	}
	assert(checked > 500);
	free(rs->stage[0]);
	free(rs->stage[1]);
	free(rs->tmp);
	free(rs->row);
	free(rs->coef);
	free(rs);
}

/*
 * The production resampling against PIL itself: tests/unit/sources/image-golden.h holds
 * hashes of PIL's output for deterministic resize/crop chains on a fixed
 * pattern (tests/unit/sources/gen-image-golden.py), so the coefficients are checked by
 * something that shares no code with them. Both the SIMD and the portable
 * kernels.
 */
static uint8_t *golden_pattern(int w, int h)
{
	size_t n = (size_t)w * h * 3;
	uint8_t *p = malloc(n);

	assert(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(((i * 7) / 3) ^ ((i * 2654435761ull) >> 13));
	return p;
}

static uint64_t fnv1a(const uint8_t *d, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ d[i]) * 0x100000001b3ull;
	return h;
}

static void test_resample_golden(void)
{
	struct image_scratch *s = image_scratch_get();

	for (int portable = 0; portable < 2; portable++) {
		imageop_portable_only(portable);
		for (size_t ci = 0; ci < sizeof(golden) / sizeof(golden[0]); ci++) {
			const struct golden *g = &golden[ci];
			struct spec *spec = spec_of(g->transforms,
				", \"output\": {\"dtype\": \"uint8\", \"layout\": \"NHWC\"}");
			struct imageop op;
			struct imageop_plan plan;
			uint8_t *pix = golden_pattern(g->w, g->h), *out;
			size_t n;

			imageop_init(&op, spec);
			assert((int)op.out_w == g->out_w && (int)op.out_h == g->out_h);
			n = (size_t)op.out_w * op.out_h * 3;
			out = malloc(n);
			assert(out);
			assert(imageop_plan(&op, g->w, g->h, imageop_key(1, 0, ci), &plan, err, sizeof(err)) == 0);
			assert(imageop_run(&op, s, &plan, pix, g->w, g->h, out, err, sizeof(err)) == 0);
			if (fnv1a(out, n) != g->fnv) {
				fprintf(stderr, "golden case %zu (%dx%d, %s, %s kernels) differs from PIL\n", ci,
				        g->w, g->h, g->transforms, portable ? "portable" : "SIMD");
				abort();
			}
			free(out);
			free(pix);
			spec_free(spec);
		}
	}
	imageop_portable_only(false);
}

/* ---- tar ---- */

struct collected {
	char names[16][TAR_NAME_MAX];
	uint64_t off[16], size[16];
	int n;
};

static int collect(void *ud, const struct tar_entry *e, char *e_err, size_t e_errlen)
{
	struct collected *c = ud;

	assert(c->n < 16);
	snprintf(c->names[c->n], TAR_NAME_MAX, "%s", e->name);
	c->off[c->n] = e->offset;
	c->size[c->n] = e->size;
	c->n++;
	return 0;
}

static void tar_header(unsigned char *h, const char *name, const char *prefix, uint64_t size,
		       char type, bool base256)
{
	unsigned sum = 0;

	memset(h, 0, 512);
	memcpy(h, name, strnlen(name, 100));
	memcpy(h + 100, "0000644", 8);
	if (base256) {
		h[124] = 0x80;
		for (int i = 0; i < 8; i++)
			h[135 - i] = (unsigned char)(size >> (8 * i));
	} else {
		snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
	}
	memcpy(h + 136, "00000000000", 12);
	h[156] = (unsigned char)type;
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	if (prefix)
		memcpy(h + 345, prefix, strlen(prefix));
	memset(h + 148, ' ', 8);
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
}

static int scan_buf(const unsigned char *buf, size_t len, struct collected *c)
{
	const char *p = path_of("t.tar");
	int fd, r;

	write_file(p, buf, len);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	assert(fd >= 0);
	memset(c, 0, sizeof(*c));
	r = tar_scan(fd, p, len, collect, c, err, sizeof(err));
	close(fd);
	return r;
}

static void test_tar(void)
{
	unsigned char *buf = calloc(1, 16384);
	struct collected c;
	size_t at = 0;
	char pax[512];
	int n;

	/* ustar with a prefix; a GNU long name; a pax path; a base-256 size; a dir */
	tar_header(buf + at, "a.jpg", "some/dir", 3, '0', false);
	memcpy(buf + at + 512, "abc", 3);
	at += 1024;
	tar_header(buf + at, "././@LongLink", NULL, 151, 'L', false);
	memset(buf + at + 512, 'n', 150);
	at += 1024;
	tar_header(buf + at, "truncated-name", NULL, 5, '0', false);
	memcpy(buf + at + 512, "hello", 5);
	at += 1024;
	n = snprintf(pax, sizeof(pax), "30 path=pax/long/name.cls\n");
	assert(n == 26);
	n = snprintf(pax, sizeof(pax), "26 path=pax/long/name.cls\n");
	tar_header(buf + at, "PaxHeaders/x", NULL, (uint64_t)n, 'x', false);
	memcpy(buf + at + 512, pax, (size_t)n);
	at += 1024;
	tar_header(buf + at, "ignored", NULL, 2, '0', true);
	memcpy(buf + at + 512, "42", 2);
	at += 1024;
	tar_header(buf + at, "dir/", NULL, 0, '5', false);
	at += 512;
	at += 1024; /* end of archive */
	assert(scan_buf(buf, at, &c) == 0);
	assert(c.n == 3);
	assert(strcmp(c.names[0], "some/dir/a.jpg") == 0 && c.off[0] == 512 && c.size[0] == 3);
	assert(strlen(c.names[1]) == 150 && c.names[1][149] == 'n' && c.size[1] == 5);
	assert(strcmp(c.names[2], "pax/long/name.cls") == 0 && c.size[2] == 2);

	/* a bad checksum; a member running past the end */
	buf[148] ^= 1;
	assert(scan_buf(buf, at, &c) == -EINVAL && strstr(err, "checksum"));
	buf[148] ^= 1;
	assert(scan_buf(buf, 512 + 2, &c) == -EINVAL && strstr(err, "truncated"));
	/* not a tar at all */
	memset(buf, 'x', 1024);
	assert(scan_buf(buf, 1024, &c) == -EINVAL && strstr(err, "not a tar"));
	free(buf);

	/* brace patterns */
	char **v;
	assert(brace_expand("s-{00..11}.tar", &v, err, sizeof(err)) == 12);
	assert(strcmp(v[0], "s-00.tar") == 0 && strcmp(v[11], "s-11.tar") == 0);
	brace_free(v);
	assert(brace_expand("{a,bb}/{8..10}", &v, err, sizeof(err)) == 6);
	assert(strcmp(v[0], "a/8") == 0 && strcmp(v[2], "a/10") == 0 && strcmp(v[5], "bb/10") == 0);
	brace_free(v);
	assert(brace_expand("plain.tar", &v, err, sizeof(err)) == 1 && strcmp(v[0], "plain.tar") == 0);
	brace_free(v);
	assert(brace_expand("x{1..}", NULL, err, sizeof(err)) == -EINVAL);
	assert(brace_expand("x{3..1}", NULL, err, sizeof(err)) == -EINVAL);
	assert(brace_expand("x{1..3", NULL, err, sizeof(err)) == -EINVAL);
	assert(brace_expand("x{a{b}}", NULL, err, sizeof(err)) == -EINVAL);
	assert(brace_expand("x{0..9999999}", NULL, err, sizeof(err)) == -EINVAL);
}

/* ---- image sources, end to end ---- */

static void write_jpeg(const char *path, int w, int h, unsigned seed)
{
	tjhandle tj = tjInitCompress();
	unsigned char *src = pattern(w, h, 3, seed), *out = NULL;
	unsigned long len = 0;

	assert(tjCompress2(tj, src, w, 0, h, TJPF_RGB, &out, &len, TJSAMP_420, 90, 0) == 0);
	write_file(path, out, len);
	tjFree(out);
	tjDestroy(tj);
	free(src);
}

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
	}
	return ~c;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* A small PNG that declares @w x @h RGB pixels: its IHDR and a short IDAT,
 * no more (the file of issue 13, 16 KB declaring 2^27 pixels). */
static void write_png_claiming(const char *path, uint32_t w, uint32_t h)
{
	uint8_t f[8 + 25 + 12 + 64] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
	uint8_t *c = f + 8;

	put_be32(c, 13);
	memcpy(c + 4, "IHDR", 4);
	put_be32(c + 8, w);
	put_be32(c + 12, h);
	c[16] = 8, c[17] = 2, c[18] = 0, c[19] = 0, c[20] = 0;
	put_be32(c + 21, crc32_of(c + 4, 17));
	c += 25;
	put_be32(c, 64);
	memcpy(c + 4, "IDAT", 4);
	c[8] = 0x78, c[9] = 0x01;               /* a zlib stream that goes on past the file */
	put_be32(c + 8 + 64, crc32_of(c + 4, 68));
	write_file(path, f, sizeof(f));
}

static void test_outsize(void)
{
	struct spec *spec;
	struct source *src;
	struct image_scratch *s;
	unsigned char img[3 * 12 * 12];
	int64_t label;
	void *dsts[2] = { img, &label };
	struct sample_ctx ctx = { .seed = 3 };

	assert(mkdir(path_of("big"), 0755) == 0);
	assert(mkdir(path_of("big/a"), 0755) == 0);
	write_png_claiming(path_of("big/a/0.png"), 10000, 10000);   /* 10^8 pixels */
	write_png_claiming(path_of("big/a/1.png"), 8000, 4000);     /* 96 MB of RGB */
	write_jpeg(path_of("big/a/2.jpg"), 30, 20, 1);
	spec = spec_of("[{\"op\": \"center_crop\", \"size\": 12}]",
		       ", \"output\": {\"dtype\": \"uint8\", \"layout\": \"NHWC\"}, \"on_error\": \"fail\"");
	assert(spec->max_pixels == 1u << 26);
	free(spec->source.root);
	spec->source.root = strdup(path_of("big"));
	assert(source_open(&src, spec, err, sizeof(err)) == 0);

	/* over decode.max_pixels: refused from its header, naming file and size */
	assert(source_read(src, &ctx, 0, dsts, err, sizeof(err)) == -EINVAL);
	{
		char want[600];
		snprintf(want, sizeof(want), "%s: image of 10000x10000 (100000000 pixels) is larger "
			 "than decode.max_pixels 67108864", path_of("big/a/0.png"));
		if (strcmp(err, want) != 0) {
			fprintf(stderr, "got \"%s\"\nwant \"%s\"\n", err, want);
			abort();
		}
	}
	/* under it, but bad: its 96 MB of scratch go back at once, not at the
	 * worker's exit (issue 13: 390 MB a worker stayed resident) */
	assert(source_read(src, &ctx, 1, dsts, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "big/a/1.png: PNG: "));
	s = image_scratch_get();
	assert(s && image_scratch_bytes(s) <= IMAGE_SCRATCH_KEEP);
	assert(source_read(src, &ctx, 2, dsts, err, sizeof(err)) == 0);
	assert(image_scratch_bytes(s) > 0 && image_scratch_bytes(s) <= IMAGE_SCRATCH_KEEP);
	source_free(src);

	/* a lower bound of one's own */
	spec->max_pixels = 100;
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_read(src, &ctx, 2, dsts, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "big/a/2.jpg: image of 30x20 (600 pixels) is larger than decode.max_pixels 100"));
	source_free(src);
	spec_free(spec);
}

static void test_source(void)
{
	struct spec *spec;
	struct source *src;
	const struct field_desc *f;
	unsigned char img[5][3 * 12 * 12], ref[3 * 12 * 12];
	int64_t label;
	void *dsts[2];
	struct sample_ctx ctx = { .seed = 3 };

	assert(mkdir(path_of("root"), 0755) == 0);
	assert(mkdir(path_of("root/b"), 0755) == 0);
	assert(mkdir(path_of("root/a"), 0755) == 0);
	assert(mkdir(path_of("root/a/sub"), 0755) == 0);
	write_jpeg(path_of("root/a/1.jpg"), 30, 20, 1);
	write_jpeg(path_of("root/a/sub/0.JPEG"), 25, 20, 2);
	write_file(path_of("root/a/notes.txt"), "x", 1);
	write_jpeg(path_of("root/b/0.jpg"), 20, 30, 3);
	write_file(path_of("root/b/1.jpg"), "", 0);              /* zero bytes */
	write_jpeg(path_of("root/b/2.jpg"), 40, 40, 4);

	spec = spec_of("[{\"op\": \"random_resized_crop\", \"size\": 12}, {\"op\": \"horizontal_flip\"}]",
		       ", \"output\": {\"dtype\": \"uint8\", \"layout\": \"NHWC\"}");
	/* spec_of() used dir as the root: point it at root/ */
	free(spec->source.root);
	spec->source.root = strdup(path_of("root"));
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 5 && source_nfields(src) == 2);
	f = source_field(src, 0);
	assert(strcmp(f->name, "image") == 0 && f->ndim == 3 && f->shape[0] == 12 &&
	       f->shape[2] == 3 && f->sample_bytes == sizeof(ref));
	f = source_field(src, 1);
	assert(strcmp(f->name, "label") == 0 && f->ndim == 0 && f->sample_bytes == 8);

	/* order: a/1.jpg, a/sub/0.JPEG, b/0.jpg, b/1.jpg (bad), b/2.jpg */
	for (uint64_t i = 0; i < 5; i++) {
		dsts[0] = img[i];
		dsts[1] = &label;
		if (source_read(src, &ctx, i, dsts, err, sizeof(err)) != 0) {
			fprintf(stderr, "sample %llu: %s\n", (unsigned long long)i, err);
			abort();
		}
		assert(label == (i < 2 ? 0 : 1));
		/* the same again: reproducible */
		dsts[0] = ref;
		assert(source_read(src, &ctx, i, dsts, err, sizeof(err)) == 0);
		assert(memcmp(ref, img[i], sizeof(ref)) == 0);
	}
	/* the zero-byte file was replaced by the next sample, transformed as that one */
	assert(memcmp(img[3], img[4], sizeof(ref)) == 0);
	/* read twice (and landed on) but one bad sample: counted once, and
	 * not read again (issue 13: a run of bad files re-read for every
	 * sample that lands on it) */
	assert(source_skipped(src) == 1);
	for (int k = 0; k < 3; k++) {
		dsts[0] = ref;
		assert(source_read(src, &ctx, 3, dsts, err, sizeof(err)) == 0);
		assert(memcmp(ref, img[4], sizeof(ref)) == 0);
	}
	assert(source_skipped(src) == 1);
	source_free(src);

	/* on_error fail: the error names the file and the reason */
	spec->on_error_fail = true;
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	dsts[0] = img[0];
	dsts[1] = &label;
	assert(source_read(src, &ctx, 3, dsts, err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "root/b/1.jpg") && strstr(err, "empty file"));
	assert(source_skipped(src) == 0);
	source_free(src);

	/* a missing root, an empty one */
	free(spec->source.root);
	spec->source.root = strdup(path_of("nope"));
	assert(source_open(&src, spec, err, sizeof(err)) == -ENOENT && strstr(err, "nope"));
	assert(mkdir(path_of("empty"), 0755) == 0);
	free(spec->source.root);
	spec->source.root = strdup(path_of("empty"));
	assert(source_open(&src, spec, err, sizeof(err)) == -EINVAL && strstr(err, "no class folders"));
	spec_free(spec);
}

static void test_spec(void)
{
	static const struct {
		const char *transforms, *extra, *want;
	} bad[] = {
		{ "[]", "", "transforms: the output image size depends on each image" },
		{ "[{\"op\": \"resize\", \"size\": 256}]", "", "output image size depends" },
		{ "[{\"op\": \"resize\", \"size\": 256}, {\"op\": \"horizontal_flip\"}]", "", "output image size" },
		{ "[{\"op\": \"blur\"}]", "", "transforms[0].op: must be one of" },
		{ "[{\"op\": \"center_crop\"}]", "", "transforms[0].size: is required" },
		{ "[{\"op\": \"center_crop\", \"size\": 0}]", "", "transforms[0].size: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8, \"x\": 1}]", "", "unknown key \"transforms[0].x\"" },
		{ "[{\"op\": \"random_resized_crop\", \"size\": 8, \"scale\": [0.5, 0.1]}]", "", "transforms[0].scale: must be" },
		{ "[{\"op\": \"random_resized_crop\", \"size\": 8, \"ratio\": [0, 1]}]", "", "transforms[0].ratio: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}, {\"op\": \"horizontal_flip\", \"p\": 2}]", "", "transforms[1].p: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}, {\"op\": \"normalize\", \"mean\": [0.5], \"std\": [0]}]", "", "transforms[1].std: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}, {\"op\": \"normalize\", \"mean\": [1, 2], \"std\": [1]}]", "", "transforms[1].mean: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}, {\"op\": \"normalize\", \"mean\": [1], \"std\": [1]}]", ", \"output\": {\"dtype\": \"uint8\"}", "transforms[1]: normalize needs output.dtype" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"output\": {\"dtype\": \"int8\"}", "output.dtype: must be one of" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"output\": {\"layout\": \"CHW\"}", "output.layout: must be" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"output\": {\"bogus\": 1}", "unknown key \"output.bogus\"" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"on_error\": \"ignore\"", "on_error: must be skip or fail" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"decode\": {\"dct_scaling\": 1}", "decode.dct_scaling: must be true or false" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"decode\": {\"max_pixels\": 0}", "spec: decode.max_pixels: must be an integer in 1..134217728" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"decode\": {\"max_pixels\": 134217729}", "spec: decode.max_pixels: must be an integer in 1..134217728" },
		{ "[{\"op\": \"center_crop\", \"size\": 8}]", ", \"decode\": {\"x\": 1}", "unknown key \"decode.x\"" },
	};
	struct spec *spec, *again;
	char text[2048];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(text, sizeof(text),
			 "{\"name\": \"i\", \"source\": {\"kind\": \"image_folder\", \"path\": \"/x\"}, "
			 "\"transforms\": %s%s}", bad[i].transforms, bad[i].extra);
		assert(spec_parse(&spec, text, err, sizeof(err)) == -EINVAL);
		if (!strstr(err, bad[i].want)) {
			fprintf(stderr, "case %zu: got \"%s\", want \"%s\"\n", i, err, bad[i].want);
			abort();
		}
	}
	assert(spec_parse(&spec, "{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", "
			  "\"seq_len\": 4}, \"transforms\": []}", err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "transforms: only for image sources"));
	assert(spec_parse(&spec, "{\"name\": \"t\", \"source\": {\"kind\": \"webdataset\", "
			  "\"urls\": \"a-{1..}.tar\"}, \"transforms\": [{\"op\": \"center_crop\", \"size\": 4}]}",
			  err, sizeof(err)) == -EINVAL);
	assert(strstr(err, "source.urls[0]: bad range"));
	/* the bound on shards, from the count alone (issue 13: a million names
	 * took a minute and 2.9 GB before failing at the first missing one) */
	assert(spec_parse(&spec, "{\"name\": \"t\", \"source\": {\"kind\": \"webdataset\", "
			  "\"urls\": \"shard-{000000..999999}.tar\"}, \"transforms\": [{\"op\": \"center_crop\", \"size\": 4}]}",
			  err, sizeof(err)) == -EINVAL);
	assert(strcmp(err, "spec: source.urls: 1000000 shards named, the most is 65536") == 0);
	assert(spec_parse(&spec, "{\"name\": \"t\", \"source\": {\"kind\": \"webdataset\", "
			  "\"urls\": [\"a-{0..40000}.tar\", \"b{,,}-{0..9999}.tar\"]}, \"transforms\": [{\"op\": \"center_crop\", \"size\": 4}]}",
			  err, sizeof(err)) == -EINVAL);
	assert(strcmp(err, "spec: source.urls: 70001 shards named, the most is 65536") == 0);
	{
		char *big[] = { "x-{0..65535}.tar", "y.tar" };
		assert(imageset_count_shards(big, 1, err, sizeof(err)) == 65536);
		assert(imageset_count_shards(big, 2, err, sizeof(err)) == -E2BIG);
		assert(strcmp(err, "webdataset: 65537 shards named, the most is 65536") == 0);
	}

	/* defaults and the canonical form */
	assert(spec_parse(&spec, "{\"name\": \"w\", \"source\": {\"kind\": \"webdataset\", "
			  "\"urls\": \"s-{0..3}.tar\"}, \"transforms\": [{\"op\": \"random_resized_crop\", "
			  "\"size\": [32, 24]}, {\"op\": \"horizontal_flip\"}, {\"op\": \"normalize\", "
			  "\"mean\": [0.5], \"std\": [0.25, 0.5, 1]}]}", err, sizeof(err)) == 0);
	assert(spec->image_h == 32 && spec->image_w == 24 && spec->image_dtype == LDR_DTYPE_FLOAT32);
	assert(!spec->image_nhwc && !spec->on_error_fail && spec->dct_scaling);
	assert(spec->transforms[0].scale[0] == 0.08 && spec->transforms[1].p == 0.5);
	assert(spec->transforms[2].mean[2] == 0.5 && spec->transforms[2].std[0] == 0.25);
	char *dump = json_dumps(spec->json, JSON_COMPACT | JSON_SORT_KEYS);
	assert(strstr(dump, "\"on_error\":\"skip\"") && strstr(dump, "\"layout\":\"NCHW\""));
	assert(strstr(dump, "\"decode\":{\"dct_scaling\":true,\"max_pixels\":67108864}"));
	assert(spec_parse(&again, dump, err, sizeof(err)) == 0 && spec_equal(spec, again));
	free(dump);
	spec_free(again);
	spec_free(spec);

	/* resize to the shorter side after a fixed size is fixed too */
	assert(spec_parse(&spec, "{\"name\": \"r\", \"source\": {\"kind\": \"image_folder\", \"path\": \"/x\"}, "
			  "\"transforms\": [{\"op\": \"center_crop\", \"size\": [20, 40]}, "
			  "{\"op\": \"resize\", \"size\": 10}]}", err, sizeof(err)) == 0);
	assert(spec->image_h == 10 && spec->image_w == 20);
	spec_free(spec);
}

static void rm_rf(const char *path)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	assert(system(cmd) == 0);
}

/*
 * The decoded-image cache under threads (TSan's pass runs this): four
 * threads read every sample of three epochs at once, each from another
 * offset, so that they miss, claim, keep and hit the same images
 * concurrently; every sample must be the bytes of an exact decode without a
 * cache, with room for every image and with room for two.
 */
#define CACHE_N 9
#define CACHE_EPOCHS 3
#define CACHE_OUT (3 * 12 * 12)

struct cache_run {
	struct source *src;
	int first;
	uint8_t got[CACHE_EPOCHS][CACHE_N][CACHE_OUT];
	int64_t labels[CACHE_EPOCHS][CACHE_N];
	int r;
};

static void *cache_reader(void *arg)
{
	struct cache_run *cr = arg;
	char e[512];

	for (int ep = 0; ep < CACHE_EPOCHS; ep++) {
		struct sample_ctx ctx = { .seed = 11, .epoch = (uint64_t)ep };

		for (int k = 0; k < CACHE_N; k++) {
			int i = (k + cr->first) % CACHE_N;
			void *dsts[2] = { cr->got[ep][i], &cr->labels[ep][i] };

			if ((cr->r = source_read(cr->src, &ctx, (uint64_t)i, dsts, e, sizeof(e))) < 0) {
				fprintf(stderr, "sample %d: %s\n", i, e);
				return NULL;
			}
		}
	}
	return NULL;
}

static void cache_check(struct spec *spec, const struct cache_run *want, json_int_t *entries,
			json_int_t *refused)
{
	static struct cache_run cr[4];
	pthread_t th[4];
	json_t *st;

	assert(source_open(&cr[0].src, spec, err, sizeof(err)) == 0);
	for (int t = 0; t < 4; t++) {
		cr[t].src = cr[0].src;
		cr[t].first = 2 * t;
		assert(pthread_create(&th[t], NULL, cache_reader, &cr[t]) == 0);
	}
	for (int t = 0; t < 4; t++) {
		assert(pthread_join(th[t], NULL) == 0);
		assert(cr[t].r == 0);
		assert(memcmp(cr[t].got, want->got, sizeof(want->got)) == 0);
		assert(memcmp(cr[t].labels, want->labels, sizeof(want->labels)) == 0);
	}
	st = source_cache_json(cr[0].src);
	assert(st);
	*entries = json_integer_value(json_object_get(st, "entries"));
	*refused = json_integer_value(json_object_get(st, "refused"));
	/* 4 threads x 3 epochs x 9 samples, and the bad one's first read in
	 * each thread's first epoch (then it is remembered) */
	assert(json_integer_value(json_object_get(st, "hits")) +
	       json_integer_value(json_object_get(st, "misses")) >= 4 * CACHE_EPOCHS * CACHE_N);
	json_decref(st);
	source_free(cr[0].src);
}

static void test_cache(void)
{
	static struct cache_run want;
	struct spec *spec;
	json_int_t entries, refused;
	char name[64];

	assert(mkdir(path_of("cache"), 0755) == 0);
	assert(mkdir(path_of("cache/a"), 0755) == 0);
	for (int i = 0; i < CACHE_N; i++) {
		snprintf(name, sizeof(name), "cache/a/%d.jpg", i);
		if (i == 4)
			write_file(path_of(name), "bad", 3);
		else
			write_jpeg(path_of(name), 20 + 3 * i, 40 - 2 * i, (unsigned)i + 20);
	}
	spec = spec_of("[{\"op\": \"random_resized_crop\", \"size\": 12}, {\"op\": \"horizontal_flip\"}]",
		       ", \"output\": {\"dtype\": \"uint8\", \"layout\": \"NHWC\"}, "
		       "\"decode\": {\"dct_scaling\": false}");
	free(spec->source.root);
	spec->source.root = strdup(path_of("cache"));
	assert(source_open(&want.src, spec, err, sizeof(err)) == 0);
	assert(source_cache_json(want.src) == NULL);
	cache_reader(&want);
	assert(want.r == 0);
	source_free(want.src);

	spec->dct_scaling = true;     /* no effect under a cache: a full decode */
	spec->cache_decoded = true;
	spec->cache_bytes = 1 << 20;
	cache_check(spec, &want, &entries, &refused);
	assert(entries == CACHE_N - 1 && refused == 0);

	/* entries take 2432..3264 bytes: in 6600 any two fit, no three do */
	spec->cache_bytes = 6600;
	cache_check(spec, &want, &entries, &refused);
	assert(entries == 2 && refused == CACHE_N - 3);

	/* max_side: reduced images (30: most of them; 1: 1x1 pixels, every crop
	 * upsampled from one pixel), the same bytes cached or not, whichever
	 * thread came first: the reference is one thread's run, checked against
	 * four threads with room for all, then with room for one (the others
	 * reduced into the worker's scratch at every read) */
	for (int side = 30; side > 0; side -= 29) {
		spec->cache_max_side = (uint32_t)side;
		spec->cache_bytes = 1 << 20;
		assert(source_open(&want.src, spec, err, sizeof(err)) == 0);
		cache_reader(&want);
		assert(want.r == 0);
		source_free(want.src);
		cache_check(spec, &want, &entries, &refused);
		assert(entries == CACHE_N - 1 && refused == 0);
		spec->cache_bytes = side == 30 ? 24 + 30 * 30 * 3 + 64 : 64;
		cache_check(spec, &want, &entries, &refused);
		assert(entries == 1 && refused == CACHE_N - 2);
	}
	spec_free(spec);
}

int main(void)
{
	assert(mkdtemp(dir));
	test_jpeg();
	test_region();
	test_pick_scale_real();
	test_draft_scale();
	(void)test_pick_scale;
	test_png();
	test_corrupt();
	test_plan();
	test_region_corrupt();
	test_region_pipeline();
	test_decode_many();
	test_resample_reference();
	test_resample_golden();
	test_f32_kernel();
	imageop_portable_only(true);
	test_resample_reference();
	imageop_portable_only(false);
	test_tar();
	test_spec();
	test_source();
	test_outsize();
	test_cache();
	rm_rf(dir);
	printf("test-image: ok\n");
	return 0;
}
