/* SPDX-License-Identifier: MIT */
/* blend-index - megatron-core's blending indices, bit for bit, on several threads */

/*
 * helpers.cpp's build_blending_indices() and
 * build_exhaustive_blending_indices() are one loop: before step s each part
 * j has been picked c[j] times, and step s picks the first part of the
 * largest error w[j] * max(s, 1) - c[j] (the exhaustive one over the parts
 * not yet spent). Each step depends on the last, O(size x parts) in all,
 * and that was a third of a cold megatron create.
 *
 * Yet the counts never stray far from w[j] * s, and two runs of the loop
 * that start from different counts at the same step pick the same parts
 * once their counts agree (a step is a function of s and the counts
 * alone). So the size is cut into chunks, one per thread; chunk k starts
 * from a guess of the counts at its first step (w[j] * s rounded by the
 * largest remainders, which is where the loop keeps them) while chunk k - 1
 * is still running. Then, chunk by chunk in order, the loop runs again
 * from the true counts (the end of chunk k - 1), overwriting chunk k's
 * picks and following how far the two sets of counts differ, until they
 * agree: from that step on chunk k's picks were right. On megatron-like
 * corpora they agree after 0 to a few hundred steps (tests/unit/sources/
 * test-blend-index.c compares every chunking with the loop on one thread);
 * a guess that never meets the true counts costs a chunk run twice and
 * gives the same indices.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "megatron.h"

/*
 * The products below must round as two operations, as megatron's prebuilt
 * helpers do on x86-64: no fused multiply-add.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/*
 * The first k of the largest wl[k] * sd - cl[k], k < n (n >= 1): the part
 * megatron's loops pick (a strict ">" over the parts in index order), so the
 * first k whose error equals the largest. Two passes without a branch to
 * mispredict: the errors into @e and their maximum (SSE2's maxpd two at a
 * time where the target has it), then the first equal to it. The operands are
 * dense (no indirection), the counts kept as doubles (exact below 2^53): the
 * same products and differences, rounded the same, never NaN (finite weights
 * and counts); -0 and +0 compare equal in both passes, as in the scan.
 */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* first_max() four at a time, for the CPUs that have AVX2 (no FMA: the
 * products and differences still round as two operations). */
__attribute__((target("avx2"))) static size_t first_max_avx2(const double *restrict wl,
							      const double *restrict cl, size_t n,
							      double sd, double *restrict e)
{
	__m256d vs = _mm256_set1_pd(sd), vm[4], v;
	double lanes[4], max = -INFINITY;
	size_t k = 0;

	for (int l = 0; l < 4; l++)
		vm[l] = _mm256_set1_pd(-INFINITY);
	for (; k + 16 <= n; k += 16)
		for (int l = 0; l < 4; l++) {
			v = _mm256_sub_pd(_mm256_mul_pd(_mm256_loadu_pd(wl + k + 4 * l), vs),
					  _mm256_loadu_pd(cl + k + 4 * l));
			_mm256_storeu_pd(e + k + 4 * l, v);
			vm[l] = _mm256_max_pd(vm[l], v);
		}
	for (; k + 4 <= n; k += 4) {
		v = _mm256_sub_pd(_mm256_mul_pd(_mm256_loadu_pd(wl + k), vs), _mm256_loadu_pd(cl + k));
		_mm256_storeu_pd(e + k, v);
		vm[0] = _mm256_max_pd(vm[0], v);
	}
	_mm256_storeu_pd(lanes, _mm256_max_pd(_mm256_max_pd(vm[0], vm[1]),
					      _mm256_max_pd(vm[2], vm[3])));
	for (int l = 0; l < 4; l++)
		max = lanes[l] > max ? lanes[l] : max;
	for (; k < n; k++) {
		e[k] = wl[k] * sd - cl[k];
		max = e[k] > max ? e[k] : max;
	}
	k = 0;
	for (__m256d vmax = _mm256_set1_pd(max); k + 4 <= n; k += 4) {
		int hit = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(e + k), vmax, _CMP_EQ_OQ));

		if (hit)
			return k + (size_t)__builtin_ctz((unsigned)hit);
	}
	for (; e[k] != max; k++)
		;
	return k;
}
#endif

