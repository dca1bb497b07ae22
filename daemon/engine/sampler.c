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
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
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
	if (!s->shuffle)
		return p;
	if (s->windows)
		return sampler_windows_permute(s->windows, s->seed, epoch, p);
	return sampler_permute(s->seed, epoch, n, p);
}

/* ---- shuffle windows (docs/spec.md, "Shuffle windows") ---- */

/*
 * An epoch's layout of the windows depends on its shard order, so finding
 * the window of a position needs the prefix sums of the shards' sizes in
 * that order: a table of K entries, made once per epoch rather than per
 * index. The tables of the last WINDOW_TABLES epochs are kept, each in a
 * slot whose buffers live as long as the pipeline. A lookup takes no lock:
 * each slot is a sequence lock (its count odd while the slot is rewritten,
 * under the mutex, by the first worker that needs another epoch there); a
 * reader copies what it needs out of the slot and tries again if the
 * count moved meanwhile. A mutex per lookup made two workers 4x slower
 * than one.
 */
#define WINDOW_TABLES 4
#define WINDOW_KEY 0x77696e646f777321ull /* "window!" */

struct window_table {
	atomic_uint_fast64_t seq;  /* odd: being rewritten */
	_Atomic uint64_t seed, epoch;
	atomic_bool valid;
	_Atomic uint32_t *order;   /* slot i -> shard */
	_Atomic uint64_t *cum;     /* samples of slots [0, i), K + 1 entries */
};

struct sampler_windows {
	pthread_mutex_t lock;      /* one writer of a slot at a time */
	uint32_t nshards, window;
	uint64_t *first;
	struct window_table tab[WINDOW_TABLES];
};

struct sampler_windows *sampler_windows_new(const uint64_t *first, uint32_t nshards,
					    uint32_t window)
{
	struct sampler_windows *w = calloc(1, sizeof(*w));

	if (!w || !nshards || !window)
		return free(w), NULL;
	pthread_mutex_init(&w->lock, NULL);
	w->nshards = nshards;
	w->window = window < nshards ? window : nshards;
	w->first = malloc(((size_t)nshards + 1) * sizeof(*w->first));
	if (!w->first)
		return sampler_windows_free(w), NULL;
	memcpy(w->first, first, ((size_t)nshards + 1) * sizeof(*w->first));
	for (unsigned i = 0; i < WINDOW_TABLES; i++) {
		w->tab[i].order = calloc(nshards, sizeof(*w->tab[i].order));
		w->tab[i].cum = calloc((size_t)nshards + 1, sizeof(*w->tab[i].cum));
		if (!w->tab[i].order || !w->tab[i].cum)
			return sampler_windows_free(w), NULL;
	}
	return w;
}

void sampler_windows_free(struct sampler_windows *w)
{
	if (!w)
		return;
	for (unsigned i = 0; i < WINDOW_TABLES; i++) {
		free((void *)w->tab[i].order);
		free((void *)w->tab[i].cum);
	}
	free(w->first);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

/* Make the table of (@seed, @epoch) in @t unless another worker just did. */
static void window_table_make(struct sampler_windows *w, struct window_table *t, uint64_t key,
			      uint64_t seed, uint64_t epoch)
{
	uint64_t sum = 0;

	pthread_mutex_lock(&w->lock);
	if (!atomic_load(&t->valid) || atomic_load(&t->seed) != seed || atomic_load(&t->epoch) != epoch) {
		/* odd first: each store below is a release, so a reader that
		 * loads one (an acquire) sees the count moved */
		atomic_fetch_add_explicit(&t->seq, 1, memory_order_relaxed);
		atomic_store_explicit(&t->cum[0], 0, memory_order_release);
		for (uint32_t i = 0; i < w->nshards; i++) {
			uint32_t k = (uint32_t)sampler_permute(key, epoch, w->nshards, i);

			sum += w->first[k + 1] - w->first[k];
			atomic_store_explicit(&t->order[i], k, memory_order_release);
			atomic_store_explicit(&t->cum[i + 1], sum, memory_order_release);
		}
		atomic_store_explicit(&t->seed, seed, memory_order_release);
		atomic_store_explicit(&t->epoch, epoch, memory_order_release);
		atomic_store_explicit(&t->valid, true, memory_order_release);
		atomic_fetch_add_explicit(&t->seq, 1, memory_order_release);
	}
	pthread_mutex_unlock(&w->lock);
}

/* The last slot of [lo, hi) whose cum[slot * step] <= @v (cum[lo * step] <= v). */
static uint64_t last_at_most(_Atomic uint64_t *cum, uint64_t step, uint64_t lo, uint64_t hi,
			     uint64_t v)
{
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (atomic_load_explicit(&cum[mid * step], memory_order_acquire) <= v)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

uint64_t sampler_windows_permute(struct sampler_windows *w, uint64_t seed, uint64_t epoch,
				 uint64_t pos)
{
	uint64_t key = splitmix64(seed ^ WINDOW_KEY), K = w->nshards, W = w->window;
	uint64_t nwin = (K + W - 1) / W, at, j, lo, hi, n, clo, chi, r, g, i, ci, shard;
	struct window_table *t = &w->tab[epoch % WINDOW_TABLES];

	for (;;) {
		uint64_t seq = atomic_load_explicit(&t->seq, memory_order_acquire);

		if ((seq & 1) || !atomic_load_explicit(&t->valid, memory_order_acquire) ||
		    atomic_load_explicit(&t->seed, memory_order_acquire) != seed ||
		    atomic_load_explicit(&t->epoch, memory_order_acquire) != epoch) {
			window_table_make(w, t, key, seed, epoch);
			continue;
		}
		/* what the slot says, copied out; used once the count says it held */
		n = atomic_load_explicit(&t->cum[K], memory_order_acquire);
		at = pos % (n ? n : 1);
		/* the window that holds it: the last to start at or before it */
		j = last_at_most(t->cum, W, 0, nwin, at);
		lo = j * W;
		hi = lo + W < K ? lo + W : K;
		clo = atomic_load_explicit(&t->cum[lo], memory_order_acquire);
		chi = atomic_load_explicit(&t->cum[hi], memory_order_acquire);
		r = sampler_permute(key + 1 + j, epoch, chi - clo, at - clo);
		g = clo + r;
		i = last_at_most(t->cum, 1, lo, hi, g);
		ci = atomic_load_explicit(&t->cum[i], memory_order_acquire);
		shard = atomic_load_explicit(&t->order[i], memory_order_acquire);
		/* after those acquires: moved if any of them saw a rewrite */
		if (atomic_load_explicit(&t->seq, memory_order_relaxed) == seq)
			return w->first[shard] + (g - ci);
	}
}
