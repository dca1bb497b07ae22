/* SPDX-License-Identifier: MIT */
/* megatron-index - GPTDataset's document, sample and shuffle indexes (megatron.h)
 *
 * Step for step megatron-core 0.16's gpt_dataset.py and helpers.cpp, with
 * one numpy RandomState(seed) (nprandom.h) drawn in megatron's order: the
 * document index (all epochs shuffled as one array, or the final epoch on
 * its own when it is used for less than 80 %), then the shuffle index (the
 * first num_samples and the rest shuffled separately in that case).
 *
 * The shuffle index takes no input but the state the document index left,
 * and the sample index takes no draws: after the document index the two are
 * built at once, the shuffle on a thread of its own.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "megatron.h"
#include "nprandom.h"

/* The arrays' sizes, with room to spare for a reader that pads (the cache). */
static size_t doc_size(const struct mg_index *ix)
{
	return (size_t)ix->ndoc * 4 + 8;
}

static size_t sample_size(const struct mg_index *ix)
{
	return (size_t)(ix->nsamples + 1) * 8;
}

static size_t shuffle_size(const struct mg_index *ix)
{
	return (size_t)ix->nsamples * (ix->shuffle_wide ? 8 : 4) + 8;
}

uint64_t mg_shuffle32_max = UINT32_MAX - 2;

void *mg_array_alloc(size_t bytes)
{
	void *p;

	if (!bytes)
		bytes = 1;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (bytes >= (2u << 20))
		madvise(p, bytes, MADV_HUGEPAGE);
	return p;
}

void mg_array_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}

int mg_index_alloc(struct mg_index *ix)
{
	ix->doc = mg_array_alloc(doc_size(ix));
	ix->sample = mg_array_alloc(sample_size(ix));
	ix->shuffle = mg_array_alloc(shuffle_size(ix));
	return ix->doc && ix->sample && ix->shuffle ? 0 : -ENOMEM;
}

void mg_index_free(struct mg_index *ix)
{
	if (ix->map)
		munmap(ix->map, ix->map_len);
	else if (ix->doc)
		munmap(ix->doc, doc_size(ix));
	if (!ix->map && ix->sample)
		munmap(ix->sample, sample_size(ix));
	if (!ix->map && ix->shuffle)
		munmap(ix->shuffle, shuffle_size(ix));
	memset(ix, 0, sizeof(*ix));
}

/* _build_document_index(..., separate_final_epoch=False) into @out. */
static void document_index(int32_t *out, uint64_t beg, uint64_t ndocs, uint32_t epochs,
			   struct nprandom *rng)
{
	for (uint64_t i = 0; i < ndocs; i++)
		out[i] = (int32_t)(beg + i);
	for (uint32_t e = 1; e < epochs; e++)
		memcpy(out + e * ndocs, out, ndocs * sizeof(*out));
	nprandom_shuffle32(rng, out, ndocs * epochs);
}

/*
 * helpers.cpp's build_sample_idx (drop_last_partial_sequence), by position:
 * sample n starts at token n * seq_len of the documents laid end to end in
 * document-index order (each takes seq_len + extra tokens, and the next
 * starts extra tokens before its end). build_sample_idx records that start
 * as (position in the document index, offset) in the document holding it,
 * skipping documents of no tokens; without the extra token, a start that
 * falls on the end of a document is recorded at that document's end, not
 * at the next one's start. So one pass over the documents, with the
 * samples of each written in a loop without a branch to mispredict, gives
 * the same array (fuzz/fuzz-mmidx.c holds it to a transliteration of
 * helpers.cpp, the tests to megatron-core).
 */
static int sample_index(struct mg_index *ix, const int32_t *sizes, const struct mg_params *p,
			const char *what, char *err, size_t errlen)
{
	int32_t *s = ix->sample;
	const int32_t *doc = ix->doc;
	const uint64_t L = p->seq_len, N = ix->nsamples, ndoc = ix->ndoc;
	const uint64_t inclusive = p->extra ? 0 : 1;   /* a start at a document's end is its */
	uint64_t n = 1, next = L, start = 0;

	s[0] = 0;
	s[1] = 0;
	for (uint64_t di = 0; di < ndoc && n <= N; di++) {
		uint64_t end = start + (uint64_t)sizes[doc[di]];

		/* the lengths are read in the shuffled order: ask early */
		if (di + 16 < ndoc)
			__builtin_prefetch(&sizes[doc[di + 16]]);
		if (end == start)
			continue;
		for (; n <= N && next < end + inclusive; n++, next += L) {
			s[2 * n] = (int32_t)di;
			s[2 * n + 1] = (int32_t)(next - start);
		}
		start = end;
	}
	if (n <= N)
		return errfmt(-EINVAL, err, errlen, "%s: the documents ran out at sample %llu of "
			      "%llu", what, (unsigned long long)n, (unsigned long long)N);
	return 0;
}

