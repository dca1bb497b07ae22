/* SPDX-License-Identifier: MIT */
/* nprandom - numpy's legacy RandomState: MT19937 and shuffle (nprandom.h) */
#include "nprandom.h"

#define MT_N 624
#define MT_M 397

void nprandom_seed(struct nprandom *st, uint32_t seed)
{
	for (int i = 0; i < MT_N; i++) {
		st->key[i] = seed;
		seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)i + 1;
	}
	st->pos = MT_N;
}

/* The next 624 outputs at once: the state's next generation, tempered
 * into out[] (both loops vectorise; a draw is then one load). */
static void mt_generate(struct nprandom *st)
{
	uint32_t *k = st->key, y;
	int i;

	for (i = 0; i < MT_N - MT_M; i++) {
		y = (k[i] & 0x80000000u) | (k[i + 1] & 0x7fffffffu);
		k[i] = k[i + MT_M] ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
	}
	for (; i < MT_N - 1; i++) {
		y = (k[i] & 0x80000000u) | (k[i + 1] & 0x7fffffffu);
		k[i] = k[i + (MT_M - MT_N)] ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
	}
	y = (k[MT_N - 1] & 0x80000000u) | (k[0] & 0x7fffffffu);
	k[MT_N - 1] = k[MT_M - 1] ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
	for (i = 0; i < MT_N; i++) {
		y = k[i];
		y ^= y >> 11;
		y ^= (y << 7) & 0x9d2c5680u;
		y ^= (y << 15) & 0xefc60000u;
		y ^= y >> 18;
		st->out[i] = y;
	}
	st->pos = 0;
}

uint32_t nprandom_next32(struct nprandom *st)
{
	if (__builtin_expect(st->pos == MT_N, 0))
		mt_generate(st);
	return st->out[st->pos++];
}

uint64_t nprandom_interval(struct nprandom *st, uint64_t max)
{
	uint64_t mask, v;

	if (max == 0)
		return 0;
	mask = ~0ULL >> __builtin_clzll(max);  /* all ones up to max's top bit */
	if (max <= 0xffffffffu) {
		while ((v = (nprandom_next32(st) & mask)) > max)
			;
	} else {
		do {
			v = (uint64_t)nprandom_next32(st) << 32;
			v |= nprandom_next32(st);
			v &= mask;
		} while (v > max);
	}
	return v;
}

/*
 * Fisher-Yates as numpy's _shuffle_raw, with the draws made AHEAD steps
 * early: they depend on nothing but the state, so making them first keeps
 * numpy's sequence, and the element each will swap is prefetched by then.
 * On an array larger than the caches a swap otherwise waits for memory.
 */
#define AHEAD 32
#define SHUFFLE(name, T)                                                         \
	void name(struct nprandom *st, T *a, size_t n)                           \
	{                                                                        \
		size_t js[AHEAD], next;                                          \
		if (n < 2)                                                       \
			return;                                                  \
		next = n - 1;                                                    \
		for (size_t k = 0; k < AHEAD && next >= 1; k++, next--) {      \
			js[k] = (size_t)nprandom_interval(st, next);             \
			__builtin_prefetch(&a[js[k]], 1);                        \
		}                                                                \
		for (size_t i = n - 1, k = 0; i >= 1; i--, k = (k + 1) % AHEAD) {\
			size_t j = js[k];                                        \
			T t = a[i];                                              \
			a[i] = a[j];                                             \
			a[j] = t;                                                \
			if (next >= 1) {                                         \
				js[k] = (size_t)nprandom_interval(st, next--);   \
				__builtin_prefetch(&a[js[k]], 1);                \
			}                                                        \
		}                                                                \
	}
SHUFFLE(nprandom_shuffle32, int32_t)
SHUFFLE(nprandom_shuffle64, int64_t)
