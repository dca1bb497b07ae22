/* SPDX-License-Identifier: MIT */
/* spec - parse and validate a pipeline spec (JSON, docs/spec.md) */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "loader/loader.h"
#include "source.h"

/* Image transforms, applied in order (docs/spec.md, "Image pipelines"). */
enum transform_op {
	TRANSFORM_RANDOM_RESIZED_CROP,
	TRANSFORM_RESIZE,
	TRANSFORM_CENTER_CROP,
	TRANSFORM_HORIZONTAL_FLIP,
	TRANSFORM_NORMALIZE,
};

/* tokens: what a window of L+1 tokens may not cross (docs/spec.md) */
enum tokens_boundaries {
	TOKENS_BOUNDARIES_FILE,       /* default */
	TOKENS_BOUNDARIES_DOCUMENT,   /* an eos token or a file's end */
	TOKENS_BOUNDARIES_NONE,       /* the files as one stream */
};
#define TOKENS_PATHS_MAX 100000       /* entries of source.paths */
#define TOKENS_FILES_MAX 1000000      /* files they name, expanded */

#define SPEC_TRANSFORMS_MAX 16
#define SPEC_IMAGE_SIZE_MAX 16384
/* decode.max_pixels: default 2^26 (8192 x 8192, 192 MiB of RGB to decode),
 * at most IMAGE_MAX_PIXELS (image.h) */
#define SPEC_MAX_PIXELS_DEFAULT (1ull << 26)
#define SPEC_URLS_MAX 4096

struct transform {
	enum transform_op op;
	uint32_t size[2];             /* [h, w]; resize to the shorter side: [s, 0] */
	double scale[2];              /* random_resized_crop */
	double ratio[2];              /* random_resized_crop */
	double p;                     /* horizontal_flip */
	double mean[3], std[3];       /* normalize (used as float32, as torchvision) */
};

struct blend_spec;

struct spec {
	char name[LDR_NAME_MAX + 1];
	enum source_kind kind;
	/* the kind's own settings, filled in by its parse hooks */
	struct {
		char *path;           /* tokens */
		int dtype;            /* tokens: uint16, uint32 or int32 */
		uint32_t seq_len;     /* tokens */
		int output_dtype;     /* tokens: int64 (default) or the source dtype */
		char **paths;         /* npy; tokens: "paths" as written (patterns) */
		size_t npaths;        /* npy, tokens */
		/* tokens (source-tokens.c): a corpus of many files */
		struct {
			int boundaries;       /* enum tokens_boundaries */
			int64_t eos;          /* a token id, -1: none */
			bool random_offset;   /* "sampling": "random_offset" */
			uint64_t samples_per_epoch;  /* random_offset */
			bool packing;         /* rows of seq_len + 1 tokens of whole documents */
		} tokens;
		char *root;           /* image_folder */
		char **urls;          /* webdataset: shard paths or brace patterns */
		size_t nurls;         /* webdataset */
		json_t *py;           /* python: the canonical source object */
		bool py_collate;      /* python: a collate_fn builds whole batches */
		struct blend_spec *blend; /* blend: its parts, each a spec (source-blend.c) */
		json_t *mg;           /* megatron: the canonical source object */
	} source;
	/* image sources only */
	struct transform transforms[SPEC_TRANSFORMS_MAX];
	size_t ntransforms;
	int image_dtype;              /* output.dtype: uint8, float16, bfloat16, float32 */
	bool image_nhwc;              /* output.layout NHWC (default NCHW) */
	uint32_t image_h, image_w;    /* the fixed output size, from the transforms */
	bool on_error_fail;           /* on_error: "fail" (default "skip") */
	bool on_error_raise;          /* on_error: "raise" (python sources' default): a
	                               * failed batch is an error at its place in the
	                               * stream, which goes on (stream.c, job_done()) */
	bool dct_scaling;             /* decode.dct_scaling, default true */
	uint64_t max_pixels;          /* decode.max_pixels, default SPEC_MAX_PIXELS_DEFAULT */
	/* "cache" (docs/spec.md, "Decoded-image cache"); part of the canonical
	 * form, as it changes the pixels (a full decode, max_side) */
	bool cache_decoded;           /* cache.decoded: keep every decoded image */
	uint32_t cache_max_side;      /* cache.max_side: 0 = keep the full size */
	uint64_t cache_bytes;         /* cache.bytes: the most the cache holds */
	uint32_t batch_size;          /* default 32 */
	bool shuffle;                 /* default false */
	uint64_t seed;                /* default 0 */
	uint32_t shuffle_window;      /* shards mixed together, 0: the plain shuffle */
	bool drop_last;               /* default false */
	uint64_t epochs;              /* default 1, 0 = endless */
	uint32_t prefetch;            /* slots, 2..1024; 0: "auto", sized at create */
	uint32_t min_clients;         /* broadcast waits for this many, default 1 */
	/* lifetime (docs/spec.md, "Lifetime"): not part of the canonical form,
	 * so two specs that differ only here are the same pipeline */
	bool persist;                 /* kept until dropped, default false */
	bool has_persist;             /* "persist" was given */
	bool has_ttl;                 /* "ttl" was given */
	uint64_t ttl_ms;              /* unused this long before it is dropped */
	/* a stopped broadcast client (docs/spec.md, "Slow broadcast clients"):
	 * not part of the canonical form either */
	bool slow_skip;               /* "slow_clients": "skip" (default "wait") */
	bool has_slow_timeout;        /* "slow_client_timeout" was given */
	uint64_t slow_timeout_ms;
	uint32_t max_lag;             /* 0: the client's share */
	/* who may use it (docs/security.md): not part of the canonical form
	 * either; the creator's spec decides */
	int access;                   /* enum spec_access */
	bool has_group;               /* "group" was given */
	unsigned group;               /* its gid, for "access": "group" */
	json_t *json;                 /* the spec with every default filled in */
	/* the creator's object-store credentials (objects.c): not part of the
	 * canonical form, never shown; NULL: none sent */
	struct source_keys *keys;
};

