/* SPDX-License-Identifier: MIT */
/* nprandom - numpy's legacy numpy.random.RandomState(seed), as far as megatron-core uses it
 *
 * MT19937 seeded by init_genrand (RandomState(int)), and shuffle() of a 1-D
 * array: for i from n-1 down to 1, swap i with j = random_interval(i), the
 * bounded integer found by masking 32-bit (or, above 2^32-1, 64-bit) draws
 * and rejecting those above i. The same draws give the same permutation as
 * numpy, whatever the element type.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct nprandom {
	uint32_t key[624];            /* the state */
	uint32_t out[624];            /* key tempered: the next outputs from out[pos] */
	int pos;
};

void nprandom_seed(struct nprandom *st, uint32_t seed);
uint32_t nprandom_next32(struct nprandom *st);
/* numpy's random_interval(): a uniform integer in [0, max]. */
uint64_t nprandom_interval(struct nprandom *st, uint64_t max);
/* RandomState.shuffle() of a 1-D array of int32 or int64. */
void nprandom_shuffle32(struct nprandom *st, int32_t *a, size_t n);
void nprandom_shuffle64(struct nprandom *st, int64_t *a, size_t n);
