/* SPDX-License-Identifier: MIT */
/* objcache - the node's one cache of objects fetched from a store
 *
 * Whole objects on local disk under the daemon's cache_dir (objects/),
 * keyed by endpoint, URL and ETag, for every pipeline and every later job
 * of the node, within cache_bytes, least recently used evicted first. An
 * object is fetched into a temporary name and renamed once its length is
 * the HEAD's and it matches the sums the store gives (its ETag's MD5, an
 * x-amz-checksum-*: store.h): a partial or corrupted file is never served, and a restart deletes the
 * temporaries and reuses the complete files. An object a source holds
 * (objcache_open()'s pin) is never evicted under it.
 *
 * The cache checks no one: the caller HEADs the object with the user's
 * own credentials first and asks for the ETag that HEAD saw
 * (docs/security.md, "Objects in a store").
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct store;
struct store_object;

/**
 * objcache_init() - open (or make, 0700) the cache folder @dir
 * @max_bytes: the bound (cache_bytes)
 *
 * Deletes what a crash left (temporaries, a file without its id or the id
 * without its file, a file of another length than its id says), indexes
 * the rest by modification time (the LRU order survives a restart) and
 * evicts down to @max_bytes. Once, at the daemon's start.
 */
int objcache_init(const char *dir, uint64_t max_bytes, char *err, size_t errlen);

/* The bound, 0 when there is no cache (objcache_init() not called). */
uint64_t objcache_max_bytes(void);

struct objcache_pin;

/**
 * objcache_open() - a read-only fd of @url's object @obj (its HEAD), from
 * the cache or fetched into it with @st (the same user's store)
 * @pin: held until objcache_unpin(): the object is not evicted meanwhile
 *
 * Concurrent opens of one object fetch it once. Return: 0; -EFBIG (larger
 * than the cache), -ENOSPC (what the pins hold leaves no room), the
 * store's errors (store.h), -EIO (the body's length is not the HEAD's, or
 * it does not match its sums: store_get_fd()), each naming @url.
 */
int objcache_open(struct store *st, const char *url, const struct store_object *obj, int *fd,
		  struct objcache_pin **pin, char *err, size_t errlen);
void objcache_unpin(struct objcache_pin *pin);
/* Wait until what is pinned (or on its way) leaves room for @size more
 * bytes, or CLOCK_REALTIME @deadline_ns: whether there is room. */
bool objcache_wait_room(uint64_t size, uint64_t deadline_ns);

struct objcache_stats {
	uint64_t max_bytes;      /* cache_bytes */
	uint64_t bytes_used;     /* of complete objects and fetches under way */
	uint64_t objects;
	uint64_t pinned;         /* objects held by open sources */
	uint64_t hits, misses;   /* objcache_open()s found, fetched */
	uint64_t bytes_fetched;  /* from the stores, since the start */
	uint64_t evictions;
	uint64_t checksum_mismatches; /* bodies that did not match their sums (store.h) */
	uint64_t rechecked;      /* objects of another boot checked at their first open */
	uint64_t recheck_failures; /* of those, found torn and fetched again */
	uint64_t fetching, fetching_bytes; /* fetches under way now */
};

void objcache_get_stats(struct objcache_stats *out);
