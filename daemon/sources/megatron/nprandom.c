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
 * The swap partners of the next @cnt steps of a shuffle, from @i down (i,
 * i - 1, ...; every one >= 1 and below 2^32): numpy's random_interval() of
 * each, without a branch on its rejections. Each output, masked, is stored
 * as the current step's partner, and the step moves on only when it is at
 * most the step's bound (a rejected one is overwritten by the next): the
 * same draws and the same partners as numpy's loop, and no rejection is a
 * mispredicted branch (they were a third of a shuffle).
 */
static void partners(struct nprandom *st, uint64_t i, uint32_t *js, size_t cnt)
{
	size_t k = 0;

	while (k < cnt) {
		int pos = st->pos;

		if (pos == MT_N) {
			mt_generate(st);
			pos = 0;
		}
		for (; pos < MT_N && k < cnt; pos++) {
			uint32_t max = (uint32_t)(i - k);
			uint32_t v = st->out[pos] & (0xffffffffu >> __builtin_clz(max));

			js[k] = v;
			k += v <= max;
		}
		st->pos = pos;
	}
}

/*
 * Fisher-Yates as numpy's _shuffle_raw: for i from n - 1 down to 1, swap
 * a[i] and a[random_interval(i)]; the partners made BLOCK steps at a time
 * (partners()), and the element each will swap prefetched 16 steps early
 * (an array larger than the caches otherwise waits for memory). Steps above
 * 2^32 - 1 (64-bit draws) one at a time.
 */
#define BLOCK 512
#define SHUFFLE(name, T)                                                         \
	void name(struct nprandom *st, T *a, size_t n)                           \
	{                                                                        \
		uint32_t js[BLOCK];                                              \
		size_t i = n - 1;                                                \
		if (n < 2)                                                       \
			return;                                                  \
		for (; i > 0xffffffffu; i--) {                                   \
			size_t j = (size_t)nprandom_interval(st, i);             \
			T t = a[i];                                              \
			a[i] = a[j];                                             \
			a[j] = t;                                                \
		}                                                                \
		while (i >= 1) {                                                 \
			size_t cnt = i < BLOCK ? i : BLOCK;                      \
			partners(st, i, js, cnt);                                \
			for (size_t k = 0; k < cnt; k++, i--) {                  \
				size_t j = js[k];                                \
				T t = a[i];                                      \
				if (k + 16 < cnt)                                \
					__builtin_prefetch(&a[js[k + 16]], 1);   \
				a[i] = a[j];                                     \
				a[j] = t;                                        \
			}                                                        \
		}                                                                \
	}
SHUFFLE(nprandom_shuffle32, int32_t)
SHUFFLE(nprandom_shuffle64, int64_t)
