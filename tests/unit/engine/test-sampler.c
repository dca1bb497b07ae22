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

/*
 * Elastic resume: @w ranks read @k batches of epoch 1 in lockstep, then @w2
 * ranks take the tail from the global position k*b*w. Every position of the
 * epoch is read once, but for the padding: positions [0, pad) of the epoch
 * once more (drop_last: [p, p + tail) once, the rest never).
 */
static void check_tail(uint64_t n, uint32_t b, uint32_t w, uint64_t k, uint32_t w2, bool drop_last)
{
	unsigned *count = calloc(n, sizeof(*count));
	uint64_t pos = k * b * w, total = 0, tail_batches = UINT64_MAX;

	assert(count);
	for (uint32_t r = 0; r < w; r++) {
		struct sampler s = { .nsamples = n, .batch_size = b, .drop_last = drop_last,
				     .rank = r, .world = w };
		for (uint64_t i = 0; i < k; i++) {
			assert(sampler_batch_rows(&s, i) == b);
			for (uint32_t row = 0; row < b; row++)
				count[sampler_sample(&s, 1, i, row)]++;
		}
	}
	for (uint32_t r = 0; r < w2; r++) {
		struct sampler s = { .nsamples = n, .batch_size = b, .drop_last = drop_last,
				     .rank = r, .world = w2, .tail_epoch = 1, .tail_start = pos };
		struct sampler sh = s, plain = s;
		uint64_t bpe = sampler_batches_per_epoch(&s), skip = sampler_epoch_skip(&s, 1);
		uint64_t rows = 0;

		sh.shuffle = true;
		sh.seed = 9;
		plain.tail_start = 0;
		assert(skip <= bpe);
		assert(sampler_epoch_skip(&s, 0) == 0 && sampler_epoch_skip(&s, 2) == 0);
		if (tail_batches == UINT64_MAX)
			tail_batches = bpe - skip;
		assert(bpe - skip == tail_batches); /* lockstep: every rank as many */
		for (uint64_t i = 0; i < bpe; i++) {
			uint32_t nr = sampler_epoch_rows(&s, 1, i);
			/* the other epochs are the plain share */
			assert(sampler_epoch_rows(&s, 2, i) == sampler_batch_rows(&plain, i));
			assert(sampler_sample(&s, 0, i, 0) == sampler_sample(&plain, 0, i, 0));
			assert(i >= skip || nr == 0);
			for (uint32_t row = 0; row < nr; row++) {
				uint64_t p = sampler_sample(&s, 1, i, row);
				assert(p == (pos + r + (uint64_t)w2 * ((i - skip) * b + row)) % n);
				assert(sampler_sample(&sh, 1, i, row) == sampler_permute(9, 1, n, p));
				count[p]++;
				rows++;
			}
		}
		assert(rows == sampler_epoch_samples(&s, 1) - (drop_last ? sampler_epoch_samples(&s, 1) % b : 0));
		total += rows;
	}
	if (!drop_last) {
		uint64_t pad = total - (n - pos);

		assert(total == (n - pos + w2 - 1) / w2 * w2);
		for (uint64_t i = 0; i < n; i++)
			assert(count[i] == 1 + (i < pad));
	} else {
		uint64_t end = pos + total;

		assert(total == (n - pos) / w2 / b * b * w2);
		for (uint64_t i = 0; i < n; i++)
			assert(count[i] == (i < end));
	}
	free(count);
}

