/* SPDX-License-Identifier: MIT */
/* source - where samples come from: token files, .npy arrays, images
 *
 * The sources layer: the spec (spec.h, the pipeline's language), the kind
 * table (kinds.c) and one file or folder per kind behind a struct
 * source_ops (source-private.h: what a kind implements and may use). A
 * source writes a sample into the place in the slot it is given and knows
 * nothing of pipelines, streams or clients: it never calls the engine nor
 * the server, and includes only base/ (opening files as the pipeline's
 * owner: creds.h) besides common/. Above it, the engine and the server see
 * this header and spec.h, never a kind's own files.
 *
 * layer: daemon/sources -> daemon/store daemon/base common include
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loader/loader.h"

/*
 * The kinds of source. Each is parsed, opened and read by its own source_ops
 * (source-private.h; image_folder and webdataset share source-images.c), and
 * the kind table in kinds.c names them.
 */
enum source_kind {
	SOURCE_TOKENS,
	SOURCE_NPY,
	SOURCE_IMAGE_FOLDER,
	SOURCE_WEBDATASET,
	SOURCE_PYTHON,           /* a user's torch Dataset, built by its Python workers */
	SOURCE_BLEND,            /* other sources mixed by weight (source-blend.c) */
	SOURCE_MEGATRON,         /* a Megatron-LM .bin/.idx pair, as GPTDataset (megatron/) */
};

#define SOURCE_MAX_FIELDS 16

struct field_desc {
	char name[LDR_NAME_MAX + 1];
	int dtype;                    /* enum ldr_dtype */
	int ndim;                     /* dimensions of one sample (0 = scalar) */
	int64_t shape[LDR_MAX_DIMS - 1];
	size_t sample_bytes;          /* bytes of one sample of this field */
};

struct source;
struct spec;                     /* spec.h */

/*
 * What a sample's random draws depend on besides its index (docs/spec.md,
 * "Random draws"): never the worker or the time.
 */
/* The order a stream reads its epochs in (the engine's sampler), for a
 * source that fetches ahead what it will read (objects.c): sample() is the
 * dataset index of row @row of batch @batch of @epoch, rows() that batch's
 * rows (0 for one it skips); @batches per epoch. @arg is plain data of
 * @arg_size bytes the source may copy. */
struct sample_order {
	uint64_t (*sample)(const void *arg, uint64_t epoch, uint64_t batch, uint32_t row);
	uint32_t (*rows)(const void *arg, uint64_t epoch, uint64_t batch);
	uint64_t batches;
	uint64_t epochs;            /* the stream ends before this one (0: endless) */
	const void *arg;
	size_t arg_size;
};

struct sample_ctx {
	uint64_t seed;
	uint64_t epoch;
	/* stall accounting: a source that tells its stages apart adds their ns
	 * here (NULL: do not time); the rest of the task's time is read time */
	uint64_t *stage_ns;
	/* augment seeds (docs/spec.md, "Augment seeds"): the sample is written
	 * nmore times more, with more_seeds[i] in place of seed, into
	 * more_dsts[i * nfields ...]; one decode serves them all (images) */
	uint32_t nmore;
	const uint64_t *more_seeds;
	void *const *more_dsts;
	/* the order the sample's stream reads in, and the batch of it being
	 * built (NULL: not known, a client's own order) */
	const struct sample_order *order;
	uint64_t batch;
};

/* The stages a sample's time is split into (status "stage_seconds_total"). */
enum { STAGE_READ, STAGE_DECODE, STAGE_TRANSFORM, STAGE_COLLATE, STAGES };

/**
 * source_open() - open the dataset files of a spec and check them.
 * @err: names the file and what is wrong with it
 *       ("x.npy: Fortran order is not supported")
 * Return: 0, -EINVAL (bad file), -ENOENT... with @err set.
 */
int source_open(struct source **out, const struct spec *spec, char *err, size_t errlen);
/* The same, reading every file with @who's permissions (creds.h): the
 * pipeline's creator's. source_open() reads as the daemon. */
struct creds;
int source_open_as(struct source **out, const struct spec *spec, const struct creds *who,
		   char *err, size_t errlen);
struct source *source_free(struct source *src);

uint64_t source_nsamples(const struct source *src);
/* With "shuffle_window": the first sample of each shard, nshards + 1 entries
 * (the last is n), for the sampler's windows; NULL otherwise. */
const uint64_t *source_shard_first(const struct source *src, uint32_t *nshards);
size_t source_nfields(const struct source *src);
const struct field_desc *source_field(const struct source *src, size_t i);

