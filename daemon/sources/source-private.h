/* SPDX-License-Identifier: MIT */
/* source-private - what one source kind implements, and what it may use */
#pragma once

/*
 * A source kind is one file (source-tokens.c, source-npy.c, source-images.c)
 * that defines a struct source_ops, plus one entry of the kind table in
 * kinds.c naming its spec "kind" values. The kind parses its own spec keys
 * (spec.c calls it for them), writes them back into the canonical form, and
 * opens and reads its dataset (kinds.c calls it for that).
 */
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/creds.h"
#include "source.h"

struct spec;                     /* spec.h: the kinds parse and open it */

/* An open source; a kind's own state follows it (ops->size bytes in all). */
struct source {
	const struct source_ops *ops;
	uint64_t nsamples;
	size_t nfields;
	struct field_desc fields[SOURCE_MAX_FIELDS];
	_Atomic uint64_t skipped;     /* source_skipped() */
	_Atomic uint64_t decoded;     /* source_decoded() */
	bool augments;                /* source_augments(), set by open */
	uint64_t index_bytes;         /* source_index_bytes(), set by open */
	uint64_t memory_bytes;        /* source_memory_bytes(), set by open */
	struct creds who;             /* its files are opened as (creds.h) */
	struct source_objects *objs;  /* its objects in a store (objects.c) */
	uint64_t *shard_first;        /* source_shard_first(), set by open */
	uint32_t nshards;
};

struct source_ops {
	/* The "source" object of a spec, spec->kind already set (every key of
	 * @src but "kind" is the hook's to check). */
	int (*parse)(struct spec *spec, json_t *src, char *err, size_t errlen);
	/* The kind's own top-level keys, NULL-terminated (NULL: none), parsed
	 * by parse_options from the whole spec object; another kind's spec
	 * with one is "KEY: only for <options_for>". */
	const char *const *options;
	const char *options_for;
	int (*parse_options)(struct spec *spec, json_t *obj, char *err, size_t errlen);
	/* The canonical "source" object, with every default filled in. */
	json_t *(*source_json)(const struct spec *spec);
	/* Add the canonical form of the own top-level keys to @obj (NULL: none). */
	int (*options_json)(const struct spec *spec, json_t *obj);
	/* Release what parse put in spec->source beyond spec_free()'s fields
	 * (NULL: nothing); also after a failed parse. */
	void (*free_spec)(struct spec *spec);

	size_t size;                  /* of the kind's struct, struct source first */
	/* Open the dataset, on a zeroed struct of ops->size bytes. */
	int (*open)(struct source *src, const struct spec *spec, char *err, size_t errlen);
	/* source_read(), idx already checked against nsamples; ctx->nmore is
	 * 0 unless open set src->augments. */
	int (*read)(struct source *src, const struct sample_ctx *ctx, uint64_t idx,
		    void *const *dsts, char *err, size_t errlen);
	/* Status "cache" (source_cache_json()); NULL: the kind has none. */
	json_t *(*cache_json)(const struct source *src);
	/* source_status_json(): the kind's own status keys; NULL: none. */
	json_t *(*status_json)(const struct source *src);
	/* source_check_limit(): what the spec will hold beside the slab against
	 * the memory limit, before anything is opened; NULL: nothing. */
	int (*check_limit)(const struct spec *spec, uint64_t limit, char *err, size_t errlen);
	/* Release what open got, also after a failed open. */
	void (*close)(struct source *src);
	/* Built outside the daemon (python: pyworkers.c); read is never called. */
	bool external;
};

struct source_kind_entry {
	const char *name;             /* source.kind in a spec */
	enum source_kind kind;
	const struct source_ops *ops;
};

extern const struct source_ops source_tokens_ops, source_npy_ops, source_images_ops,
	source_python_ops, source_blend_ops;
extern const struct source_ops source_megatron_ops;

