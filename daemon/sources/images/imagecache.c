/* SPDX-License-Identifier: MIT */
/* imagecache - an image pipeline's decoded pixels, kept for the epochs after */

/*
 * One arena of cache.bytes (address space reserved at open, pages taken as
 * images come), filled by a bump pointer, and one word a sample: empty,
 * being filled, refused (no room), or the offset of its entry. A worker that
 * misses claims the sample's word, decodes, takes the entry's bytes from the
 * arena with a compare-and-swap and publishes the offset with a release
 * store; readers load the word (acquire) and read the entry, which never
 * changes nor moves afterwards: no lock anywhere. Nothing is evicted: the
 * order is shuffled every epoch, so an LRU would only trade one cached image
 * for another; what came first stays, and once the arena is full the other
 * samples are decoded every time, as without a cache.
 *
 * A sample's pixels are the same whether it was cached or not (and whichever
 * worker came first): the whole image at full scale (the window a region
 * decode gives equals it bit for bit), or reduced to max_side by the same
 * computation either way.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "imagecache.h"
#include "base/size.h"
#include "sources/source-private.h"
#include "sources/spec.h"

#define ENTRY_ALIGN 64                /* entries on their own cache lines */
enum {
	SLOT_EMPTY,
	SLOT_BUSY,                    /* a worker is decoding it to keep it */
	SLOT_REFUSED,                 /* did not fit: never tried again */
	SLOT_ENTRY = ENTRY_ALIGN,     /* >= this: SLOT_ENTRY + the entry's offset */
};

struct imagecache {
	uint8_t *base;
	uint64_t cap;                 /* of the arena */
	uint32_t max_side;
	uint64_t nsamples;
	_Atomic uint64_t used;        /* the bump pointer */
	_Atomic uint64_t *slot;       /* one a sample */
	_Atomic uint64_t hits, misses, entries, refused;
};

/* ---- the spec ---- */

int imagecache_parse(struct spec *spec, json_t *v, char *err, size_t errlen)
{
	static const char *const keys[] = { "decoded", "max_side", "bytes", NULL };
	const char *key;
	json_t *d, *b;
	int64_t side = 0;
	int r;

	spec->cache_decoded = false;
	spec->cache_max_side = 0;
	spec->cache_bytes = 0;
	if (!v)
		return 0;
	if (!json_is_object(v))
		return spec_fail(err, errlen,
				 "cache: must be an object like {\"decoded\": true, \"bytes\": \"8G\"}");
	key = spec_unknown_key(v, keys);
	if (key)
		return spec_fail(err, errlen, "unknown key \"cache.%s\" (known: decoded, max_side, bytes)",
				 key);
	d = json_object_get(v, "decoded");
	if (!d)
		return spec_fail(err, errlen, "cache.decoded: is required (true keeps decoded images)");
	if (!json_is_boolean(d))
		return spec_fail(err, errlen, "cache.decoded: must be true or false");
	r = spec_get_int(v, "max_side", "cache.max_side", 1, SPEC_IMAGE_SIZE_MAX,
			 "an integer in 1..16384 (the longer side of a cached image)", &side, err,
			 errlen);
	if (r < 0)
		return r;
	b = json_object_get(v, "bytes");
	if (!b && json_is_false(d))
		return 0; /* no cache, as without the key */
	if (!b)
		return spec_fail(err, errlen,
				 "cache.bytes: is required (the most memory the cache holds, like \"8G\")");
	if (json_is_integer(b) && json_integer_value(b) > 0) {
		spec->cache_bytes = (uint64_t)json_integer_value(b);
	} else {
		r = json_is_string(b) ? size_parse(json_string_value(b), &spec->cache_bytes)
				      : -EINVAL;
		if (r == -ERANGE)
			return spec_fail(err, errlen,
					 "cache.bytes: \"%.64s\" is above the largest size, %" PRId64 " bytes",
					 json_string_value(b), (int64_t)SIZE_PARSE_MAX);
		if (r < 0 || !spec->cache_bytes)
			return spec_fail(err, errlen,
					 "cache.bytes: must be bytes (an integer above 0) or a size like \"8G\"");
	}
	if (json_is_false(d)) {
		spec->cache_bytes = 0; /* checked, unused: no cache */
		return 0;
	}
	spec->cache_decoded = true;
	spec->cache_max_side = (uint32_t)side;
	return 0;
}