static size_t first_max_sse2(const double *restrict wl, const double *restrict cl, size_t n,
			double sd, double *restrict e)
{
	double max;
	size_t k = 0;

#if defined(__SSE2__)
	/* four maxima at once: maxpd's latency, not its throughput, bounds one */
	__m128d vs = _mm_set1_pd(sd), vm[4];

	for (int l = 0; l < 4; l++)
		vm[l] = _mm_set1_pd(-INFINITY);
	for (; k + 8 <= n; k += 8)
		for (int l = 0; l < 4; l++) {
			__m128d v = _mm_sub_pd(_mm_mul_pd(_mm_loadu_pd(wl + k + 2 * l), vs),
					       _mm_loadu_pd(cl + k + 2 * l));

			_mm_storeu_pd(e + k + 2 * l, v);
			vm[l] = _mm_max_pd(vm[l], v);
		}
	for (; k + 2 <= n; k += 2) {
		__m128d v = _mm_sub_pd(_mm_mul_pd(_mm_loadu_pd(wl + k), vs), _mm_loadu_pd(cl + k));

		_mm_storeu_pd(e + k, v);
		vm[0] = _mm_max_pd(vm[0], v);
	}
	vm[0] = _mm_max_pd(_mm_max_pd(vm[0], vm[1]), _mm_max_pd(vm[2], vm[3]));
	max = _mm_cvtsd_f64(_mm_max_sd(vm[0], _mm_unpackhi_pd(vm[0], vm[0])));
#else
	max = -INFINITY;
#endif
	for (; k < n; k++) {
		e[k] = wl[k] * sd - cl[k];
		max = e[k] > max ? e[k] : max;
	}
	k = 0;
#if defined(__SSE2__)
	for (__m128d vmax = _mm_set1_pd(max); k + 2 <= n; k += 2) {
		int hit = _mm_movemask_pd(_mm_cmpeq_pd(_mm_loadu_pd(e + k), vmax));

		if (hit)
			return k + (hit & 1 ? 0 : 1);
	}
#endif
	for (; e[k] != max; k++)
		;
	return k;
}

/* The vector path of this CPU (both pick the same part). */
static size_t first_max(const double *restrict wl, const double *restrict cl, size_t n,
			double sd, double *restrict e)
{
#ifdef HAVE_AVX2_PATH
	if (__builtin_cpu_supports("avx2")) /* a load of libgcc's word and a test */
		return first_max_avx2(wl, cl, n, sd, e);
#endif
	return first_max_sse2(wl, cl, n, sd, e);
}

/* The loop's state before step s. The live parts (all of them in the
 * weighted loop) in index order as std::set iterates them: their weights
 * @wl, counts @cl (doubles, exact below 2^53) and numbers @id. */
struct race {
	const double *w;         /* [n], each part's weight */
	const uint64_t *sizes;   /* [n], exhaustive: each part's count; else NULL */
	size_t n;
	uint64_t *cur;           /* [n], each part's picks so far */
	double *wl, *cl, *e;     /* [n] each; e: first_max()'s errors */
	size_t *id;
	size_t nlive;
};

static int race_alloc(struct race *r, const double *w, const uint64_t *sizes, size_t n)
{
	*r = (struct race){ .w = w, .sizes = sizes, .n = n };
	r->cur = calloc(n, sizeof(*r->cur));
	r->wl = calloc(3 * n, sizeof(*r->wl));
	r->id = calloc(n, sizeof(*r->id));
	if (!r->cur || !r->wl || !r->id)
		return -ENOMEM;
	r->cl = r->wl + n;
	r->e = r->cl + n;
	return 0;
}

static void race_free(struct race *r)
{
	free(r->cur);
	free(r->wl);
	free(r->id);
}

