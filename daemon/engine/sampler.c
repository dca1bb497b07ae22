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

uint64_t sampler_samples_per_epoch(const struct sampler *s)
{
	uint64_t w = world_of(s);

	if (s->drop_last)
		return s->nsamples / w;
	return s->nsamples / w + (s->nsamples % w != 0);
}

uint64_t sampler_batches_per_epoch(const struct sampler *s)
{
	uint64_t spe = sampler_samples_per_epoch(s), b = s->batch_size ? s->batch_size : 1;

	if (s->drop_last)
		return spe / b;
	return spe / b + (spe % b != 0);
}

uint32_t sampler_batch_rows(const struct sampler *s, uint64_t batch)
{
	uint64_t spe = sampler_samples_per_epoch(s), b = s->batch_size ? s->batch_size : 1;

	if (batch >= sampler_batches_per_epoch(s))
		return 0;
	if (spe - batch * b >= b)
		return (uint32_t)b;
	return (uint32_t)(spe - batch * b);
}

uint64_t sampler_sample(const struct sampler *s, uint64_t epoch, uint64_t batch, uint32_t row)
{
	uint64_t n = s->nsamples, j, p;

	if (n == 0)
		return 0;
	j = batch * (s->batch_size ? s->batch_size : 1) + row;
	p = (s->rank + world_of(s) * j) % n;
	return s->shuffle ? sampler_permute(s->seed, epoch, n, p) : p;
}
