/* SPDX-License-Identifier: MIT */
/* fuzz-image - image_probe(), image_decode() and image_decode_region() on any bytes
 *
 * Image files are dataset files: untrusted, decoded by the workers. A file
 * that probes is decoded whole at 1/1, then at a DCT scale and a window drawn
 * from the input's bytes, whole and as a region; where both decodes succeed
 * the window's pixels must be the same (image.h promises it bit for bit, and
 * the crop a worker draws must not change a sample).
 */
#include "fuzz.h"

#include "image.h"

/* Larger images decode too slowly for fuzzing; the size checks above this
 * (IMAGE_MAX_PIXELS) are plain arithmetic in image_probe(). */
#define FUZZ_MAX_PIXELS (1u << 20)

static uint32_t mix(const uint8_t *data, size_t size)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < size; i++)
		h = (h ^ data[i]) * 16777619u;
	return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int scales[][2] = { { 1, 1 }, { 1, 2 }, { 3, 8 }, { 1, 8 }, { 7, 8 }, { 1, 4 } };
	struct image_scratch *s = image_scratch_get();
	struct image_info info;
	struct image_region got;
	char err[512];
	uint8_t *full = NULL;
	uint32_t h = mix(data, size);
	int num, denom, w, ht, x0, y0, x1, y1, rfull, rreg;

	if (!s)
		return 0;
	if (image_probe(s, data, size, &info, err, sizeof(err)) < 0)
		return 0;
	if ((uint64_t)info.width * (uint64_t)info.height > FUZZ_MAX_PIXELS)
		return 0;
	(void)image_decode(s, data, size, &info, 1, 1, err, sizeof(err));

	if (info.format == IMAGE_JPEG) {
		num = scales[h % 6][0];
		denom = scales[h % 6][1];
	} else {
		num = denom = 1;
	}
	h /= 6;
	image_scaled_size(&info, num, denom, &w, &ht);
	x0 = (int)(h % (uint32_t)w);
	h /= (uint32_t)w;
	y0 = (int)(h % (uint32_t)ht);
	h = h / (uint32_t)ht + 0x9e3779b9u * (uint32_t)size;
	x1 = x0 + 1 + (int)(h % (uint32_t)(w - x0));
	y1 = y0 + 1 + (int)((h >> 16) % (uint32_t)(ht - y0));

	rfull = image_decode(s, data, size, &info, num, denom, err, sizeof(err));
	if (rfull == 0) {
		size_t n = (size_t)w * (size_t)ht * 3;
		full = malloc(n);
		if (!full)
			return 0;
		memcpy(full, s->pix, n);
	}
	rreg = image_decode_region(s, data, size, &info, num, denom, x0, y0, x1, y1, &got, err,
				   sizeof(err));
	if (rreg == 0 && (got.x > x0 || got.y > y0 || got.x + got.w < x1 || got.y + got.h < y1 ||
			  got.x + got.w > w || got.y + got.h > ht)) {
		fprintf(stderr, "region [%d,%d)x[%d,%d) of %dx%d at %d/%d: got %d,%d %dx%d\n", x0,
			x1, y0, y1, w, ht, num, denom, got.x, got.y, got.w, got.h);
		abort();
	}
	if (rreg == 0 && full) {
		for (int y = y0; y < y1; y++) {
			const uint8_t *a = full + ((size_t)y * (size_t)w + (size_t)x0) * 3;
			const uint8_t *b = s->pix + ((size_t)(y - got.y) * (size_t)got.w +
						     (size_t)(x0 - got.x)) * 3;
			if (memcmp(a, b, (size_t)(x1 - x0) * 3) != 0) {
				fprintf(stderr, "region [%d,%d)x[%d,%d) of %dx%d at %d/%d: row %d "
					"differs from the whole decode\n", x0, x1, y0, y1, w, ht,
					num, denom, y);
				abort();
			}
		}
	}
	free(full);
	return 0;
}