json_t *imagecache_spec_json(const struct spec *spec)
{
	json_t *o;

	if (!spec->cache_decoded)
		return NULL;
	o = json_pack("{s:b, s:I}", "decoded", 1, "bytes", (json_int_t)spec->cache_bytes);
	if (o && spec->cache_max_side &&
	    json_object_set_new(o, "max_side", json_integer(spec->cache_max_side)) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int imagecache_check_limit(const struct spec *spec, uint64_t limit, char *err, size_t errlen)
{
	if (!spec->cache_decoded || spec->cache_bytes <= limit)
		return 0;
	return errfmt(-ENOSPC, err, errlen,
		      "spec: cache.bytes: %" PRIu64 " bytes is more than the memory limit, %" PRIu64
		      " bytes (--memory-limit, or memory_limit in the config)",
		      spec->cache_bytes, limit);
}

/* ---- sizes ---- */

/* The size kept of a @w x @h image: the longer side reduced to max_side
 * (the shorter one rounded half up, at least 1), else the image's. */
static void kept_size(uint32_t max_side, int w, int h, int *cw, int *ch)
{
	uint64_t lng = (uint64_t)(w >= h ? w : h), sht = (uint64_t)(w >= h ? h : w), ns;

	*cw = w;
	*ch = h;
	if (!max_side || lng <= max_side)
		return;
	ns = (sht * max_side + lng / 2) / lng;
	if (ns < 1)
		ns = 1;
	*cw = w >= h ? (int)max_side : (int)ns;
	*ch = w >= h ? (int)ns : (int)max_side;
}

static uint64_t entry_bytes(uint64_t cw, uint64_t ch)
{
	return ALIGN_UP(sizeof(struct imagecache_entry) + cw * ch * 3, ENTRY_ALIGN);
}

uint64_t imagecache_capacity(const struct spec *spec, uint64_t nsamples)
{
	uint64_t side = spec->cache_max_side, most, total;

	most = side ? entry_bytes(side, side) : entry_bytes(spec->max_pixels, 1);
	if (__builtin_mul_overflow(most, nsamples, &total) || total > spec->cache_bytes)
		total = spec->cache_bytes;
	return total;
}

/* ---- the arena ---- */

int imagecache_new(struct imagecache **out, const struct spec *spec, uint64_t nsamples,
		   char *err, size_t errlen)
{
	struct imagecache *c = calloc(1, sizeof(*c));

	*out = NULL;
	if (!c)
		return errfmt(-ENOMEM, err, errlen, "out of memory for the image cache");
	c->cap = imagecache_capacity(spec, nsamples);
	c->max_side = spec->cache_max_side;
	c->nsamples = nsamples;
	c->slot = calloc(nsamples ? nsamples : 1, sizeof(*c->slot));
	/* address space only: the pages come as images are kept, and go back
	 * (munmap) with the pipeline */
	c->base = mmap(NULL, c->cap, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (c->base == MAP_FAILED) {
		int e = errno;

		c->base = NULL;
		imagecache_free(c);
		return errfmt(-ENOMEM, err, errlen,
			      "cache.bytes: cannot reserve %" PRIu64 " bytes of address space: %s",
			      spec->cache_bytes, strerror(e));
	}
	if (!c->slot) {
		imagecache_free(c);
		return errfmt(-ENOMEM, err, errlen, "out of memory for the image cache of %" PRIu64
			      " samples", nsamples);
	}
#ifdef MADV_HUGEPAGE
	/* large images read row by row: fewer TLB misses (advice only) */
	madvise(c->base, c->cap, MADV_HUGEPAGE);
#endif
	*out = c;
	return 0;
}

void imagecache_free(struct imagecache *c)
{
	if (!c)
		return;
	if (c->base)
		munmap(c->base, c->cap);
	free((void *)c->slot);
	free(c);
}

uint64_t imagecache_index_bytes(const struct imagecache *c)
{
	return c->nsamples * sizeof(*c->slot);
}

bool imagecache_has(struct imagecache *c, uint64_t j)
{
	return atomic_load_explicit(&c->slot[j], memory_order_acquire) >= SLOT_ENTRY;
}

const struct imagecache_entry *imagecache_get(struct imagecache *c, uint64_t j)
{
	uint64_t v = atomic_load_explicit(&c->slot[j], memory_order_acquire);

	if (v < SLOT_ENTRY) {
		atomic_fetch_add_explicit(&c->misses, 1, memory_order_relaxed);
		return NULL;
	}
	atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
	return (const struct imagecache_entry *)(c->base + (v - SLOT_ENTRY));
}

/* @need bytes of the arena, or NULL: it is full for them. */
static struct imagecache_entry *arena_take(struct imagecache *c, uint64_t need)
{
	uint64_t off = atomic_load_explicit(&c->used, memory_order_relaxed);

	do {
		if (need > c->cap - off)
			return NULL;
	} while (!atomic_compare_exchange_weak_explicit(&c->used, &off, off + need,
							memory_order_relaxed, memory_order_relaxed));
	return (struct imagecache_entry *)(c->base + off);
}

/* Sample @j's image no longer fits: never tried again (nothing is evicted). */
static void refuse(struct imagecache *c, uint64_t j)
{
	atomic_store_explicit(&c->slot[j], SLOT_REFUSED, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
}

/*
 * Sample @j's word from empty to busy: this worker fills it, when the arena
 * still has room for @need bytes (checked before decoding, so that a full
 * cache costs no whole decode; another worker may take the room meanwhile).
 */
static bool claim(struct imagecache *c, uint64_t j, uint64_t need)
{
	uint64_t want = SLOT_EMPTY;

	if (!atomic_compare_exchange_strong_explicit(&c->slot[j], &want, SLOT_BUSY,
						     memory_order_relaxed, memory_order_relaxed))
		return false;
	if (need <= c->cap - atomic_load_explicit(&c->used, memory_order_relaxed))
		return true;
	refuse(c, j);
	return false;
}

int imagecache_decode_run(struct imagecache *c, const struct imageop *op, struct image_scratch *s,
			  const struct imageop_plan *plans, size_t n, uint64_t j, int64_t label,
			  const uint8_t *data, size_t len, const struct image_info *info,
			  void *const *dsts, unsigned *decodes, char *err, size_t errlen)
{
	struct imagecache_entry *e = NULL;
	const uint8_t *pix;
	int cw, ch, pw, ph, num = 1, denom = 1, r;
	bool reduce, mine;
	uint64_t need, t;

	kept_size(c->max_side, info->width, info->height, &cw, &ch);
	reduce = cw != info->width || ch != info->height;
	need = entry_bytes((uint64_t)cw, (uint64_t)ch);
	mine = claim(c, j, need);
	if (!mine && !reduce)
		/* not kept: decode only the crops' windows, once, at full scale */
		return imageop_decode_run_many(op, s, plans, n, data, len, info, dsts, decodes, err,
					       errlen);

	/* the DCT scale PIL's draft() picks for the kept size (JPEG) */
	if (reduce)
		image_draft_scale(info, cw, ch, &num, &denom);
	r = image_decode(s, data, len, info, num, denom, err, errlen);
	if (r < 0) {
		/* a bad image is never kept (images_read remembers it) */
		if (mine)
			atomic_store_explicit(&c->slot[j], SLOT_EMPTY, memory_order_relaxed);
		return r;
	}
	++*decodes;
	image_scaled_size(info, num, denom, &pw, &ph);
	if (mine) {
		e = arena_take(c, need);
		if (!e)
			refuse(c, j);
	}
	pix = s->pix;
	if (reduce) {
		uint8_t *to = e ? e->pix : NULL;

		if (!to && image_scratch_grow(&s->reduced, &s->reduced_cap, (size_t)cw * ch * 3) < 0)
			return errfmt(-ENOMEM, err, errlen, "out of memory for a %dx%d image", cw, ch);
		to = to ? to : s->reduced;
		if (imageop_resize_rgb(op, s, s->pix, pw, ph, to, cw, ch) < 0) {
			if (e) /* its bytes stay taken, unused: never tried again, or
				* every retry under memory pressure would take more */
				refuse(c, j);
			return errfmt(-ENOMEM, err, errlen, "out of memory reducing %dx%d to %dx%d",
				      pw, ph, cw, ch);
		}
		pix = to;
	} else if (e) {
		memcpy(e->pix, s->pix, (size_t)cw * ch * 3);
		pix = e->pix;
	}
	if (e) {
		e->w = (uint32_t)info->width;
		e->h = (uint32_t)info->height;
		e->cw = (uint32_t)cw;
		e->ch = (uint32_t)ch;
		e->label = label;
		atomic_fetch_add_explicit(&c->entries, 1, memory_order_relaxed);
		atomic_store_explicit(&c->slot[j], SLOT_ENTRY + (uint64_t)((uint8_t *)e - c->base),
				      memory_order_release);
	}
	/* every seed's sample from the same pixels */
	t = mono_ns();
	r = 0;
	for (size_t i = 0; r == 0 && i < n; i++)
		r = imageop_run(op, s, &plans[i], pix, cw, ch, dsts[i], err, errlen);
	s->transform_ns += mono_ns() - t;
	return r;
}

/* ---- status ---- */

void imagecache_stats(const struct imagecache *c, struct imagecache_stats *st)
{
	struct imagecache *m = (struct imagecache *)c;

	st->hits = atomic_load_explicit(&m->hits, memory_order_relaxed);
	st->misses = atomic_load_explicit(&m->misses, memory_order_relaxed);
	st->entries = atomic_load_explicit(&m->entries, memory_order_relaxed);
	st->bytes_used = atomic_load_explicit(&m->used, memory_order_relaxed);
	st->bytes = c->cap;
	st->refused = atomic_load_explicit(&m->refused, memory_order_relaxed);
}

json_t *imagecache_json(const struct imagecache *c)
{
	struct imagecache_stats st;

	imagecache_stats(c, &st);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "hits", (json_int_t)st.hits,
			 "misses", (json_int_t)st.misses,
			 "entries", (json_int_t)st.entries,
			 "bytes_used", (json_int_t)st.bytes_used,
			 "bytes", (json_int_t)st.bytes,
			 "refused", (json_int_t)st.refused,
			 "max_side", (json_int_t)c->max_side);
}
