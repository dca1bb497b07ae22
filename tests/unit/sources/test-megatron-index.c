/* SPDX-License-Identifier: MIT */
/* test-megatron-index - GPTDataset's indexes in megatron-core's widths
 * (megatron.h): the int64 shuffle index that a part of 2^32 samples or more
 * takes gives the same order as the uint32 one (the width's bound lowered:
 * no test can build 2^32 samples), and both are written to the cache
 * directory and read back from it as they were built. The values
 * themselves are held to megatron-core by tests/python/test_megatron.py. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron.h"
#include "sources/source.h"

#define NSEQ 500

static void same(const struct mg_index *a, const struct mg_index *b)
{
	assert(a->ndoc == b->ndoc && a->nsamples == b->nsamples && a->epochs == b->epochs);
	assert(memcmp(a->doc, b->doc, a->ndoc * 4) == 0);
	assert(memcmp(a->sample, b->sample, (a->nsamples + 1) * 8) == 0);
	for (uint64_t i = 0; i < a->nsamples; i++)
		assert(mg_shuffle_at(a, i) == mg_shuffle_at(b, i));
}

int main(void)
{
	static int32_t lengths[NSEQ];
	static int64_t pointers[NSEQ];
	/* one epoch; three epochs, the last apart (used for less than 80 %) */
	const struct mg_params params[] = {
		{ .beg = 0, .end = NSEQ, .seq_len = 16, .seed = 5, .extra = 1 },
		{ .beg = 10, .end = 400, .seq_len = 7, .seed = 1234, .num_samples = 9000, .extra = 1 },
	};
	char dir[] = "/tmp/test-megatron-index-XXXXXX", err[256], cmd[128];
	uint64_t at = 0, bound = mg_shuffle32_max;

	srand(3);
	for (int i = 0; i < NSEQ; i++) {
		lengths[i] = 1 + rand() % 300;
		pointers[i] = (int64_t)at;
		at += (uint64_t)lengths[i] * 2;
	}
	assert(mkdtemp(dir));
	assert(source_set_cache_dir(dir) == 0);
	for (size_t k = 0; k < 2; k++) {
		const struct mg_params *p = &params[k];
		struct mg_file_id idx = { 1, 2, 3, 4, NULL }, bin = { 1, 5, at, 6, NULL };
		struct mg_index narrow, wide, back;
		struct mg_origin o;

		mg_shuffle32_max = bound;
		assert(mg_index_build(&narrow, lengths, p, "x.bin", err, sizeof(err)) == 0);
		assert(!narrow.shuffle_wide && narrow.nsamples > 1000);
		/* the largest sample index fits its int32 pair */
		assert(narrow.sample[2 * narrow.nsamples] < (int32_t)narrow.ndoc);

		mg_shuffle32_max = narrow.nsamples - 1;
		assert(mg_index_build(&wide, lengths, p, "x.bin", err, sizeof(err)) == 0);
		assert(wide.shuffle_wide);
		same(&narrow, &wide);
		/* written, then read back, in the width its sample count gives */
		for (int w = 0; w < 2; w++) {
			mg_shuffle32_max = w ? narrow.nsamples - 1 : bound;
			idx.ino = 10 + 2 * k + (uint64_t)w; /* a key of its own */
			assert(mg_index_get(&back, lengths, pointers, NSEQ, &idx, &bin, p, &o, "x.bin",
					    err, sizeof(err)) == 0);
			assert(!o.reused && o.note[0] == '\0');
			mg_index_free(&back);
			assert(mg_index_find(&back, NSEQ, &idx, &bin, p) == 0);
			assert(back.map && back.shuffle_wide == (w == 1));
			same(&narrow, &back);
			assert(memcmp(back.lengths, lengths, sizeof(lengths)) == 0);
			assert(memcmp(back.pointers, pointers, sizeof(pointers)) == 0);
			mg_index_free(&back);
		}
		mg_index_free(&narrow);
		mg_index_free(&wide);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert(system(cmd) == 0);
	printf("test-megatron-index: ok\n");
	return 0;
}