/*
 * Paths that name objects in a store (objects.c): s3://, https://, http://.
 * source_open_path(): ds_open() of a local path, or a new fd of a URL's
 * cached copy (fetched now if source_range_urls() or source_stream_urls()
 * did not).
 */
struct stat;
bool source_is_url(const char *path);
int source_open_path(const struct source *src, const char *path, struct stat *st, char *err, size_t errlen);
/*
 * Read as a stream (docs/storage.md, "Read as a stream"): a kind whose
 * objects may be more than cache_bytes calls source_stream_urls(): the
 * URLs among @paths HEADed as the creator and, when they fit, fetched into
 * the node's cache, several at once, kept open for the source's life;
 * when they do not fit, it only HEADs them, and
 * every read then goes through source_open_read() (a URL's cached copy,
 * fetched now when neither there nor on its way; a local path's ds_open())
 * and source_close_read() with the @hold it gave. @object_of names the
 * object of dataset index @idx (NULL: none). source_note_read(), before a
 * sample's reads: the order its stream reads in, which the source's
 * fetch-ahead threads follow within fetch_ahead bytes.
 */
int source_stream_urls(struct source *src, char *const *paths, size_t n, const char *(*object_of)(void *arg,
		       uint64_t idx), void *arg, char *err, size_t errlen);
/* source_stream_urls() of a kind with no index to build from its objects'
 * bytes (an image folder: one object a sample): when they do not fit,
 * nothing is fetched at create, each object only when read (or fetched
 * ahead of the reads). */
int source_stream_objects(struct source *src, char *const *paths, size_t n, const char *(*object_of)(void *arg,
			  uint64_t idx), void *arg, char *err, size_t errlen);
bool source_streams(const struct source *src);
void source_note_read(const struct source *src, const struct sample_ctx *ctx);
int source_open_read(const struct source *src, const char *path, struct stat *st, size_t *hold, char *err,
		     size_t errlen);
void source_close_read(const struct source *src, int fd, size_t hold);
/* A streamed source's objects are fetched ahead of its index at create
 * (source_stream_urls(), FETCH_THREADS at once, within fetch_ahead), the
 * index reading them in the order given: once it is built (or failed),
 * source_index_ahead_end() stops that and gives back what it held. */
void source_index_ahead_end(const struct source *src);
/*
 * A kind that reads a part of an object per sample (tokens) and can read
 * it by range: source_range_urls() fetches them as source_stream_urls()
 * does when they fit, but objects more than cache_bytes in all are not
 * fetched: HEADed only (sizes, ETags,
 * the creator's keys checked) and read by range (docs/storage.md, "Read by
 * range"). source_ranged(): @path is so read (no fd to open);
 * source_object_size(): its size from the create's HEAD;
 * source_read_range(): @len bytes from @off into @buf, one ranged GET
 * If-Match the create's ETag (a changed object: -ESTALE naming it); a
 * refusal or an outage marks the thread as a streamed read does
 * (source_read_why()).
 */
int source_range_urls(struct source *src, char *const *paths, size_t n, char *err, size_t errlen);
bool source_ranged(const struct source *src, const char *path);
int source_object_size(const struct source *src, const char *url, uint64_t *size, char *err, size_t errlen);
int source_read_range(const struct source *src, const char *url, uint64_t off, size_t len, void *buf, char *err,
		      size_t errlen);
/*
 * source_stream_by_range(): a source of source_stream_urls() that streams
 * (its objects more than cache_bytes), its index built, read by range from
 * now on: source_ranged() true, no fetch-ahead (a shuffled webdataset,
 * whose samples' members are each a range of a shard).
 * source_ahead_recording(): the calling worker's reads now only note their
 * ranges (source.h, the read-ahead's first pass): a kind may then
 * source_ahead_note() each and skip the rest of the read (a decode).
 */
