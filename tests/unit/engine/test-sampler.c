/* SPDX-License-Identifier: MIT */
/* test-sampler - permutation, partition and batch arithmetic */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

static void check_bijection(uint64_t seed, uint64_t epoch, uint64_t n)
{
	unsigned char *seen = calloc(n, 1);
	uint64_t fixed = 0;

	assert(seen);
	for (uint64_t p = 0; p < n; p++) {
		uint64_t x = sampler_permute(seed, epoch, n, p);
		assert(x < n);
		assert(!seen[x]);
		seen[x] = 1;
		fixed += x == p;
	}
	/* a shuffle of a large set is not close to the identity */
	if (n >= 1000)
		assert(fixed < n / 100);
	free(seen);
}

static void test_permute(void)
{
	static const uint64_t ns[] = { 1, 2, 3, 4, 5, 7, 16, 17, 1000, 1024, 65537 };
	static const uint64_t seeds[] = { 0, 1, 7, 0xdeadbeefcafef00dull };

	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
		for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++)
			for (uint64_t e = 0; e < 3; e++)
				check_bijection(seeds[s], e, ns[i]);
	assert(sampler_permute(5, 5, 1, 0) == 0);

	/* reproducible; epochs and seeds differ */
	uint64_t same = 0, diff_epoch = 0, diff_seed = 0;
	for (uint64_t p = 0; p < 1000; p++) {
		uint64_t a = sampler_permute(7, 0, 1000, p);
		same += a == sampler_permute(7, 0, 1000, p);
		diff_epoch += a != sampler_permute(7, 1, 1000, p);
		diff_seed += a != sampler_permute(8, 0, 1000, p);
	}
	assert(same == 1000);
	assert(diff_epoch > 900);
	assert(diff_seed > 900);

	/* huge n: still in range and injective on a sample */
	uint64_t big = (1ull << 40) + 12345;
	for (uint64_t p = 0; p < 1000; p++)
		assert(sampler_permute(1, 2, big, p) < big);
	assert(sampler_permute(1, 2, UINT64_MAX, 3) < UINT64_MAX);
}

static void test_identity(void)
{
	struct sampler s = { .nsamples = 10, .batch_size = 4, .shuffle = false, .world = 1 };

	assert(sampler_samples_per_epoch(&s) == 10);
	assert(sampler_batches_per_epoch(&s) == 3);
	assert(sampler_batch_rows(&s, 0) == 4);
	assert(sampler_batch_rows(&s, 1) == 4);
	assert(sampler_batch_rows(&s, 2) == 2);
	assert(sampler_batch_rows(&s, 3) == 0);
	for (uint64_t b = 0; b < 3; b++)
		for (uint32_t r = 0; r < sampler_batch_rows(&s, b); r++)
			assert(sampler_sample(&s, 5, b, r) == b * 4 + r);

	s.drop_last = true;
	assert(sampler_batches_per_epoch(&s) == 2);
	assert(sampler_batch_rows(&s, 1) == 4);
	assert(sampler_batch_rows(&s, 2) == 0);

	/* world 0 is world 1 */
	s.world = 0;
	s.drop_last = false;
	assert(sampler_samples_per_epoch(&s) == 10);
	assert(sampler_sample(&s, 0, 2, 1) == 9);

	/* shuffled order is the same permutation whatever the batch size */
	struct sampler a = { .nsamples = 100, .batch_size = 7, .shuffle = true, .seed = 3, .world = 1 };
	struct sampler b = a;
	b.batch_size = 10;
	for (uint64_t j = 0; j < 100; j++)
		assert(sampler_sample(&a, 2, j / 7, (uint32_t)(j % 7)) ==
		       sampler_sample(&b, 2, j / 10, (uint32_t)(j % 10)));
}

static void check_partition(bool shuffle, bool drop_last)
{
	const uint64_t n = 10;
	const uint32_t world = 3;
	unsigned count[10] = { 0 };
	uint64_t spe0 = 0, total = 0;

	for (uint32_t rank = 0; rank < world; rank++) {
		struct sampler s = { .nsamples = n, .batch_size = 2, .shuffle = shuffle,
				     .drop_last = drop_last, .seed = 11, .rank = rank,
				     .world = world };
		uint64_t spe = sampler_samples_per_epoch(&s), rows = 0;

		assert(spe == (drop_last ? 3 : 4));
		if (rank == 0)
			spe0 = spe;
		assert(spe == spe0);
		assert(sampler_batches_per_epoch(&s) == (drop_last ? 1 : 2));
		for (uint64_t b = 0; b < sampler_batches_per_epoch(&s); b++) {
			uint32_t nr = sampler_batch_rows(&s, b);
			assert(nr == 2);
			for (uint32_t r = 0; r < nr; r++) {
				uint64_t idx = sampler_sample(&s, 1, b, r);
				uint64_t j = b * 2 + r;
				uint64_t p = (rank + (uint64_t)world * j) % n;

				assert(idx < n);
				assert(idx == (shuffle ? sampler_permute(11, 1, n, p) : p));
				count[idx]++;
				rows++;
			}
		}
		total += rows;
		assert(rows == spe - (drop_last ? spe % 2 : 0));
	}
	if (!drop_last) {
		/* 12 positions over 10 samples: all covered, two padded repeats */
		for (uint64_t i = 0; i < n; i++)
			assert(count[i] >= 1);
		assert(total == 12);
	} else {
		/* 3 ranks * 1 batch * 2 rows, disjoint */
		for (uint64_t i = 0; i < n; i++)
			assert(count[i] <= 1);
		assert(total == 6);
	}
}

static void test_partition(void)
{
	check_partition(false, false);
	check_partition(true, false);
	check_partition(false, true);
	check_partition(true, true);

	/* n divisible by world: disjoint and complete */
	const uint64_t n = 12;
	unsigned count[12] = { 0 };
	for (uint32_t rank = 0; rank < 4; rank++) {
		struct sampler s = { .nsamples = n, .batch_size = 2, .shuffle = true, .seed = 5,
				     .rank = rank, .world = 4 };
		assert(sampler_samples_per_epoch(&s) == 3);
		assert(sampler_batches_per_epoch(&s) == 2);
		assert(sampler_batch_rows(&s, 1) == 1);
		for (uint64_t b = 0; b < 2; b++)
			for (uint32_t r = 0; r < sampler_batch_rows(&s, b); r++)
				count[sampler_sample(&s, 0, b, r)]++;
	}
	for (uint64_t i = 0; i < n; i++)
		assert(count[i] == 1);
}

int main(void)
{
	test_permute();
	test_identity();
	test_partition();
	printf("test-sampler: ok\n");
	return 0;
}