static void test_tail(void)
{
	/* 8 -> 4, 8 -> 6: even, padded, short last batches, drop_last */
	check_tail(96, 2, 8, 3, 4, false);
	check_tail(96, 2, 8, 3, 6, false);
	check_tail(100, 3, 8, 2, 6, false);
	check_tail(100, 3, 8, 2, 6, true);
	check_tail(101, 4, 8, 1, 4, true);
	check_tail(37, 2, 3, 2, 5, false);
	check_tail(37, 2, 3, 2, 5, true);
	/* the same world: the tail is the rest of the plain share */
	check_tail(50, 3, 4, 2, 4, false);
	/* a tail shorter than the world: each padded sample once more at most */
	check_tail(19, 2, 4, 2, 8, false);
	/* nothing left: every rank skips the whole epoch */
	check_tail(32, 2, 4, 4, 3, false);

	/* a tail from a tail (8 -> 4 -> 6) is the tail from where the second
	 * world stopped: the same positions */
	struct sampler a = { .nsamples = 200, .batch_size = 3, .rank = 2, .world = 4,
			     .tail_epoch = 0, .tail_start = 48 };
	struct sampler c = a;
	c.tail_start = 48 + 2 * 3 * 4;
	uint64_t sa = sampler_epoch_skip(&a, 0), sc = sampler_epoch_skip(&c, 0);
	assert(sc == sa + 2);
	for (uint64_t i = sc; i < sampler_batches_per_epoch(&a); i++)
		for (uint32_t row = 0; row < sampler_epoch_rows(&a, 0, i); row++)
			assert(sampler_sample(&a, 0, i, row) == sampler_sample(&c, 0, i, row));
}

/* Shuffle windows: a bijection per epoch, and a stretch of the order that
 * covers a window reads only that window's shards (docs/spec.md). */
static void test_windows(void)
{
	/* shard sizes 3, 0, 5, 1, 4, 0, 2, 7: 22 samples, an empty shard or two */
	static const uint64_t first[] = { 0, 3, 3, 8, 9, 13, 13, 15, 22 };
	static const uint32_t windows[] = { 1, 2, 3, 8, 100 };
	uint64_t n = 22;

	for (size_t wi = 0; wi < sizeof(windows) / sizeof(windows[0]); wi++) {
		struct sampler_windows *w = sampler_windows_new(first, 8, windows[wi]);

		assert(w);
		for (uint64_t e = 0; e < 6; e++) {
			unsigned char seen[22] = { 0 }, done[8] = { 0 };
			unsigned runs = 0;
			int last = -1;

			for (uint64_t p = 0; p < n; p++) {
				uint64_t x = sampler_windows_permute(w, 7, e, p);
				int k = 0;

				assert(x < n && !seen[x]);
				seen[x] = 1;
				while (first[k + 1] <= x)
					k++;
				if (k != last) {
					/* window 1: each shard's samples in one run */
					assert(windows[wi] != 1 || !done[k]);
					if (last >= 0)
						done[last] = 1;
					last = k;
					runs++;
				}
			}
			if (windows[wi] == 1)
				assert(runs == 6); /* the non-empty shards */
		}
		/* same answers again, from a table made again (epochs 6.. evict) */
		for (uint64_t e = 6; e < 12; e++)
			(void)sampler_windows_permute(w, 7, e, 0);
		assert(sampler_windows_permute(w, 7, 0, 5) == sampler_windows_permute(w, 7, 0, 5));
		sampler_windows_free(w);
	}

	/* through the sampler: a partition of 3 still covers every sample once */
	{
		struct sampler_windows *w = sampler_windows_new(first, 8, 2);
		unsigned char seen[22] = { 0 };
		uint64_t got = 0;

		for (uint32_t r = 0; r < 3; r++) {
			struct sampler s = { .nsamples = n, .batch_size = 4, .shuffle = true,
					     .drop_last = true, .seed = 3, .rank = r, .world = 3,
					     .windows = w };

			for (uint64_t b = 0; b < sampler_batches_per_epoch(&s); b++)
				for (uint32_t row = 0; row < sampler_batch_rows(&s, b); row++) {
					uint64_t x = sampler_sample(&s, 1, b, row);

					assert(x < n && !seen[x]);
					seen[x] = 1;
					got++;
				}
		}
		assert(got == 3 * 4); /* floor(22 / 3) = 7 a rank: one full batch */
		sampler_windows_free(w);
	}
}

int main(void)
{
	test_permute();
	test_identity();
	test_partition();
	test_tail();
	test_windows();
	printf("test-sampler: ok\n");
	return 0;
}
