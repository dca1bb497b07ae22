/* SPDX-License-Identifier: MIT */
/* image-golden - PIL's outputs for test-image.c (tests/unit/sources/gen-image-golden.py wrote it) */
#pragma once

#include <stdint.h>

static const struct golden {
	int w, h;
	const char *transforms;
	int out_w, out_h;
	uint64_t fnv;
} golden[] = {
	{ 37, 23, "[{\"op\": \"resize\", \"size\": [13, 29]}]", 29, 13, 0x6f21e1621c4b22c5ull },
	{ 150, 90, "[{\"op\": \"resize\", \"size\": [40, 60]}]", 60, 40, 0xbb2a3e425503211full },
	{ 64, 64, "[{\"op\": \"resize\", \"size\": [17, 9]}]", 9, 17, 0x422a0468f7030496ull },
	{ 7, 5, "[{\"op\": \"resize\", \"size\": [20, 30]}]", 30, 20, 0x4185a0ce9d232a3full },
	{ 1, 1, "[{\"op\": \"resize\", \"size\": [4, 4]}]", 4, 4, 0x9250833b4d8c0b05ull },
	{ 300, 40, "[{\"op\": \"resize\", \"size\": [3, 200]}]", 200, 3, 0x5761ac694542f5f7ull },
	{ 120, 80, "[{\"op\": \"resize\", \"size\": 20}, {\"op\": \"center_crop\", \"size\": 16}]", 16, 16, 0x552182834f078ef4ull },
	{ 90, 150, "[{\"op\": \"center_crop\", \"size\": [70, 45]}]", 45, 70, 0xdec38eab2af0b083ull },
	{ 100, 100, "[{\"op\": \"center_crop\", \"size\": 30}, {\"op\": \"resize\", \"size\": 11}]", 11, 11, 0x323cdf9aa7678e22ull },
	{ 41, 33, "[{\"op\": \"resize\", \"size\": [33, 41]}, {\"op\": \"resize\", \"size\": 17}, {\"op\": \"center_crop\", \"size\": 15}]", 15, 15, 0x7f656095b231858bull },
	{ 256, 171, "[{\"op\": \"resize\", \"size\": [224, 224]}]", 224, 224, 0xbbabe3e02cfa7715ull },
	{ 500, 375, "[{\"op\": \"resize\", \"size\": 256}, {\"op\": \"center_crop\", \"size\": 224}]", 224, 224, 0x4c45ac2535462bcfull },
};
