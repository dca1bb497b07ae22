/* SPDX-License-Identifier: MIT */
/* test-blend-index - mg_blend_indices() on several threads against
 * helpers.cpp's two loops written plainly on one: the same part and sample
 * at every step for every number of threads and chunk size, ties and spent
 * parts included, and the chunks joined after few steps on megatron-like
 * sizes (the test that the threads save anything). */
#undef NDEBUG
#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* helpers.cpp's loops: sizes NULL, build_blending_indices over @w;
 * else build_exhaustive_blending_indices over @sizes */
static void reference(uint16_t *di, uint64_t *si, const double *w, const uint64_t *sizes,
		      size_t n, uint64_t size, uint64_t *cur)
{
	uint64_t total = 0;
	double *wx = malloc(n * sizeof(*wx));
	int *live = malloc(n * sizeof(*live));

	for (size_t j = 0; sizes && j < n; j++)
		total += sizes[j];
	for (size_t j = 0; j < n; j++) {
		wx[j] = sizes ? (double)sizes[j] / (double)total : w[j];
		cur[j] = 0;
		live[j] = 1;
	}
	if (sizes)
		size = total;
	for (uint64_t s = 0; s < size; s++) {
		double sd = s > 1 ? (double)s : 1.0, max = -INFINITY;
		size_t best = 0;

		for (size_t j = 0; j < n; j++) {
			double e = wx[j] * sd - (double)cur[j];

			if (live[j] && e > max) {
				max = e;
				best = j;
			}
		}
		di[s] = (uint16_t)best;
		si[s] = cur[best]++;
		if (sizes && cur[best] == sizes[best])
			live[best] = 0;
	}
	free(wx);
	free(live);
}

static unsigned long long rng_state = 88172645463325252ull;

static uint64_t rnd(uint64_t lo, uint64_t hi) /* [lo, hi] */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return lo + rng_state % (hi - lo + 1);
}

/* Every chunking against the reference; the steps run again to join the
 * chunks of the most threads with the smallest chunks. */
static uint64_t check(const char *what, const double *w, const uint64_t *sizes, size_t n,
		      uint64_t size)
{
	static const unsigned threads[] = { 1, 2, 3, 8 };
	static const uint64_t chunks[] = { 1, 7, 1000 };
	uint64_t total = sizes ? 0 : size, *want_cur = calloc(n, sizeof(uint64_t)), *cur, mended = 0;
	uint16_t *want_di, *di;
	uint64_t *want_si, *si;

	for (size_t j = 0; sizes && j < n; j++)
		total += sizes[j];
	want_di = malloc(total * sizeof(*want_di) + 2);
	want_si = malloc(total * sizeof(*want_si) + 8);
	di = malloc(total * sizeof(*di) + 2);
	si = malloc(total * sizeof(*si) + 8);
	cur = calloc(n, sizeof(*cur));
	reference(want_di, want_si, w, sizes, n, size, want_cur);
	for (size_t t = 0; t < sizeof(threads) / sizeof(*threads); t++)
		for (size_t c = 0; c < sizeof(chunks) / sizeof(*chunks); c++) {
			uint64_t m;

			memset(di, 0xff, total * sizeof(*di));
			memset(si, 0xff, total * sizeof(*si));
			assert(mg_blend_indices(di, si, w, sizes, n, size, cur, threads[t], chunks[c],
						&m) == 0);
			for (uint64_t s = 0; s < total; s++)
				if (di[s] != want_di[s] || si[s] != want_si[s]) {
					fprintf(stderr, "%s: %u threads, chunks of %" PRIu64 " or more: "
						"step %" PRIu64 " picks %u/%" PRIu64 ", the loop %u/%" PRIu64
						"\n", what, threads[t], chunks[c], s, di[s], si[s],
						want_di[s], want_si[s]);
					abort();
				}
			assert(memcmp(cur, want_cur, n * sizeof(*cur)) == 0);
			if (threads[t] == 8 && chunks[c] == 1000)
				mended = m;
			if (threads[t] == 1)
				assert(m == 0);
		}
	printf("%s: %zu parts, %" PRIu64 " samples: chunks joined after %" PRIu64 " steps\n",
	       what, n, total, mended);
	free(want_cur);
	free(want_di);
	free(want_si);
	free(di);
	free(si);
	free(cur);
	return mended;
}

int main(void)
{
	uint64_t sizes[1000], m;
	double w[1000], sum;

	/* megatron-like: 64 prefixes of 500-1500 samples; joined in few steps */
	for (size_t j = 0; j < 64; j++)
		sizes[j] = rnd(500, 1500);
	m = check("exhaustive, 64 parts", NULL, sizes, 64, 0);
	assert(m < 7 * 1000 / 4);
	/* equal sizes: every step a tie between several parts */
	for (size_t j = 0; j < 10; j++)
		sizes[j] = 1000;
	check("exhaustive, 10 equal parts", NULL, sizes, 10, 0);
	/* one part; two very unlike; fewer samples than threads */
	sizes[0] = 5000;
	check("exhaustive, 1 part", NULL, sizes, 1, 0);
	sizes[0] = 1;
	sizes[1] = 20000;
	check("exhaustive, 1 and 20000", NULL, sizes, 2, 0);
	sizes[0] = 2;
	sizes[1] = 1;
	sizes[2] = 1;
	check("exhaustive, 4 samples", NULL, sizes, 3, 0);
	/* many small parts, spent at different steps */
	for (size_t j = 0; j < 1000; j++)
		sizes[j] = rnd(1, 50);
	check("exhaustive, 1000 parts", NULL, sizes, 1000, 0);
	/* weights (normalised, as the caller gives them) */
	sum = 0;
	for (size_t j = 0; j < 64; j++)
		sum += w[j] = (double)rnd(1, 1000);
	for (size_t j = 0; j < 64; j++)
		w[j] /= sum;
	m = check("weighted, 64 parts", w, NULL, 64, 70000);
	assert(m < 7 * 1000 / 4);
	for (size_t j = 0; j < 3; j++)
		w[j] = 1.0 / 3;
	check("weighted, 3 equal parts", w, NULL, 3, 30000);
	w[0] = 1e-6;
	w[1] = 1 - 1e-6;
	check("weighted, 1e-6 and the rest", w, NULL, 2, 30000);
	w[0] = 0.3;
	w[1] = 0.7;
	check("weighted, 5 samples", w, NULL, 2, 5);
	printf("test-blend-index: ok\n");
	return 0;
}