/* The state of counts @cur (r->cur itself or another array). */
static void race_set(struct race *r, const uint64_t *cur)
{
	if (cur != r->cur)
		memcpy(r->cur, cur, r->n * sizeof(*cur));
	r->nlive = 0;
	for (size_t j = 0; j < r->n; j++) {
		if (r->sizes && r->cur[j] >= r->sizes[j])
			continue;
		r->wl[r->nlive] = r->w[j];
		r->cl[r->nlive] = (double)r->cur[j];
		r->id[r->nlive++] = j;
	}
}

/* Step s: the part picked, written to @di[s] and its sample to @si[s]. */
static inline size_t race_step(struct race *r, uint64_t s, uint16_t *di, uint64_t *si)
{
	size_t k = first_max(r->wl, r->cl, r->nlive, s > 1 ? (double)s : 1.0, r->e);
	size_t best = r->id[k];

	di[s] = (uint16_t)best;
	si[s] = r->cur[best]++;
	r->cl[k] += 1.0;
	if (r->sizes && r->cur[best] == r->sizes[best]) {
		size_t rest = r->nlive - k - 1;

		memmove(r->wl + k, r->wl + k + 1, rest * sizeof(*r->wl));
		memmove(r->cl + k, r->cl + k + 1, rest * sizeof(*r->cl));
		memmove(r->id + k, r->id + k + 1, rest * sizeof(*r->id));
		r->nlive--;
	}
	return best;
}

/* Steps [s0, s1), or until no part is left. */
static void race_run(struct race *r, uint64_t s0, uint64_t s1, uint16_t *di, uint64_t *si)
{
	for (uint64_t s = s0; s < s1 && r->nlive; s++)
		race_step(r, s, di, si);
}

struct frac {
	double f;
	size_t j;
};

/* The largest remainders first; equal ones in part order. */
static int frac_cmp(const void *a, const void *b)
{
	const struct frac *x = a, *y = b;

	if (x->f != y->f)
		return x->f > y->f ? -1 : 1;
	return x->j < y->j ? -1 : x->j > y->j;
}

/*
 * A guess of the counts before step @s: w[j] * s rounded down, within the
 * part's size, then one more for the largest remainders until they sum to
 * s (a sum other than s could never meet the true counts: every step adds
 * one to both). Any guess gives the same indices; a close one saves time.
 */
static int guess(uint64_t *cur, const double *w, const uint64_t *sizes, size_t n, uint64_t s)
{
	struct frac *fr = malloc(n * sizeof(*fr));
	uint64_t sum = 0;

	if (!fr)
		return -ENOMEM;
	for (size_t j = 0; j < n; j++) {
		double x = w[j] * (double)s, f = floor(x);

		cur[j] = f > 0 ? (uint64_t)f : 0;
		if (sizes && cur[j] > sizes[j])
			cur[j] = sizes[j];
		if (cur[j] > s - sum)
			cur[j] = s - sum;
		sum += cur[j];
		fr[j] = (struct frac){ x - f, j };
	}
	qsort(fr, n, sizeof(*fr), frac_cmp);
	/* rounds: a part at its size takes no more */
	for (bool more = true; sum < s && more;) {
		more = false;
		for (size_t i = 0; i < n && sum < s; i++) {
			size_t j = fr[i].j;

			if (sizes && cur[j] >= sizes[j])
				continue;
			cur[j]++;
			sum++;
			more = true;
		}
	}
	free(fr);
	return 0;
}

struct chunk {
	struct race r;
	uint64_t s0, s1;
	uint64_t *start;         /* [n], the counts it started from */
	uint16_t *di;
	uint64_t *si;
	pthread_t t;
	bool threaded;
};

static void *chunk_thread(void *arg)
{
	struct chunk *c = arg;

	race_set(&c->r, c->start);
	race_run(&c->r, c->s0, c->s1, c->di, c->si);
	return NULL;
}

/*
 * Chunk @c ran from a guess; @truth is the true counts before its first
 * step (the end of the chunk before it). Run the loop again from them,
 * writing over the chunk's picks, until both runs' counts agree: the
 * chunk's own picks and end are right from there. @diff and @end are
 * scratch ([n] each).
 * Returns the steps run again.
 */
