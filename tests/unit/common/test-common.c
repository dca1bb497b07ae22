/* SPDX-License-Identifier: MIT */
/* test-common - the small helpers of common/ that check figures from the wire */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"

/* field_fits(): a field of an attach reply lies within its slot */
static void test_field_fits(void)
{
	assert(field_fits(0, 32, 128, 4096));
	assert(field_fits(64, 32, 126, 4096));
	assert(!field_fits(65, 32, 126, 4096));
	assert(field_fits(4096, 0, 1, 4096));
	assert(!field_fits(4097, 0, 1, 4096));
	/* offset + rows * sample_bytes wraps to 0 (2^63 * 2): outside, not 0 bytes */
	assert(!field_fits(0, 2, UINT64_C(1) << 63, 4096));
	/* the product fits, the sum wraps: 2^64 - 16 + 32 */
	assert(!field_fits(UINT64_MAX - 15, 4, 8, 4096));
	assert(!field_fits(UINT64_MAX, 1, 1, UINT64_MAX));
	assert(field_fits(UINT64_MAX - 1, 1, 1, UINT64_MAX));
}

int main(void)
{
	test_field_fits();
	printf("test-common: ok\n");
	return 0;
}
