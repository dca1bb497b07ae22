/* SPDX-License-Identifier: MIT */
/* imagecache - an image pipeline's decoded pixels, kept for the epochs after */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "imageop.h"
#include "sources/spec.h"

struct imagecache;

/* One cached image: its header's size (what the crops are drawn on), the
 * size of the pixels kept (smaller where cache.max_side reduced it), its
 * label, then packed RGB. */
struct imagecache_entry {
	uint32_t w, h;                /* the image as its file declares it */
	uint32_t cw, ch;              /* the pixels below */
	int64_t label;
	uint8_t pix[];
};

struct imagecache_stats {
	uint64_t hits;                /* samples cut from cached pixels */
	uint64_t misses;              /* samples read from their file (bad ones too) */
	uint64_t entries;             /* images cached */
	uint64_t bytes_used;          /* of the arena, headers and alignment included */
	uint64_t bytes;               /* the arena: counted against the memory limit */
	uint64_t refused;             /* images decoded but not kept: no room left */
};

/* The spec's "cache" object (@v; NULL: none) into @spec; errors name the key. */
int imagecache_parse(struct spec *spec, json_t *v, char *err, size_t errlen);
/* Its canonical form, or NULL when the cache is off (then the key is left out). */
json_t *imagecache_spec_json(const struct spec *spec);

/* -ENOSPC with @err set when cache.bytes is above the memory limit @limit
 * (checked at create, before the dataset is listed, and by --check-config). */
int imagecache_check_limit(const struct spec *spec, uint64_t limit, char *err, size_t errlen);

/* The arena's size for @spec over @nsamples images: cache.bytes, or less
 * when no image can take more than max_side (or decode.max_pixels) allows. */
uint64_t imagecache_capacity(const struct spec *spec, uint64_t nsamples);

/**
 * imagecache_new() - an empty cache for @nsamples images of @spec: its
 * arena reserved (address space only; pages are taken as images come) and
 * one word a sample.
 * Return: 0, or -ENOMEM with @err set.
 */
int imagecache_new(struct imagecache **out, const struct spec *spec, uint64_t nsamples,
		   char *err, size_t errlen);
void imagecache_free(struct imagecache *c);
/* What it holds besides the arena (one word a sample), for index_bytes. */
uint64_t imagecache_index_bytes(const struct imagecache *c);

/* Sample @j's cached image (a hit), or NULL (a miss); counted. Lock-free. */
const struct imagecache_entry *imagecache_get(struct imagecache *c, uint64_t j);
/* Sample @j is cached (no hit or miss counted). */
bool imagecache_has(struct imagecache *c, uint64_t j);

/**
 * imagecache_decode_run() - a miss: decode sample @j's file @data (probed into
 * @info) once, keep it when there is room, and write plan i's sample (one per
 * augment seed, @n of them) into @dsts[i], from the same pixels either way:
 * the whole image at full scale, or reduced to max_side (so a sample's bytes
 * never depend on whether it was cached, nor on which worker came first).
 * @op: with dct_scaling off (images_open clears it under a cache)
 * @decodes: incremented per decode made (one; none when the file is bad)
 * Adds the resampling time to @s->transform_ns.
 * Return: 0, or -EINVAL with the decoder's message in @err (nothing is kept),
 * or -ENOMEM.
 */
int imagecache_decode_run(struct imagecache *c, const struct imageop *op, struct image_scratch *s,
			  const struct imageop_plan *plans, size_t n, uint64_t j, int64_t label,
			  const uint8_t *data, size_t len, const struct image_info *info,
			  void *const *dsts, unsigned *decodes, char *err, size_t errlen);

void imagecache_stats(const struct imagecache *c, struct imagecache_stats *st);
/* Status "cache": hits, misses, entries, bytes_used, bytes, refused, max_side. */
json_t *imagecache_json(const struct imagecache *c);
