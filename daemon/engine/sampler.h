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
 *
 * Elastic resume (docs/spec.md, "Partition"): tail_start > 0 says positions
 * [0, tail_start) of epoch tail_epoch were read before (at another world
 * size, say). In that epoch rank r takes positions tail_start + r + w*j (mod n:
 * the padding wraps to the epoch's first positions, as above), ceil((n -
 * tail_start)/w) of them (drop_last: floor), as the LAST batches of the epoch:
 * batches [0, skip) of it are empty, so that epoch e still spans batches
 * [e*bpe, (e+1)*bpe) of the stream and every other epoch is the plain share.
 */
struct sampler_windows;

struct sampler {
	uint64_t nsamples;
	uint32_t batch_size;
	bool shuffle;
	bool drop_last;
	uint64_t seed;
	uint32_t rank;
	uint32_t world;
	uint64_t tail_epoch;      /* with tail_start > 0: the epoch that is a tail */
	uint64_t tail_start;      /* its first position (<= nsamples), 0: none */
	/* with shuffle: the spec's shuffle_window (docs/spec.md, "Shuffle
	 * windows"), owned by the pipeline; NULL: the plain permutation */
	struct sampler_windows *windows;
};

/* Samples in one epoch of this rank's share. */
uint64_t sampler_samples_per_epoch(const struct sampler *s);
/* Batches in one epoch of this rank's share. */
uint64_t sampler_batches_per_epoch(const struct sampler *s);
/* Rows in batch @batch (batch_size except for a short last one). */
uint32_t sampler_batch_rows(const struct sampler *s, uint64_t batch);
/* Samples of this rank's share in epoch @epoch (its tail, or the plain share). */
uint64_t sampler_epoch_samples(const struct sampler *s, uint64_t epoch);
/* Batches of epoch @epoch this rank skips (its tail's: bpe - tail's batches; else 0). */
uint64_t sampler_epoch_skip(const struct sampler *s, uint64_t epoch);
/* Rows of batch @batch of epoch @epoch (0 for a skipped one and past the end). */
uint32_t sampler_epoch_rows(const struct sampler *s, uint64_t epoch, uint64_t batch);
/* Dataset index of row @row of batch @batch in epoch @epoch. */
uint64_t sampler_sample(const struct sampler *s, uint64_t epoch, uint64_t batch, uint32_t row);
/* The epoch's permutation of [0, n): position -> dataset index. */
uint64_t sampler_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t pos);

/*
 * A shuffle that mixes the samples of @window shards at a time, so that a
 * stream reads each shard in one stretch of the epoch (docs/spec.md,
 * "Shuffle windows"). @first: nshards + 1 entries, the first sample of each
 * shard, the last the number of samples (copied). NULL: no memory.
 */
struct sampler_windows *sampler_windows_new(const uint64_t *first, uint32_t nshards,
					    uint32_t window);
void sampler_windows_free(struct sampler_windows *w);
/* The windowed permutation of epoch @epoch: position -> dataset index. Thread-safe. */
uint64_t sampler_windows_permute(struct sampler_windows *w, uint64_t seed, uint64_t epoch,
				 uint64_t pos);