#define SPEC_TTL_MAX_S 31536000   /* a year */
#define SPEC_SLOW_TIMEOUT_MAX_S 86400

/* "access": who besides its owner and the admins may attach to a pipeline,
 * see it in status and join it by name. */
enum spec_access {
	SPEC_ACCESS_DEFAULT,      /* not given: owner (a client's), all (the config's) */
	SPEC_ACCESS_OWNER,
	SPEC_ACCESS_GROUP,        /* members of "group", default the creator's gid */
	SPEC_ACCESS_ALL,
};

/**
 * spec_parse() - parse and validate a spec.
 * @out: receives the spec
 * @text: JSON text
 * @err: receives a message naming the offending key, e.g.
 *       "spec: batch_size: must be an integer in 1..1048576"
 *
 * Unknown keys, wrong types and values out of range are errors.
 * Return: 0 or -EINVAL (with @err set) or -ENOMEM.
 */
int spec_parse(struct spec **out, const char *text, char *err, size_t errlen);
/* Same, from an already parsed object (a pipeline of the config file). */
int spec_from_json(struct spec **out, json_t *obj, char *err, size_t errlen);
struct spec *spec_free(struct spec *spec);
/* The source is image_folder or webdataset (transforms, output...); source-images.c. */
bool spec_is_image(const struct spec *spec);
/* Two specs describe the same pipeline (for create with exist_ok). */
bool spec_equal(const struct spec *a, const struct spec *b);
/* A fingerprint of the canonical form (FNV-1a 64 of its sorted compact JSON),
 * so a client can tell that a pipeline is still the one it attached; 0 when
 * out of memory. */
uint64_t spec_hash(const struct spec *spec);
/**
 * spec_diff() - how @want differs from @have, their canonical forms compared
 * key by key (nested keys as "source.path").
 * @buf: receives e.g. "batch_size 64 (it has 32), shuffle true (it has false)";
 *       a key only one side has reads "source.paths [...] (it has none)" or
 *       "no source.path (it has \"/t.bin\")"; what does not fit ends in
 *       "and N more"
 * Return: the number of keys that differ (0 when the specs are equal).
 */
size_t spec_diff(const struct spec *want, const struct spec *have, char *buf, size_t len);
/*
 * The field name of an npy path: its file stem (basename without ".npy");
 * source-npy.c.
 * Return: the length, or -EINVAL when it is empty or longer than LDR_NAME_MAX.
 */
int spec_npy_stem(const char *path, char buf[LDR_NAME_MAX + 1]);
