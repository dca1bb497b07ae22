/* SPDX-License-Identifier: MIT */
/* image-params - print the random_resized_crop (and flip) draws of samples */

/*
 * For the statistical tests in tests/integration/test_images.py:
 *   image-params H W SIZE SCALE0 SCALE1 RATIO0 RATIO1 SEED EPOCH FIRST COUNT [FLIP_P]
 * prints, for sample indices FIRST..FIRST+COUNT-1 of an H x W image, one line
 * "index top left height width [flip]": the crop that the daemon's plan takes,
 * from the same code path (imageop_plan).
 */
#include <stdio.h>
#include <stdlib.h>

#include "imageop.h"
#include "spec.h"

int main(int argc, char **argv)
{
	char text[1024], err[512];
	struct spec *spec;
	struct imageop op;
	unsigned long long seed, epoch, first, count;
	int h, w, size;
	bool flip = argc == 13;

	if (argc != 12 && argc != 13) {
		fprintf(stderr, "usage: image-params H W SIZE SCALE0 SCALE1 RATIO0 RATIO1 SEED EPOCH FIRST COUNT [FLIP_P]\n");
		return 2;
	}
	h = atoi(argv[1]);
	w = atoi(argv[2]);
	size = atoi(argv[3]);
	seed = strtoull(argv[8], NULL, 10);
	epoch = strtoull(argv[9], NULL, 10);
	first = strtoull(argv[10], NULL, 10);
	count = strtoull(argv[11], NULL, 10);
	snprintf(text, sizeof(text),
		 "{\"name\": \"p\", \"source\": {\"kind\": \"image_folder\", \"path\": \"/x\"}, "
		 "\"transforms\": [{\"op\": \"random_resized_crop\", \"size\": %d, \"scale\": [%s, %s], "
		 "\"ratio\": [%s, %s]}%s%s%s]}",
		 size, argv[4], argv[5], argv[6], argv[7], flip ? ", {\"op\": \"horizontal_flip\", \"p\": " : "",
		 flip ? argv[12] : "", flip ? "}" : "");
	if (spec_parse(&spec, text, err, sizeof(err)) < 0) {
		fprintf(stderr, "image-params: %s\n", err);
		return 1;
	}
	imageop_init(&op, spec);
	for (unsigned long long i = first; i < first + count; i++) {
		struct imageop_plan plan;
		const struct imageop_stage *st = &plan.st[0];

		if (imageop_plan(&op, w, h, imageop_key(seed, epoch, i), &plan, err, sizeof(err)) < 0) {
			fprintf(stderr, "image-params: %s\n", err);
			return 1;
		}
		if (flip)
			printf("%llu %d %d %d %d %d\n", i, st->wy, st->wx, st->wh, st->ww, st->flip);
		else
			printf("%llu %d %d %d %d\n", i, st->wy, st->wx, st->wh, st->ww);
	}
	spec_free(spec);
	return 0;
}