/**
 * source_read() - write sample @idx into its place in a batch.
 * @ctx: the pipeline's seed and the epoch, for random augmentations (NULL:
 *       seed 0, epoch 0); npy ignores it, tokens with random_offset reads
 *       the epoch
 * @dsts: one destination per field, each field's sample_bytes long
 *
 * Thread-safe: the workers call it concurrently. Reads with pread, never
 * through a mapping, so a file truncated under a running pipeline gives an
 * error ("train.bin: truncated: ...") instead of SIGBUS.
 *
 * Images: a file that cannot be read or decoded is, with on_error "skip",
 * replaced by the next good sample in dataset order (idx+1, idx+2...,
 * wrapping), transformed as that sample is, and counted (source_skipped());
 * a sample found bad is not read again while the source lives. With "fail" it is an error naming the file and the decoder's message.
 * Return: 0 or a negative errno with @err set.
 */
int source_read(struct source *src, const struct sample_ctx *ctx, uint64_t idx, void *const *dsts,
		char *err, size_t errlen);

/* Distinct samples found bad so far (on_error "skip"), each counted once;
 * 0 for other sources. */
uint64_t source_skipped(const struct source *src);
/* Images decoded so far (a decode serves every augment seed of a sample);
 * 0 for other sources. */
uint64_t source_decoded(const struct source *src);
/* Memory of the source's index of its samples (image sources: the listing
 * or the tar index and the bad-sample map; tokens: its files and segments);
 * 0 for others. */
uint64_t source_index_bytes(const struct source *src);
/* Memory the source holds beside the slab that counts against the memory
 * limit: an image pipeline's decoded-image cache (its arena); 0 for others. */
uint64_t source_memory_bytes(const struct source *src);
/* -ENOSPC with @err set when what @spec's source would hold beside the slab
 * (an image pipeline's decoded-image cache, cache.bytes) is above the memory
 * limit @limit: checked at create, before the dataset is listed, and by
 * --check-config. 0 for the kinds that hold nothing so. */
int source_check_limit(const struct spec *spec, uint64_t limit, char *err, size_t errlen);
/* Status "cache" of an image pipeline with a decoded-image cache (hits,
 * misses, entries, bytes_used...; imagecache.h), else NULL. */
json_t *source_cache_json(const struct source *src);
/* The kind's own keys of a pipeline's status, an object added to it beside
 * the general keys, never in their place (a blend: "source", its parts and
 * the samples read of each; tokens with packing: "packing", docs/spec.md;
 * every tokens pipeline: "corpus"), or NULL for kinds that have none. */
json_t *source_status_json(const struct source *src);
/* Do its samples depend on the seed (image sources with random transforms)?
 * If not, every augment seed gives the same bytes. */
bool source_augments(const struct source *src);
/* Its batches are built outside the daemon (python: pyworkers.c), never
 * with source_read(). */
bool source_external(const struct source *src);
/* Count @n samples skipped by an external builder. */
void source_add_skipped(struct source *src, uint64_t n);

/*
 * The daemon's cache directory (config key cache_dir, docs/config.md): where
 * sources keep what they build from a dataset and every pipeline of the node
 * reuses (the megatron kind's indexes). Set at start; NULL or "" for none.
 * source_cache_dir() copies it into @buf: its length, or 0 when there is
 * none (or it does not fit).
 */
int source_set_cache_dir(const char *dir);
size_t source_cache_dir(char *buf, size_t len);

/*
 * Objects in a store (objects.c, docs/storage.md): a spec's s3:// and
 * https:// paths are read from the node's object cache, cache_dir/objects,
 * within cache_bytes; source_set_object_cache() opens it at start (a
 * cache_dir of NULL or "": none, and such paths fail). Its counters for
 * status and /metrics: source_object_cache_json().
 */
int source_set_object_cache(const char *cache_dir, uint64_t max_bytes, char *err, size_t errlen);
json_t *source_object_cache_json(void);

/*
 * A source whose objects are more than cache_bytes reads them as a stream
 * (docs/storage.md): its fetch-ahead threads hold at most fetch_ahead bytes
 * (config key fetch_ahead; at most half of cache_bytes) of objects its
 * reads will need. source_set_fetch_ahead() at start (0: the default).
 * source_store_endpoint(): the store a streamed source, or one read by
 * range, reads (NULL: none);
 * source_fetch_wait_ns(): the time its reads waited for objects so far;
 * source_stream_json(): its status (a pipeline's store.stream), NULL when
 * it does not stream.
 */
#define SOURCE_FETCH_AHEAD_DEFAULT (256ull << 20)
void source_set_fetch_ahead(uint64_t bytes);
const char *source_store_endpoint(const struct source *src);
uint64_t source_fetch_wait_ns(const struct source *src);
json_t *source_stream_json(const struct source *src);

