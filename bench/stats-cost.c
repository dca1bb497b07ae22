/* SPDX-License-Identifier: MIT */
/*
 * stats-cost - what stall accounting adds to a batch (docs/benchmarks.md,
 * "Stall accounting"): libloader's two clock reads and bucket count per
 * ldr_next(), and packing TrainerStats into a Release, against packing the
 * same Release without them. Prints ns per batch for each.
 *
 * Usage: stats-cost [ITERATIONS]
 */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "loader.pb-c.h"

int main(int argc, char **argv)
{
	static const char *const what[] = { "release, no stats", "+ timing (2 clock reads, bucket)",
	                                    "+ TrainerStats packed" };
	long n = argc > 1 ? atol(argv[1]) : 2000000;
	uint64_t buckets[WAIT_BUCKETS] = { 0 }, leases[4] = { 11, 12, 13, 14 }, sink = 0;
	uint8_t buf[1024];

	if (n <= 0) {
		fprintf(stderr, "usage: stats-cost [ITERATIONS]\n");
		return 2;
	}
	for (int v = 0; v < 3; v++) {
		uint64_t t0 = mono_ns();
		for (long i = 0; i < n; i++) {
			Loaderd__Request q = LOADERD__REQUEST__INIT;
			Loaderd__Release r = LOADERD__RELEASE__INIT;
			Loaderd__TrainerStats st = LOADERD__TRAINER_STATS__INIT;

			r.attach_id = 3;
			r.n_leases = 4;
			r.leases = leases;
			if (v >= 1) {
				uint64_t a = mono_ns(), b = mono_ns();
				/* waits spread over the buckets, as a real run's are */
				buckets[wait_bucket(b - a + (uint64_t)i * 7919 % 3000000)]++;
			}
			if (v == 2) {
				st.wait_ns = 123456789 + (uint64_t)i;
				st.compute_ns = 987654321 + (uint64_t)i;
				st.calls = (uint64_t)i;
				st.n_wait_buckets = WAIT_BUCKETS;
				st.wait_buckets = buckets;
				r.stats = &st;
			}
			q.body_case = LOADERD__REQUEST__BODY_RELEASE;
			q.release = &r;
			sink += loaderd__request__pack(&q, buf);
		}
		printf("%-34s %7.1f ns per batch\n", what[v], (double)(mono_ns() - t0) / (double)n);
	}
	return sink == 0;
}