static uint64_t chunk_mend(struct chunk *c, const uint64_t *truth, int64_t *diff, uint64_t *end)
{
	size_t n = c->r.n, differ = 0;
	uint64_t s = c->s0;

	for (size_t j = 0; j < n; j++) {
		diff[j] = (int64_t)truth[j] - (int64_t)c->start[j];
		differ += diff[j] != 0;
	}
	if (!differ)
		return 0;
	memcpy(end, c->r.cur, n * sizeof(*end));
	race_set(&c->r, truth);
	for (; s < c->s1 && differ && c->r.nlive; s++) {
		size_t guessed = c->di[s], picked = race_step(&c->r, s, c->di, c->si);

		/* diff: the true counts less the guessed run's, after step s */
		differ -= diff[picked] != 0;
		diff[picked]++;
		differ += diff[picked] != 0;
		differ -= diff[guessed] != 0;
		diff[guessed]--;
		differ += diff[guessed] != 0;
	}
	/* met: the chunk's end is its own run's (else this run's, in place) */
	if (!differ)
		memcpy(c->r.cur, end, n * sizeof(*end));
	return s - c->s0;
}

int mg_blend_indices(uint16_t *di, uint64_t *si, const double *w, const uint64_t *sizes, size_t n,
		     uint64_t size, uint64_t *per_part, unsigned threads, uint64_t min_chunk,
		     uint64_t *mended)
{
	uint64_t total = 0, nchunks = threads ? threads : 1;
	double *wx = NULL;
	struct chunk *c = NULL;
	int64_t *diff = NULL;
	uint64_t *end = NULL;
	int r = -ENOMEM;

	if (sizes) {
		/* the exhaustive loop's weights: each part's share of the sizes */
		for (size_t j = 0; j < n; j++)
			total += sizes[j];
		size = total;
		wx = malloc(n * sizeof(*wx));
		if (!wx)
			return -ENOMEM;
		for (size_t j = 0; j < n; j++)
			wx[j] = (double)sizes[j] / (double)total;
		w = wx;
	}
	if (min_chunk < 1)
		min_chunk = 1;
	if (nchunks > size / min_chunk)
		nchunks = size / min_chunk ? size / min_chunk : 1;
	c = calloc(nchunks, sizeof(*c));
	diff = calloc(n, sizeof(*diff));
	end = calloc(n, sizeof(*end));
	if (!c || !diff || !end)
		goto out;
	for (uint64_t k = 0; k < nchunks; k++) {
		c[k].s0 = size * k / nchunks;
		c[k].s1 = size * (k + 1) / nchunks;
		c[k].di = di;
		c[k].si = si;
		c[k].start = calloc(n, sizeof(*c[k].start));
		if (race_alloc(&c[k].r, w, sizes, n) < 0 || !c[k].start ||
		    (k && guess(c[k].start, w, sizes, n, c[k].s0) < 0))
			goto out;
	}
	/* chunk 0 here, from no picks at all: the others on threads of their
	 * own, or here too when a thread cannot be started */
	for (uint64_t k = 1; k < nchunks; k++)
		c[k].threaded = pthread_create(&c[k].t, NULL, chunk_thread, &c[k]) == 0;
	chunk_thread(&c[0]);
	for (uint64_t k = 1; k < nchunks; k++)
		if (c[k].threaded)
			pthread_join(c[k].t, NULL);
		else
			chunk_thread(&c[k]);
	if (mended)
		*mended = 0;
	for (uint64_t k = 1; k < nchunks; k++) {
		uint64_t m = chunk_mend(&c[k], c[k - 1].r.cur, diff, end);

		if (mended)
			*mended += m;
	}
	memcpy(per_part, c[nchunks - 1].r.cur, n * sizeof(*per_part));
	r = 0;
out:
	for (uint64_t k = 0; c && k < nchunks; k++) {
		race_free(&c[k].r);
		free(c[k].start);
	}
	free(c);
	free(diff);
	free(end);
	free(wx);
	return r;
}