/*
 * Read-ahead of a source read by range (docs/storage.md, "Read by range";
 * objects.c), for a worker building rows of a batch:
 * source_ahead_wanted(): @src reads its objects by range (a GET a piece);
 * then source_ahead_record(), and each row read once with source_read()
 * (nothing is read: each read's ranges are noted, its bytes in the batch
 * left meaningless, its outcome ignored); source_ahead_start() GETs the
 * noted ranges, up to 16 at once within fetch_ahead bytes; each row read
 * again with source_read() takes its bytes from there (a failed GET is its
 * read's error, as if it had made it); source_ahead_end() waits for the
 * GETs under way and drops the rest. The plan is the calling thread's.
 */
bool source_ahead_wanted(const struct source *src);
void source_ahead_record(void);
void source_ahead_start(void);
void source_ahead_end(void);

/* Status's store.ranged, ranged_gets, ranged_bytes of a source that reads
 * its objects by range (source-private.h), NULL for any other. */
json_t *source_ranged_json(const struct source *src);

/*
 * The creator's object-store credentials, sent by its client with the
 * create and maybe handed afresh later (SetStore): kept in its spec
 * (spec->keys), in memory only, for its source's requests, never shown nor
 * logged; spec_free() drops them. A refcounted, immutable object:
 *
 * source_keys_new(): from the client's strings (empty where it has none)
 * and @expires (Unix seconds, UTC; 0 not known). -EINVAL for an endpoint
 * that is not http(s)://HOST[:PORT] or a key id without its secret.
 * spec_set_store_keys(): gives @k (its reference) to a spec being created.
 * spec_swap_store_keys(): gives @k to a live pipeline's spec in place of
 * its keys: the requests that start after it use @k, those in flight finish
 * with the old keys, which are wiped when the last of them is done. -EINVAL
 * (@k not taken) when the spec has no keys (names no object) or @k names
 * another endpoint or region.
 * source_keys_take()/source_keys_put(): a reference to a spec's current
 * keys (NULL: none) for a request, and its release (the last wipes them).
 * source_keys_explain(): appends to @err, for a refusal (-EACCES) by keys
 * past their known expiry, "the credentials of pipeline 'P' expired at
 * <UTC>; hand it fresh ones with ..."; returns @r.
 * spec_store_json(): status's "store" of a pipeline (endpoint, region, the
 * key id's last 4 characters, the expiry), NULL without keys.
 */
struct source_keys;
int source_keys_new(struct source_keys **out, const char *access_key, const char *secret_key,
		    const char *session_token, const char *region, const char *endpoint, int64_t expires,
		    char *err, size_t errlen);
void spec_set_store_keys(struct spec *spec, struct source_keys *k);
int spec_swap_store_keys(struct spec *spec, struct source_keys *k, char *err, size_t errlen);
struct source_keys *source_keys_take(const struct spec *spec);
void source_keys_put(struct source_keys *k);
int source_keys_explain(const struct source_keys *k, const char *pipeline, int r, char *err, size_t errlen);
/* After spec_swap_store_keys(): @src lets go of the store of the old keys
 * now (wiping them), or when the requests that use it are done; never
 * waits (a source busy under its lock does it at its next request). */
void source_objects_rekeyed(struct source *src);
/*
 * A read of a streamed object that the store refused for the pipeline's
 * keys (EACCES: AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch,
 * ExpiredToken) marks the calling thread: source_read_refused() says
 * whether the thread's last object read was so refused, so that the engine
 * waits for fresh keys instead of failing or skipping (docs/storage.md,
 * "A refusal while streaming"). source_read_refused_clear() before a task.
 */
bool source_read_refused(void);
void source_read_refused_clear(void);
/*
 * Why the calling thread's last read of a streamed object failed: 0 (not
 * the store's doing, or no failure), SOURCE_READ_KEYS (the refusal above),
 * SOURCE_READ_STORE (the store did not answer, its retries spent: 5xx or
 * 429, a stall, a cut body, no connection). Neither is a bad sample: the
 * engine builds the batch again (docs/storage.md, "A store outage while
 * streaming").
 */
enum { SOURCE_READ_KEYS = 1, SOURCE_READ_STORE = 2 };
int source_read_why(void);
/* How long one request to a store is retried (config store_retry_seconds;
 * 0 at start: SOURCE_STORE_RETRY_DEFAULT), and the bound in force. */
#define SOURCE_STORE_RETRY_DEFAULT 20.0
void source_set_store_retry(double seconds);
double source_store_retry(void);
/* The endpoints a store may reach (config store_endpoints; NULL: any;
 * store_set_endpoints()), and the list in force (a JSON array, or null). */
int source_set_store_endpoints(char *const *list, char *err, size_t errlen);
json_t *source_store_endpoints_json(void);
json_t *spec_store_json(const struct spec *spec);
