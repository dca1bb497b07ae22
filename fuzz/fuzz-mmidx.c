/* SPDX-License-Identifier: MIT */
/* fuzz-mmidx - the Megatron .idx parser (common/mmidx.h) and, on what it
 * accepts, the megatron kind's index build (megatron-index.c)
 *
 * An .idx is a dataset file: untrusted. The input is 4 bytes of the .bin's
 * size (little-endian) and then the .idx. An index that parses must hold
 * what reads rely on: every sequence inside the .bin, the document indices
 * ascending from 0 to the sequence count. A small one is then built into
 * GPTDataset's indexes with a seq_len, seed and num_samples taken from the
 * input; every position they hold must be in range, and the sample index
 * must be the one helpers.cpp's build_sample_idx makes (transliterated
 * below, loop for loop) from the same document index.
 */
#include "fuzz.h"

#include "megatron.h"
#include "mmidx.h"

static void check_parsed(const struct mmidx *m)
{
	uint64_t tokens = 0;

	for (uint64_t i = 0; i < m->nseq; i++) {
		if (m->lengths[i] < 0 || m->pointers[i] < 0 ||
		    (uint64_t)m->pointers[i] + (uint64_t)m->lengths[i] * m->elem > m->bin_size)
			abort();
		tokens += (uint64_t)m->lengths[i];
	}
	if (tokens != m->ntokens || m->ndocidx == 0 || m->docidx[0] != 0 ||
	    (uint64_t)m->docidx[m->ndocidx - 1] != m->nseq)
		abort();
	for (uint64_t j = 1; j < m->ndocidx; j++)
		if (m->docidx[j] < m->docidx[j - 1])
			abort();
}

/* megatron-core 0.16 helpers.cpp build_sample_idx, drop_last_partial_sequence. */
static void reference_sample_index(const struct mg_index *ix, const int32_t *sizes, int extra,
				   uint32_t seq_len, int64_t *out)
{
	int64_t sample_idx_index = 0, document_idx_index = 0, doc_offset = 0;

	out[0] = 0;
	out[1] = 0;
	++sample_idx_index;
	while ((uint64_t)sample_idx_index <= ix->nsamples) {
		int64_t remaining_seq_length = (int64_t)seq_len + extra;

		while (remaining_seq_length != 0) {
			int64_t document_index = ix->doc[document_idx_index];
			int64_t document_length = sizes[document_index] - doc_offset;

			remaining_seq_length -= document_length;
			if (remaining_seq_length <= 0) {
				doc_offset += remaining_seq_length + document_length - extra;
				remaining_seq_length = 0;
			} else {
				if ((uint64_t)document_idx_index == ix->ndoc - 1) {
					doc_offset = sizes[ix->doc[document_idx_index]] - extra;
					break;
				}
				++document_idx_index;
				doc_offset = 0;
			}
		}
		out[2 * sample_idx_index] = document_idx_index;
		out[2 * sample_idx_index + 1] = doc_offset;
		++sample_idx_index;
	}
}

static void check_built(const struct mmidx *m, const uint8_t *data)
{
	struct mg_params p = { .beg = 0, .end = m->nseq, .seq_len = 2u + data[0] % 13,
			       .seed = data[1], .num_samples = data[2] % 5 ? data[2] : 0,
			       .extra = data[3] & 1 };
	struct mg_index ix;
	char err[512] = "";
	int64_t *ref;

	if (m->nseq == 0 || m->ntokens > 100000)
		return;
	if (mg_index_build(&ix, m->lengths, &p, "x.bin", err, sizeof(err)) < 0) {
		if (!err[0])
			abort();
		return;
	}
	for (uint64_t k = 0; k <= ix.nsamples; k++)
		if (ix.sample[2 * k] < 0 || (uint64_t)ix.sample[2 * k] >= ix.ndoc ||
		    ix.sample[2 * k + 1] < 0 ||
		    ix.sample[2 * k + 1] > m->lengths[ix.doc[ix.sample[2 * k]]])
			abort();
	for (uint64_t k = 0; k < ix.nsamples; k++)
		if (mg_shuffle_at(&ix, k) >= ix.nsamples)
			abort();
	ref = malloc((ix.nsamples + 1) * 16);
	if (ref) {
		reference_sample_index(&ix, m->lengths, p.extra, p.seq_len, ref);
		for (uint64_t k = 0; k < 2 * (ix.nsamples + 1); k++)
			if (ref[k] != ix.sample[k])
				abort();
		free(ref);
	}
	mg_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mmidx m;
	char err[512] = "";
	uint64_t bin;

	if (size < 4)
		return 0;
	bin = (uint64_t)data[0] | (uint64_t)data[1] << 8 | (uint64_t)data[2] << 16 |
	      (uint64_t)data[3] << 24;
	if (mmidx_parse_buf(&m, data + 4, size - 4, "x.idx", "x.bin", bin, err, sizeof(err)) < 0) {
		if (!err[0]) { /* common.h's error rule */
			fprintf(stderr, "mmidx_parse failed without a message\n");
			abort();
		}
		return 0;
	}
	check_parsed(&m);
	check_built(&m, data);
	mmidx_free(&m);
	return 0;
}