/* numpy shuffles an array of either width with the same draws */
static void shuffle_range(void *a, bool wide, uint64_t from, uint64_t to, struct nprandom *rng)
{
	if (wide) {
		int64_t *w = a;

		for (uint64_t i = from; i < to; i++)
			w[i] = (int64_t)i;
		nprandom_shuffle64(rng, w + from, to - from);
	} else {
		int32_t *w = a; /* uint32 values, shuffled as any 4-byte items */

		for (uint64_t i = from; i < to; i++)
			w[i] = (int32_t)(uint32_t)i;
		nprandom_shuffle32(rng, w + from, to - from);
	}
}

/* _build_shuffle_index(first, total): [0, first) and [first, total) apart. */
struct shuffle_job {
	void *a;
	bool wide;
	uint64_t first, total;
	struct nprandom rng;
};

static void *shuffle_index(void *arg)
{
	struct shuffle_job *j = arg;

	shuffle_range(j->a, j->wide, 0, j->first, &j->rng);
	if (j->first < j->total)
		shuffle_range(j->a, j->wide, j->first, j->total, &j->rng);
	return NULL;
}

int mg_index_build(struct mg_index *ix, const int32_t *lengths, const struct mg_params *p,
		   const char *what, char *err, size_t errlen)
{
	uint64_t ndocs = p->end - p->beg, tpe = 0, sans_final = 0, total;
	unsigned __int128 samples;
	bool separate = false, threaded;
	struct shuffle_job job;
	struct nprandom rng;
	pthread_t tid;
	int r;

	memset(ix, 0, sizeof(*ix));
	for (uint64_t i = p->beg; i < p->end; i++)
		tpe += (uint64_t)lengths[i];
	/* With num_samples, megatron takes as many epochs as make one sample
	 * (a subset shorter than a sample, read over and over); without, one. */
	if (p->seq_len < 2 || tpe == 0 ||
	    (!p->num_samples && tpe < (uint64_t)p->seq_len + (uint64_t)p->extra))
		return errfmt(-EINVAL, err, errlen, "%s: the subset's %llu tokens are too few for "
			      "one sample of %u", what, (unsigned long long)tpe,
			      p->seq_len + (unsigned)p->extra);
	ix->epochs = 1;
	if (p->num_samples) {
		/* _get_num_epochs(): the fewest epochs of tpe tokens that hold them */
		unsigned __int128 want = (unsigned __int128)p->num_samples * p->seq_len +
					 (uint64_t)p->extra;
		unsigned __int128 epochs = (want + tpe - 1) / tpe;

		if (epochs > INT32_MAX / ndocs)
			return errfmt(-EINVAL, err, errlen, "%s: num_samples %llu needs %llu epochs "
				      "of %llu documents: more than megatron's int32 document "
				      "index holds", what, (unsigned long long)p->num_samples,
				      (unsigned long long)epochs, (unsigned long long)ndocs);
		ix->epochs = epochs > 1 ? (uint32_t)epochs : 1;
	}
	if (ix->epochs > 1) {
		uint64_t per_epoch = (tpe - (uint64_t)p->extra) / p->seq_len, final;

		sans_final = ((ix->epochs - 1) * tpe - (uint64_t)p->extra) / p->seq_len;
		final = p->num_samples - sans_final;
		separate = final < (uint64_t)(0.80 * (double)per_epoch);
	}
	ix->ndoc = ndocs * ix->epochs;
	samples = ((unsigned __int128)ix->epochs * tpe - (uint64_t)p->extra) / p->seq_len;
	if (samples > (1ULL << 40))
		return errfmt(-EINVAL, err, errlen, "%s: %llu samples: more than 2^40",
			      what, (unsigned long long)samples);
	ix->nsamples = (uint64_t)samples;
	ix->shuffle_wide = ix->nsamples > mg_shuffle32_max;
	if (ix->ndoc > INT32_MAX)
		return errfmt(-EINVAL, err, errlen, "%s: %llu documents x %u epochs: more than "
			      "megatron's int32 document index holds", what,
			      (unsigned long long)ndocs, ix->epochs);
	if (mg_index_alloc(ix) < 0) {
		mg_index_free(ix);
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory for the index of %llu "
			      "samples", what, (unsigned long long)ix->nsamples);
	}

	nprandom_seed(&rng, p->seed);
	if (!separate) {
		document_index(ix->doc, p->beg, ndocs, ix->epochs, &rng);
	} else {
		document_index(ix->doc, p->beg, ndocs, ix->epochs - 1, &rng);
		document_index(ix->doc + ndocs * (ix->epochs - 1), p->beg, ndocs, 1, &rng);
	}
	total = ix->nsamples;
	job.a = ix->shuffle;
	job.wide = ix->shuffle_wide;
	job.total = total;
	job.first = separate && sans_final < total ? sans_final : total;
	job.rng = rng;
	threaded = pthread_create(&tid, NULL, shuffle_index, &job) == 0;
	r = sample_index(ix, lengths, p, what, err, errlen);
	if (threaded)
		pthread_join(tid, NULL);
	else
		shuffle_index(&job);
	if (r < 0) {
		mg_index_free(ix);
		return r;
	}
	return 0;
}