void source_stream_by_range(struct source *src);
bool source_ahead_recording(void);
void source_ahead_note(const struct source *src, const char *url, uint64_t off, size_t len);
/*
 * source_range_urls_but(): source_range_urls(), but when the objects are
 * read by range those @whole(@arg, url) names are fetched whole into the
 * cache all the same (a megatron .idx: its index needs all of it), opened
 * then with source_open_path(); one more than cache_bytes (or all of them)
 * is -EFBIG naming it, the size and the bound, then @why.
 * source_object_id(): "ENDPOINT URL ETAG SIZE" of an object the create
 * HEADed, what names its bytes (an index built from them is keyed by it);
 * -ENOENT when the store gave no ETag or it is no object of @src.
 */
int source_range_urls_but(struct source *src, char *const *paths, size_t n,
			  bool (*whole)(void *arg, const char *url), void *arg, const char *why,
			  char *err, size_t errlen);
int source_object_id(const struct source *src, const char *url, char *buf, size_t len);
/* A blend's @parts (alive as long as it): status's store.ranged and the
 * store its reads wait on (source_ranged_json(), source_store_endpoint())
 * are those of its parts read by range. */
void source_objects_parts(struct source *src, struct source *const *parts, size_t n);
/* Every key under s3://bucket/prefix (store_list(), as the creator). */
int source_list_url(const struct source *src, const char *url, int (*fn)(void *arg, const char *key,
		    uint64_t size, const char *etag), void *arg, char *err, size_t errlen);
int source_objects_new(struct source *src, const struct spec *spec);
/*
 * source_open_as() of @spec whose objects are fetched with @keys_of's keys
 * (its spec->keys, the current ones): a blend's part, which has none of
 * its own, with the pipeline's (the blend's spec's).
 */
int source_open_part(struct source **out, const struct spec *spec, const struct spec *keys_of,
		     const struct creds *who, char *err, size_t errlen);
void source_objects_free(struct source *src);

/* The kind table (kinds.c), in the order spec errors list the names. */
extern const struct source_kind_entry source_kinds[];
extern const size_t source_nkinds;
const struct source_kind_entry *source_kind_named(const char *name);
const struct source_ops *source_kind_ops(enum source_kind kind);

/* ---- for opening and reading (kinds.c) ---- */

/* Open a regular file read-only as the source's @who; @err names it. */
int source_open_file(const struct source *src, const char *path, int *fd_out, uint64_t *size_out,
		     char *err, size_t errlen);
/* A buffer of at least @len bytes of the calling worker thread's own (one
 * per thread, grown as asked, freed when the thread exits; 16-byte
 * aligned): a sample's scratch space. NULL when out of memory. */
void *source_scratch(size_t len);
/* Read exactly @len bytes at @off with pread; a short read is a truncated file. */
int source_read_full(int fd, const char *path, void *buf, size_t len, uint64_t off, char *err,
		     size_t errlen);

/* ---- for a parse hook (spec.c); errors read "spec: ..." ---- */

/* errfmt() (common.h) with "spec: " in front; returns -EINVAL. */
__attribute__((format(printf, 3, 4)))
int spec_fail(char *err, size_t errlen, const char *fmt, ...);
/* The first key of @obj not in @keys (NULL-terminated), or NULL. */
const char *spec_unknown_key(json_t *obj, const char *const *keys);
/* An integer in [min, max], "@label: must be @what" otherwise; absent keeps *out. */
int spec_get_int(json_t *obj, const char *key, const char *label, int64_t min, int64_t max,
		 const char *what, int64_t *out, char *err, size_t errlen);
/* A number, as a double. */
bool spec_get_number(json_t *v, double *out);
/* A non-empty string without NUL bytes, or NULL. */
const char *spec_plain_string(json_t *v);
/* source.path: a required non-empty string, copied into *out. */
int spec_required_path(json_t *src, char **out, char *err, size_t errlen);
/* A JSON array of @n strings, or NULL. */
json_t *spec_strings_json(char **v, size_t n);
