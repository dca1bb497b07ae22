/* SPDX-License-Identifier: MIT */
/* sums-speed - MB/s of the sums daemon/store/sums.c checks a fetched body
 * with (docs/benchmarks.md, "Checksums"): CRC32C (the SSE4.2 instruction
 * where the CPU has it, and the portable tables), CRC32 (zlib's, and the
 * tables), CRC64NVME (PCLMULQDQ folding, and the tables), MD5 and SHA-256, over one buffer of random bytes, the best of
 * five runs each (one core).
 *
 *   sums-speed [MIB]      the buffer's size, 64 MiB by default
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sums.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static volatile uint32_t sink;

static void run(const char *name, enum sum_kind kind, int how, const unsigned char *buf, size_t len)
{
	double best = 1e9;

	for (int i = 0; i < 5; i++) {
		double t = now();

		if (how == 0) {
			struct sum s;
			char out[48];

			sum_init(&s, kind);
			sum_update(&s, buf, len);
			sum_base64(&s, out);
			sink ^= (uint32_t)out[0];
		} else {
			sink ^= (uint32_t)(how == 1 ? sum_crc(kind, ~(uint64_t)0, buf, len) :
						      sum_crc_portable(kind, ~(uint64_t)0, buf, len));
		}
		t = now() - t;
		if (t < best)
			best = t;
	}
	printf("%-22s %8.0f MB/s\n", name, (double)len / best / 1e6);
}

int main(int argc, char **argv)
{
	size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
	unsigned char *buf = malloc(len);
	uint32_t x = 28;
	char crc32c_name[40], crc32_name[40], crc64_name[40];

	if (!buf || !len)
		return 1;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		buf[i] = (unsigned char)(x >> 16);
	}
	snprintf(crc32c_name, sizeof crc32c_name, "crc32c (%s)", sum_crc_impl(SUM_CRC32C));
	snprintf(crc32_name, sizeof crc32_name, "crc32 (%s)", sum_crc_impl(SUM_CRC32));
	snprintf(crc64_name, sizeof crc64_name, "crc64nvme (%s)", sum_crc_impl(SUM_CRC64NVME));
	run(crc32c_name, SUM_CRC32C, 1, buf, len);
	run("crc32c (table)", SUM_CRC32C, 2, buf, len);
	run(crc32_name, SUM_CRC32, 1, buf, len);
	run("crc32 (table)", SUM_CRC32, 2, buf, len);
	run(crc64_name, SUM_CRC64NVME, 1, buf, len);
	run("crc64nvme (table)", SUM_CRC64NVME, 2, buf, len);
	run("md5", SUM_MD5, 0, buf, len);
	run("sha256", SUM_SHA256, 0, buf, len);
	free(buf);
	return 0;
}
