/* SPDX-License-Identifier: MIT */
/* sampler - which samples make batch b of epoch e for rank r of w */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/*
 * The order of an epoch is a pseudo-random permutation of [0, n) drawn from
 * (seed, epoch) alone, computed per index (no table), so any worker can place
 * any row and results never depend on the number of workers. Partition follows
 * torch's DistributedSampler: rank r of w takes positions r, r+w, r+2w... of the
 * epoch's order, padded by wrapping around to ceil(n/w) samples per rank
 * (drop_last: floor(n/w)); then batches of batch_size rows from that share.
 */
struct sampler {
	uint64_t nsamples;
	uint32_t batch_size;
	bool shuffle;
	bool drop_last;
	uint64_t seed;
	uint32_t rank;
	uint32_t world;
};

/* Samples in one epoch of this rank's share. */
uint64_t sampler_samples_per_epoch(const struct sampler *s);
/* Batches in one epoch of this rank's share. */
uint64_t sampler_batches_per_epoch(const struct sampler *s);
/* Rows in batch @batch (batch_size except for a short last one). */
uint32_t sampler_batch_rows(const struct sampler *s, uint64_t batch);
/* Dataset index of row @row of batch @batch in epoch @epoch. */
uint64_t sampler_sample(const struct sampler *s, uint64_t epoch, uint64_t batch, uint32_t row);
/* The epoch's permutation of [0, n): position -> dataset index. */
uint64_t sampler_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t pos);
