/* SPDX-License-Identifier: MIT */
/* sampler - which samples make batch b of epoch e for rank r of w */

/*
 * The epoch's order is a keyed permutation computed per index, so a worker
 * can place any row of any batch without a table shared between threads and
 * without O(n) memory, and the result never depends on which worker asked.
 *
 * The permutation is a balanced Feistel network over the smallest even bit
 * width 2h >= log2(n) (at least 2 bits), with cycle-walking: a value that
 * falls outside [0, n) is encrypted again until it lands inside. As the domain
 * is less than 4n, a walk takes under 4 steps on average. docs/spec.md gives
 * the exact definition so that others can reimplement it bit for bit.
 */
#include "common.h"
#include "sampler.h"

#define FEISTEL_ROUNDS 8


uint64_t sampler_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t pos)
{
	uint64_t keys[FEISTEL_ROUNDS];
	uint64_t base, mask, x;
	unsigned bits, half;

	if (n <= 1)
		return n == 1 ? 0 : pos;
	bits = 64 - (unsigned)__builtin_clzll(n - 1); /* ceil(log2(n)) */
	bits += bits & 1;
	if (bits < 2)
		bits = 2;
	half = bits / 2;
	mask = (half == 64) ? ~0ull : (1ull << half) - 1;

	base = splitmix64(splitmix64(seed) ^ epoch);
	for (unsigned r = 0; r < FEISTEL_ROUNDS; r++)
		keys[r] = splitmix64(base + r);

	x = pos % n;
	do {
		uint64_t l = x >> half, rr = x & mask;

		for (unsigned r = 0; r < FEISTEL_ROUNDS; r++) {
			uint64_t t = l ^ (mix64(rr ^ keys[r]) & mask);
			l = rr;
			rr = t;
		}
		x = (l << half) | rr;
	} while (x >= n);
	return x;
}

static inline uint64_t world_of(const struct sampler *s)
{
	return s->world ? s->world : 1;
}

/* Samples of a share of @n positions split over @w ranks. */
static uint64_t share_samples(uint64_t n, uint64_t w, bool drop_last)
{
	return drop_last ? n / w : n / w + (n % w != 0);
}

/* Batches of @spe samples. */
static uint64_t share_batches(const struct sampler *s, uint64_t spe)
{
	uint64_t b = s->batch_size ? s->batch_size : 1;

	return s->drop_last ? spe / b : spe / b + (spe % b != 0);
}

static inline bool is_tail(const struct sampler *s, uint64_t epoch)
{
	return s->tail_start && epoch == s->tail_epoch;
}

uint64_t sampler_samples_per_epoch(const struct sampler *s)
{
	return share_samples(s->nsamples, world_of(s), s->drop_last);
}

uint64_t sampler_batches_per_epoch(const struct sampler *s)
{
	return share_batches(s, sampler_samples_per_epoch(s));
}

uint64_t sampler_epoch_samples(const struct sampler *s, uint64_t epoch)
{
	if (!is_tail(s, epoch))
		return sampler_samples_per_epoch(s);
	if (s->tail_start >= s->nsamples)
		return 0;
	return share_samples(s->nsamples - s->tail_start, world_of(s), s->drop_last);
}

uint64_t sampler_epoch_skip(const struct sampler *s, uint64_t epoch)
{
	if (!is_tail(s, epoch))
		return 0;
	/* a tail's share is never longer than the plain one's */
	return sampler_batches_per_epoch(s) - share_batches(s, sampler_epoch_samples(s, epoch));
}

/* Rows of batch @batch of a share of @spe samples. */
static uint32_t share_rows(const struct sampler *s, uint64_t spe, uint64_t batch)
{
	uint64_t b = s->batch_size ? s->batch_size : 1;

	if (batch >= share_batches(s, spe))
		return 0;
	if (spe - batch * b >= b)
		return (uint32_t)b;
	return (uint32_t)(spe - batch * b);
}

uint32_t sampler_batch_rows(const struct sampler *s, uint64_t batch)
{
	return share_rows(s, sampler_samples_per_epoch(s), batch);
}

uint32_t sampler_epoch_rows(const struct sampler *s, uint64_t epoch, uint64_t batch)
{
	uint64_t skip = sampler_epoch_skip(s, epoch);

	if (batch < skip)
		return 0;
	return share_rows(s, sampler_epoch_samples(s, epoch), batch - skip);
}

uint64_t sampler_sample(const struct sampler *s, uint64_t epoch, uint64_t batch, uint32_t row)
{
	uint64_t n = s->nsamples, j, p, start = 0;

	if (n == 0)
		return 0;
	if (is_tail(s, epoch)) {
		batch -= sampler_epoch_skip(s, epoch);
		start = s->tail_start;
	}
	j = batch * (s->batch_size ? s->batch_size : 1) + row;
	p = (s->rank + world_of(s) * j) % n;
	start %= n;
	p = p >= n - start ? p - (n - start) : p + start; /* (start + p) mod n */
	return s->shuffle ? sampler_permute(s->seed, epoch, n, p) : p;
}
