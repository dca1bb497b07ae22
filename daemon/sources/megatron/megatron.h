/* SPDX-License-Identifier: MIT */
/* megatron - the megatron kind's own pieces: its index, built as megatron-core's GPTDataset
 * builds it, and cached on disk (megatron-index.c, megatron-cache.c), with the blend kind's
 * BlendedDataset indexes (source-blend.c) */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* What changes the index besides the corpus (megatron-core's names in comments). */
struct mg_params {
	uint64_t beg, end;            /* the split's sequences [beg, end) (indexed_indices) */
	uint32_t seq_len;             /* sequence_length */
	uint32_t seed;                /* random_seed */
	uint64_t num_samples;         /* sizes[split]; 0: None, one epoch */
	int extra;                    /* add_extra_token_to_sequence, 0 or 1 */
};

/* GPTDataset's three indexes (_build_document_sample_shuffle_indices). */
struct mg_index {
	uint64_t ndoc;                /* document_index entries: epochs x documents */
	uint64_t nsamples;            /* len(dataset): sample_index rows - 1 */
	uint32_t epochs;
	int32_t *doc;                 /* document_index[ndoc]: sequence numbers */
	int32_t *sample;              /* sample_index[nsamples + 1][2]: doc_index position, offset
				       * (below ndoc and a document's length: both int32) */
	void *shuffle;                /* shuffle_index[nsamples]: uint32, int64 when wide */
	bool shuffle_wide;            /* nsamples > mg_shuffle32_max */
	void *map;                    /* read from the cache: the arrays lie in this */
	size_t map_len;               /* mapping of its file, else NULL */
	/* read from the cache: the .idx's sequence lengths and pointers as they
	 * were when the index was built from it (the file's identity is the
	 * key), in the mapping; else NULL */
	const int32_t *lengths;       /* [nseq] */
	const int64_t *pointers;      /* [nseq] */
};

/* The most samples of a uint32 shuffle_index (megatron-core's: below
 * UINT32_MAX - 1; more, int64). A variable for the unit test alone, which
 * cannot build 2^32 samples to try the wide one. */
extern uint64_t mg_shuffle32_max;

static inline uint64_t mg_shuffle_at(const struct mg_index *ix, uint64_t i)
{
	return ix->shuffle_wide ? (uint64_t)((const int64_t *)ix->shuffle)[i] :
				  ((const uint32_t *)ix->shuffle)[i];
}

/* An array of @bytes in mapped memory, in huge pages where the kernel gives
 * them (a build's time is otherwise much of it page faults); NULL when out
 * of memory. mg_array_free() takes the same @bytes (and NULL). */
void *mg_array_alloc(size_t bytes);
void mg_array_free(void *p, size_t bytes);

/* Allocate the three arrays for ix->ndoc and ix->nsamples (mg_array_alloc());
 * -ENOMEM leaves what it got for mg_index_free(). */
int mg_index_alloc(struct mg_index *ix);

/* Build it from the sequence lengths of the whole .idx; errors name @what. */
int mg_index_build(struct mg_index *ix, const int32_t *lengths, const struct mg_params *p,
		   const char *what, char *err, size_t errlen);
void mg_index_free(struct mg_index *ix);

/* The files an index is built from, as fstat() saw them (the cache key);
 * an object in a store by @object instead: "ENDPOINT URL ETAG SIZE"
 * (source_object_id()), NULL for a local file. */
struct mg_file_id {
	uint64_t dev, ino, size;
	int64_t mtime_ns;
	const char *object;
};

/* Where the index came from (status "cache"). */
struct mg_origin {
	bool reused;                  /* read from the cache directory */
	double build_s;               /* the build's seconds, when built */
	char note[4400];              /* why it is not cached, or "" */
};

/**
 * mg_index_find() - the index for @p over the pair @idx_id/@bin_id (an .idx
 * of @nseq sequences) when a pipeline built it before: read from the
 * daemon's cache directory (source_cache_dir()), with the .idx's lengths
 * and pointers (@ix->lengths, @ix->pointers; the .idx was checked when it
 * was built). 0 when found, else a negative errno; nothing is built.
 */
int mg_index_find(struct mg_index *ix, uint64_t nseq, const struct mg_file_id *idx_id,
		  const struct mg_file_id *bin_id, const struct mg_params *p);

/**
 * mg_index_get() - the same, else built from @lengths and @pointers (the
 * whole checked .idx; once: a lock file serializes the builders of one key)
 * and written there, to a temporary name and renamed. Without a usable
 * cache directory it is built in memory and @o->note says why.
 */
int mg_index_get(struct mg_index *ix, const int32_t *lengths, const int64_t *pointers,
		 uint64_t nseq, const struct mg_file_id *idx_id, const struct mg_file_id *bin_id,
		 const struct mg_params *p, struct mg_origin *o, const char *what, char *err,
		 size_t errlen);

/* megatron-core's BlendedDataset's two indexes and each part's samples per
 * epoch (source-blend.c builds them), in arrays the caller allocated. */
struct mg_blend {
	uint64_t size;                /* samples */
	size_t n;                     /* parts */
	uint16_t *part;               /* dataset_index[size] */
	uint64_t *sample;             /* dataset_sample_index[size] */
	uint64_t *per_epoch;          /* [n], the caller's */
	void *map;                    /* read from the cache: part and sample lie in */
	size_t map_len;               /* this mapping of its file, else mg_array_alloc()'s */
};

/**
 * mg_blend_indices() - helpers.cpp's blending indices into @di and @si
 * (@size entries each): with @sizes NULL, build_blending_indices() over
 * the normalised weights @w; else build_exhaustive_blending_indices() over
 * the counts @sizes (@w and @size unused: the size is their sum). Each
 * part's picks into @per_part. Up to @threads threads, each with at least
 * @min_chunk steps; the same indices for any of them (blend-index.c). The
 * steps run again to join the threads' chunks into @mended (may be NULL).
 * 0, or -ENOMEM.
 */
int mg_blend_indices(uint16_t *di, uint64_t *si, const double *w, const uint64_t *sizes, size_t n,
		     uint64_t size, uint64_t *per_part, unsigned threads, uint64_t min_chunk,
		     uint64_t *mended);

/**
 * mg_blend_get() - fill @b (size, n and per_epoch set) from the daemon's
 * cache directory when a blend of the same @key (every input of @build,
 * bytes) was built before (part and sample mapped from the file: every
 * part number is to be checked where it is read), else @build(@ctx) it
 * (which allocates part and sample with mg_array_alloc(); once per key:
 * the same lock as mg_index_get()) and write it there. The caller opens
 * every part as the pipeline's owner first; mg_blend_free() frees part and
 * sample.
 */
int mg_blend_get(struct mg_blend *b, const void *key, size_t klen,
		 int (*build)(void *ctx, char *err, size_t errlen), void *ctx,
		 struct mg_origin *o, char *err, size_t errlen);
void mg_blend_free(struct mg_blend *b);
