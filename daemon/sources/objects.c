/* SPDX-License-Identifier: MIT */
/* objects - the paths of a spec that name objects in a store (s3://, https://)
 *
 * A source resolves each such path at open to a local file of the node's
 * object cache (store/objcache.h), as the pipeline's creator: a HEAD with
 * the creator's own credentials (the keys its client sent with the create,
 * kept in its spec, in memory only), then the cached copy of the object of
 * that ETag, fetched when missing. The kinds then read that file as any
 * other (pread), through an fd the source keeps open, its cache entry
 * pinned, so no eviction pulls it away. docs/storage.md.
 *
 * Objects more than the cache holds (a webdataset's shards) are read as a
 * stream instead: each read takes its object from the cache for as long as
 * it reads (fetched then when missing), and the source's fetch-ahead
 * threads follow the order its stream reads in (struct sample_order),
 * fetching and holding what the next batches need within fetch_ahead.
 * At create, such a source's index reads every object once, in order:
 * FETCH_THREADS threads fetch them ahead of it, within fetch_ahead too.
 *
 * A kind that reads a part of an object per sample (tokens) reads objects
 * more than the cache holds by range instead (source_range_urls()): each
 * read a ranged GET (If-Match on the create's ETag) straight into the
 * sample, nothing kept on disk; a worker GETs the ranges of its rows of a
 * batch at once beforehand (read-ahead, at the end).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "store/objcache.h"
#include "source-private.h"
#include "spec.h"
#include "store/store.h"

/* objects fetched at once for one open */
#define FETCH_THREADS 8

/*
 * The creator's keys: one refcounted, immutable object. spec->keys holds a
 * reference; a store made from them holds another, so a swap
 * (spec_swap_store_keys()) never pulls keys from under a request in flight:
 * the requests after it take the new ones, the old object is wiped when its
 * last request is done.
 */
struct source_keys {
	_Atomic unsigned refs;
	struct store_config cfg;
	int64_t expires;   /* Unix seconds (UTC); 0: not known */
	unsigned updates;  /* how many times they were handed afresh */
};

/* spec->keys of every spec: read and swapped under it */
static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;

/* A store made from one set of keys, and how many requests use it now. */
struct keyed_store {
	struct store *st;
	struct source_keys *keys;
	unsigned users;
	struct keyed_store *next;  /* in o->retired */
};

struct obj {
	char *url;
	struct store_object head;
	int fd;
	struct objcache_pin *pin;
	/* streamed: fd and pin are held while refs > 0 (each reader, and the
	 * fetch-ahead while @ahead), then given back to the cache */
	unsigned refs;
	bool ahead;                  /* fetched ahead, not yet passed by the reads */
	bool fetching;               /* a fetch-ahead thread fetches it now */
	uint32_t ahead_reads;        /* reads of it the fetch-ahead walked past, not yet done */
	uint64_t until_epoch, until_batch; /* ahead: the last batch that reads it */
	uint8_t ix;                  /* at create: IX_*, fetched ahead of the index */
};

/*
 * At create, a streamed source's index reads each object once, in order
 * (source_open_read(), then source_close_read()): its threads fetch them
 * ahead of it, in that order, each held (a reference) until the index's
 * read takes it over; at most fetch_ahead bytes (ahead_bound()) and
 * INDEX_HELD_MAX objects held or on their way, one at least.
 */
enum { IX_NONE, IX_QUEUED, IX_FETCHING, IX_HELD, IX_FAILED };
#define INDEX_HELD_MAX (2 * FETCH_THREADS)

struct index_ahead {
	size_t *at;                  /* the objects (o->v's) in the index's order */
	size_t n, next;              /* next: the first no thread took yet */
	uint64_t bytes;              /* held or on their way */
	unsigned objects;
	unsigned failed;             /* failed, not yet met by the index */
	bool paused;                 /* the index fetches one that failed */
	bool stop;
	pthread_t t[FETCH_THREADS];
	size_t nt;                   /* started, joined by index_ahead_end() */
	size_t running;              /* not yet ended */
};

/* An (epoch, batch) pair as one ordered number: batches per epoch < 2^40. */
#define AT(e, b) (((e) << 40) | (b))
#define AHEAD_THREADS 4
/* batches the furthest read may be past one still read: the workers build
 * several at once, and an object fetched ahead is held for them all */
#define RELEASE_LAG 4
/* reads of other streams in a row after which the fetch-ahead follows them */
#define FOREIGN_READS 256

struct source_objects {
	pthread_mutex_t lock;
	const struct spec *spec;     /* its keys: spec->keys, the current ones */
	struct keyed_store *cur;     /* the store of the current keys */
	struct keyed_store *retired; /* of older keys, still used by a request */
	/* the endpoint of its first store, set at create: fresh keys are for
	 * the same endpoint (SetStore), so it never changes after */
	char endpoint[256];
	struct obj *v;
	size_t n, cap;
	/* an index of v by URL: open addressing, entry i + 1 (0 empty), a
	 * power of two over twice n; a folder's reads look up every sample */
	size_t *slots;
	size_t nslots;

	/* streamed (source_stream_urls()): objects fetched while it runs */
	bool stream;
	const char *(*object_of)(void *arg, uint64_t idx);
	void *object_arg;
	pthread_cond_t moved;        /* the reads moved on, a fetch ended, or stop */
	size_t nthreads, running;     /* started, not yet ended */
	bool stop;
	struct sample_order order;   /* the order followed (arg: order_arg) */
	unsigned char order_arg[512];
	bool have_order;
	unsigned foreign;            /* reads of other streams since one of its own */
	uint64_t frontier;           /* AT() of the furthest batch a read began */
	uint64_t cur_epoch, cur_batch; /* the fetch-ahead's next batch to look at */
	uint32_t cur_row;
	uint64_t ahead_bytes, ahead_objects, inflight_bytes, inflight_objects;
	uint64_t waiting;            /* readers waiting for an object now */
	struct source_objects *next_stream; /* in streams */
	_Atomic uint64_t wait_ns, waits, reads_ahead;
	struct index_ahead ix;       /* at create (under lock, but t and nt) */
	/* read by range (source_range_urls()): no object in the cache */
	bool ranged;
	_Atomic uint64_t ranged_gets, ranged_bytes;
	/* a blend's parts (source_objects_parts()): their ranged reads are its */
	struct source *const *parts;
	size_t nparts;
};

/* Why this thread's last object read failed (source.h): 0, or a
 * SOURCE_READ_* of the store. */
static _Thread_local int read_why;

static bool source_ahead_take(const struct source *src, const char *url, uint64_t off, size_t len, void *buf,
			      char *err, size_t errlen, int *r, int *why);

/* Ranged reads of every source, since the start (/metrics). */
static _Atomic uint64_t all_ranged_gets, all_ranged_bytes;

static void index_ahead_start(struct source_objects *o, struct obj **objs, size_t n);
struct ahead_plan;
static void plan_note(struct ahead_plan *p, const struct source *src, const char *url, uint64_t off, size_t len);
static void index_ahead_end(struct source_objects *o);

/* Every streamed source of the daemon: a read that finds no room in the
 * cache makes them all give back what they fetched ahead, and none fetches
 * ahead while one waits. Lock order: streams_lock, then a source's lock. */
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct source_objects *streams;
static _Atomic unsigned room_waiters;

static void streams_remove(struct source_objects *o)
{
	pthread_mutex_lock(&streams_lock);
	for (struct source_objects **pp = &streams; *pp; pp = &(*pp)->next_stream)
		if (*pp == o) {
			*pp = o->next_stream;
			break;
		}
	pthread_mutex_unlock(&streams_lock);
}

bool source_is_url(const char *path)
{
	return path && (!strncmp(path, "s3://", 5) || !strncmp(path, "https://", 8) ||
			!strncmp(path, "http://", 7));
}

/* ---- the creator's keys, in its spec ---- */

/* The config's store_retry_seconds in ms, 0: the store's default. */
static atomic_uint_fast64_t store_retry_ms;

void source_set_store_retry(double seconds)
{
	atomic_store(&store_retry_ms, seconds > 0 ? (uint64_t)(seconds * 1000.0 + 0.5) : 0);
}

double source_store_retry(void)
{
	uint64_t ms = atomic_load(&store_retry_ms);

	return ms ? (double)ms / 1000.0 : SOURCE_STORE_RETRY_DEFAULT;
}

int source_set_store_endpoints(char *const *list, char *err, size_t errlen)
{
	return store_set_endpoints(list, err, errlen);
}

json_t *source_store_endpoints_json(void)
{
	char *const *list = store_endpoints();
	json_t *a;

	if (!list)
		return json_null();
	a = json_array();
	for (size_t i = 0; list[i]; i++)
		json_array_append_new(a, json_string(list[i]));
	return a;
}

int source_keys_new(struct source_keys **out, const char *access_key, const char *secret_key,
		    const char *session_token, const char *region, const char *endpoint, int64_t expires,
		    char *err, size_t errlen)
{
	struct source_keys *k = calloc(1, sizeof(*k));
	char *env[6] = { 0 };
	size_t n = 0;
	int r = 0;

	*out = NULL;
	if (!k)
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	atomic_init(&k->refs, 1);
	k->expires = expires > 0 ? expires : 0;
	store_config_init(&k->cfg);
	if (access_key && *access_key && asprintf(&env[n++], "AWS_ACCESS_KEY_ID=%s", access_key) < 0)
		r = -ENOMEM;
	if (secret_key && *secret_key && asprintf(&env[n++], "AWS_SECRET_ACCESS_KEY=%s", secret_key) < 0)
		r = -ENOMEM;
	if (session_token && *session_token && asprintf(&env[n++], "AWS_SESSION_TOKEN=%s", session_token) < 0)
		r = -ENOMEM;
	if (region && *region && asprintf(&env[n++], "AWS_REGION=%s", region) < 0)
		r = -ENOMEM;
	if (endpoint && *endpoint && asprintf(&env[n++], "AWS_ENDPOINT_URL=%s", endpoint) < 0)
		r = -ENOMEM;
	if (r == 0)
		r = store_config_from_env(&k->cfg, (const char *const *)env, err, errlen);
	else
		errfmt(r, err, errlen, "out of memory");
	if (atomic_load(&store_retry_ms))
		k->cfg.retry_seconds = (double)atomic_load(&store_retry_ms) / 1000.0;
	for (size_t i = 0; i < n; i++) {
		if (env[i]) {
			explicit_bzero(env[i], strlen(env[i]));
			free(env[i]);
		}
	}
	if (r == 0 && !!k->cfg.access_key[0] != !!k->cfg.secret_key[0])
		r = errfmt(-EINVAL, err, errlen, "store credentials: an access key id without its secret, "
			   "or a secret without its key id");
	if (r < 0) {
		source_keys_put(k);
		return r;
	}
	*out = k;
	return 0;
}

void source_keys_put(struct source_keys *k)
{
	if (!k || atomic_fetch_sub(&k->refs, 1) != 1)
		return;
	explicit_bzero(k, sizeof(*k));
	free(k);
}

struct source_keys *source_keys_take(const struct spec *spec)
{
	struct source_keys *k;

	pthread_mutex_lock(&keys_lock);
	k = spec->keys;
	if (k)
		atomic_fetch_add(&k->refs, 1);
	pthread_mutex_unlock(&keys_lock);
	return k;
}

void spec_set_store_keys(struct spec *spec, struct source_keys *k)
{
	struct source_keys *old;

	pthread_mutex_lock(&keys_lock);
	old = spec->keys;
	spec->keys = k;
	pthread_mutex_unlock(&keys_lock);
	source_keys_put(old);
}

int spec_swap_store_keys(struct spec *spec, struct source_keys *k, char *err, size_t errlen)
{
	struct source_keys *old;
	int r = 0;

	pthread_mutex_lock(&keys_lock);
	old = spec->keys;
	if (!old)
		r = errfmt(-EINVAL, err, errlen, "pipeline '%s' reads no object store (no s3:// or http(s):// "
			   "path): it has no credentials to replace", spec->name);
	else if (strcmp(old->cfg.endpoint, k->cfg.endpoint))
		r = errfmt(-EINVAL, err, errlen, "pipeline '%s' reads the store at %s, not %s: fresh "
			   "credentials are for the same endpoint", spec->name,
			   old->cfg.endpoint[0] ? old->cfg.endpoint : "(AWS)",
			   k->cfg.endpoint[0] ? k->cfg.endpoint : "(AWS)");
	else if (strcmp(old->cfg.region, k->cfg.region))
		r = errfmt(-EINVAL, err, errlen, "pipeline '%s' reads region %s, not %s: fresh credentials "
			   "are for the same region", spec->name, old->cfg.region[0] ? old->cfg.region : "us-east-1",
			   k->cfg.region[0] ? k->cfg.region : "us-east-1");
	if (r == 0) {
		k->updates = old->updates + 1;
		spec->keys = k;
	}
	pthread_mutex_unlock(&keys_lock);
	if (r < 0)
		return r;
	/* wiped now, or by the last request that still uses them */
	source_keys_put(old);
	return 0;
}

/* @t as 2026-12-06T12:00:00Z */
static void utc_time(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (!gmtime_r(&tt, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, len, "%" PRId64, t);
}

int source_keys_explain(const struct source_keys *k, const char *pipeline, int r, char *err, size_t errlen)
{
	char when[32];
	size_t n;

	/* a refusal (store.c: AccessDenied, InvalidAccessKeyId,
	 * SignatureDoesNotMatch, ExpiredToken...) by keys past their expiry */
	if (r != -EACCES || !k || !k->expires || (int64_t)time(NULL) < k->expires)
		return r;
	utc_time(k->expires, when, sizeof(when));
	n = strnlen(err, errlen);
	if (n + 1 < errlen)
		snprintf(err + n, errlen - n, ": the credentials of pipeline '%s' expired at %s (renew them: "
			 "a create sends the process's current ones; a running pipeline takes fresh ones from "
			 "`loaderctl credentials %s`, ldr_set_store() or loaderd.Client.set_store(); "
			 "docs/storage.md)", pipeline, when, pipeline);
	return r;
}

json_t *spec_store_json(const struct spec *spec)
{
	struct source_keys *k = source_keys_take(spec);
	const struct store_config *c;
	char last[8], when[32];
	json_t *j;
	size_t n;

	if (!k)
		return NULL;
	c = &k->cfg;
	n = strlen(c->access_key);
	/* at most the last 4 characters of the key id, never the secret */
	snprintf(last, sizeof(last), "%s", n > 4 ? c->access_key + n - 4 : "");
	if (k->expires)
		utc_time(k->expires, when, sizeof(when));
	j = json_pack("{s:s, s:s, s:s?, s:b, s:s?, s:b, s:I}", "endpoint", c->endpoint[0] ? c->endpoint : "(AWS)",
		      "region", c->region[0] ? c->region : "us-east-1",
		      "access_key_id", n ? (n > 4 ? last : "") : NULL, "session_token", c->session_token[0] != 0,
		      "expires", k->expires ? when : NULL,
		      "expired", k->expires && (int64_t)time(NULL) >= k->expires,
		      "credentials_updates", (json_int_t)k->updates);
	source_keys_put(k);
	return j;
}

/* ---- the objects of one source ---- */

int source_objects_new(struct source *src, const struct spec *spec)
{
	struct source_objects *o = calloc(1, sizeof(*o));

	if (!o)
		return -ENOMEM;
	pthread_mutex_init(&o->lock, NULL);
	o->spec = spec;
	pthread_cond_init(&o->moved, NULL);
	src->objs = o;
	return 0;
}

static void keyed_store_free(struct keyed_store *ks)
{
	if (!ks)
		return;
	store_free(ks->st);
	source_keys_put(ks->keys);
	free(ks);
}

static void objects_destroy(struct source_objects *o)
{
	pthread_cond_destroy(&o->moved);
	for (size_t i = 0; i < o->n; i++) {
		if (o->v[i].fd >= 0)
			close(o->v[i].fd);
		objcache_unpin(o->v[i].pin);
		free(o->v[i].url);
	}
	free(o->v);
	free(o->slots);
	keyed_store_free(o->cur);
	while (o->retired) {
		struct keyed_store *ks = o->retired;

		o->retired = ks->next;
		keyed_store_free(ks);
	}
	pthread_mutex_destroy(&o->lock);
	free(o);
}

void source_objects_free(struct source *src)
{
	struct source_objects *o = src->objs;
	bool last;

	if (!o)
		return;
	src->objs = NULL;
	index_ahead_end(o); /* ended by its create already: nothing to wait for */
	if (o->stream)
		streams_remove(o);
	/* its fetch-ahead threads stop; one in a fetch frees it when the fetch
	 * ends (the caller, maybe the loop, never waits on the network) */
	pthread_mutex_lock(&o->lock);
	o->stop = true;
	pthread_cond_broadcast(&o->moved);
	last = o->running == 0;
	pthread_mutex_unlock(&o->lock);
	if (last)
		objects_destroy(o);
}

/*
 * The store of the spec's current keys, for one request (or a batch of
 * them): objects_put() when done. Made at its first use and again after the
 * keys were handed afresh (spec_swap_store_keys()); the store of the old
 * keys is retired, freed (and its keys wiped) once its last user is done.
 * Under o->lock.
 */
static int objects_get(struct source_objects *o, struct keyed_store **out, char *err, size_t errlen)
{
	struct source_keys *k = source_keys_take(o->spec);
	struct store_config def;
	struct keyed_store *ks;
	int r;

	*out = NULL;
	if (o->cur && o->cur->keys == k) {
		source_keys_put(k);
		o->cur->users++;
		*out = o->cur;
		return 0;
	}
	if (!(ks = calloc(1, sizeof(*ks)))) {
		source_keys_put(k);
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	}
	ks->keys = k;
	if (!k)
		store_config_init(&def);
	if ((r = store_new(&ks->st, k ? &k->cfg : &def, err, errlen)) < 0) {
		keyed_store_free(ks);
		return r;
	}
	if (o->cur && o->cur->users) {
		o->cur->next = o->retired;
		o->retired = o->cur;
	} else {
		keyed_store_free(o->cur);
	}
	o->cur = ks;
	ks->users = 1;
	if (!o->endpoint[0])
		snprintf(o->endpoint, sizeof(o->endpoint), "%s", store_endpoint(ks->st));
	*out = ks;
	return 0;
}

void source_objects_rekeyed(struct source *src)
{
	struct source_objects *o = src ? src->objs : NULL;
	struct keyed_store *ks;

	/* on the loop, which never waits: a source busy now (a request under
	 * its lock) retires the store at its next objects_get() instead */
	if (!o || pthread_mutex_trylock(&o->lock) != 0)
		return;
	ks = o->cur;
	o->cur = NULL;
	if (ks && ks->users) {
		ks->next = o->retired;
		o->retired = ks;
	} else {
		keyed_store_free(ks);
	}
	pthread_mutex_unlock(&o->lock);
}

/* objects_put() under o->lock: a retired store's last user frees it (its
 * connections closed, its keys wiped). */
static void objects_put_locked(struct source_objects *o, struct keyed_store *ks)
{
	struct keyed_store **p;

	if (!ks)
		return;
	ks->users--;
	for (p = &o->retired; ks->users == 0 && *p; p = &(*p)->next) {
		if (*p == ks) {
			*p = ks->next;
			keyed_store_free(ks);
			break;
		}
	}
}

static void objects_put(struct source_objects *o, struct keyed_store *ks)
{
	if (!ks)
		return;
	pthread_mutex_lock(&o->lock);
	objects_put_locked(o, ks);
	pthread_mutex_unlock(&o->lock);
}

/* @r of a request by @ks's keys, the expiry said where it explains it. */
static int objects_error(const struct source_objects *o, const struct keyed_store *ks, int r, char *err,
			 size_t errlen)
{
	return source_keys_explain(ks ? ks->keys : NULL, o->spec->name, r, err, errlen);
}

static uint64_t url_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 0x100000001b3ull;
	return mix64(h);
}

/* The slot of @url in o->slots: its entry's, or the empty one it would take. */
static size_t slot_of(const struct source_objects *o, const char *url)
{
	size_t s = (size_t)url_hash(url) & (o->nslots - 1);

	while (o->slots[s] && strcmp(o->v[o->slots[s] - 1].url, url))
		s = (s + 1) & (o->nslots - 1);
	return s;
}

/* Room in the index for one more entry: 0 or -ENOMEM. */
static int index_grow(struct source_objects *o)
{
	size_t n = o->nslots ? o->nslots : 64, *old = o->slots, nold = o->nslots;

	if (o->nslots && (o->n + 1) * 2 <= o->nslots)
		return 0;
	while ((o->n + 1) * 2 > n)
		n *= 2;
	if (!(o->slots = calloc(n, sizeof(*o->slots)))) {
		o->slots = old;
		return -ENOMEM;
	}
	o->nslots = n;
	for (size_t i = 0; i < nold; i++)
		if (old[i])
			o->slots[slot_of(o, o->v[old[i] - 1].url)] = old[i];
	free(old);
	return 0;
}

/* The entry of @url, added (fd -1) when @add. Under o->lock. */
static struct obj *objects_find(struct source_objects *o, const char *url, bool add)
{
	size_t s;

	if (o->nslots && o->slots[s = slot_of(o, url)])
		return &o->v[o->slots[s] - 1];
	if (!add || index_grow(o) < 0)
		return NULL;
	if (o->n == o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 16;
		struct obj *nv = realloc(o->v, cap * sizeof(*nv));

		if (!nv)
			return NULL;
		o->v = nv;
		o->cap = cap;
	}
	o->v[o->n] = (struct obj){ .url = strdup(url), .fd = -1 };
	if (!o->v[o->n].url)
		return NULL;
	o->slots[slot_of(o, url)] = o->n + 1;
	return &o->v[o->n++];
}

/* ---- resolving many at once ---- */

struct batch {
	struct source_objects *o;
	struct keyed_store *ks;
	struct obj **objs;
	size_t n;
	bool fetch;                  /* HEADs first, then the objects */
	_Atomic size_t next;
	_Atomic int failed;
	pthread_mutex_t lock;
	size_t failed_at;            /* the first object in order that failed */
	char err[1024];
};

static void *batch_thread(void *arg)
{
	struct batch *b = arg;
	char err[1024];

	for (;;) {
		size_t i = atomic_fetch_add(&b->next, 1);
		struct obj *ob;
		int r;

		if (i >= b->n || atomic_load(&b->failed))
			return NULL;
		ob = b->objs[i];
		if (!b->fetch)
			r = store_head(b->ks->st, ob->url, &ob->head, err, sizeof(err));
		else
			r = objcache_open(b->ks->st, ob->url, &ob->head, &ob->fd, &ob->pin, err, sizeof(err));
		if (r < 0) {
			/* the objects are taken in order: every one before @i was
			 * tried, so the error is the first failing one's, whichever
			 * thread failed first */
			pthread_mutex_lock(&b->lock);
			if (!atomic_load(&b->failed) || i < b->failed_at) {
				snprintf(b->err, sizeof(b->err), "%s", err);
				b->failed_at = i;
				atomic_store(&b->failed, r);
			}
			pthread_mutex_unlock(&b->lock);
			return NULL;
		}
	}
}

/* Run @b's step over its objects, FETCH_THREADS at a time. */
static int batch_run(struct batch *b, char *err, size_t errlen)
{
	pthread_t t[FETCH_THREADS];
	size_t nt = b->n < FETCH_THREADS ? b->n : FETCH_THREADS, started = 0;

	atomic_store(&b->next, 0);
	for (; started < nt; started++)
		if (pthread_create(&t[started], NULL, batch_thread, b) != 0)
			break;
	if (started == 0)
		batch_thread(b);
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	if (atomic_load(&b->failed))
		return errfmt(atomic_load(&b->failed), err, errlen, "%s", b->err);
	return 0;
}

/* How fetch_urls() takes objects more than the cache holds. */
enum { FIT_OR_STREAM, FIT_OR_RANGE, FIT_OR_STREAM_NO_INDEX };

static int fetch_urls(struct source *src, char *const *paths, size_t n, int mode, char *err, size_t errlen)
{
	struct source_objects *o = src->objs;
	struct batch b = { .o = o, .lock = PTHREAD_MUTEX_INITIALIZER };
	uint64_t total = 0, max;
	size_t *at;
	size_t urls = 0;
	int r = 0;

	for (size_t i = 0; i < n; i++)
		urls += source_is_url(paths[i]);
	if (!o || !urls)
		return 0; /* local files only: no store made (nor libcurl started) */
	b.objs = calloc(n ? n : 1, sizeof(*b.objs));
	at = calloc(n ? n : 1, sizeof(*at));
	if (!b.objs || !at) {
		free(b.objs);
		free(at);
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	}
	pthread_mutex_lock(&o->lock);
	r = objects_get(o, &b.ks, err, errlen);
	/* by index: o->v may move while entries are added */
	for (size_t i = 0; r == 0 && i < n; i++) {
		struct obj *ob;
		bool dup = false;

		if (!source_is_url(paths[i]))
			continue;
		for (size_t j = 0; j < b.n && !dup; j++)
			dup = !strcmp(o->v[at[j]].url, paths[i]);
		ob = dup ? NULL : objects_find(o, paths[i], true);
		if (!dup && !ob)
			r = errfmt(-ENOMEM, err, errlen, "out of memory");
		else if (ob && ob->fd < 0)
			at[b.n++] = (size_t)(ob - o->v);
	}
	for (size_t j = 0; j < b.n; j++)
		b.objs[j] = &o->v[at[j]];
	free(at);
	pthread_mutex_unlock(&o->lock);
	/* the HEADs as the creator: a refused one fails the create here */
	if (r == 0 && b.n)
		r = batch_run(&b, err, errlen);
	for (size_t i = 0; r == 0 && i < b.n; i++)
		total += b.objs[i]->head.size;
	max = objcache_max_bytes();
	if (r == 0 && b.n && max && total > max && mode == FIT_OR_RANGE) {
		/* read by range (source_read_range()): nothing fetched now */
		o->ranged = true;
		b.n = 0;
	}
	if (r == 0 && b.n && max && total > max && (mode == FIT_OR_STREAM || mode == FIT_OR_STREAM_NO_INDEX)) {
		/* read as a stream: fetched while it runs (source_open_read()),
		 * and now ahead of the index (a kind that has one to build) */
		o->stream = true;
		if (mode == FIT_OR_STREAM)
			index_ahead_start(o, b.objs, b.n);
		b.n = 0;
	}
	b.fetch = true;
	atomic_store(&b.failed, 0);
	if (r == 0 && b.n)
		r = batch_run(&b, err, errlen);
	if (r < 0)
		objects_error(o, b.ks, r, err, errlen);
	objects_put(o, b.ks);
	free(b.objs);
	pthread_mutex_destroy(&b.lock);
	return r;
}

int source_range_urls(struct source *src, char *const *paths, size_t n, char *err, size_t errlen)
{
	return fetch_urls(src, paths, n, FIT_OR_RANGE, err, errlen);
}

/*
 * Objects that fit cache_bytes but not beside what open pipelines hold
 * (a blend's other parts, fetched first): read by range all the same, but
 * those @whole() names. What was fetched of the others is given back.
 */
static int range_instead(struct source_objects *o, char *const *paths, size_t n,
			 bool (*whole)(void *arg, const char *url), void *arg)
{
	pthread_mutex_lock(&o->lock);
	o->ranged = true;
	for (size_t i = 0; i < n; i++) {
		struct obj *ob = source_is_url(paths[i]) ? objects_find(o, paths[i], false) : NULL;

		if (ob && ob->fd >= 0 && !whole(arg, paths[i])) {
			close(ob->fd);
			objcache_unpin(ob->pin);
			ob->fd = -1;
			ob->pin = NULL;
		}
	}
	pthread_mutex_unlock(&o->lock);
	return 0;
}

/*
 * Objects of @paths more than cache_bytes in all read by range, but those
 * @whole() names fetched whole into the cache all the same (a megatron
 * .idx, needed whole for its index): source-private.h.
 */
int source_range_urls_but(struct source *src, char *const *paths, size_t n,
			  bool (*whole)(void *arg, const char *url), void *arg, const char *why,
			  char *err, size_t errlen)
{
	struct source_objects *o = src->objs;
	struct batch b = { .o = o, .fetch = true, .lock = PTHREAD_MUTEX_INITIALIZER };
	uint64_t total = 0, max = objcache_max_bytes();
	int r = fetch_urls(src, paths, n, FIT_OR_RANGE, err, errlen);

	if (r == -ENOSPC && o)
		r = range_instead(o, paths, n, whole, arg);
	if (r < 0 || !o || !o->ranged)
		return r; /* local files, or every object fetched whole */
	b.objs = calloc(n ? n : 1, sizeof(*b.objs));
	if (!b.objs)
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	pthread_mutex_lock(&o->lock);
	r = objects_get(o, &b.ks, err, errlen);
	for (size_t i = 0; r == 0 && i < n; i++) {
		struct obj *ob = source_is_url(paths[i]) && whole(arg, paths[i])
			? objects_find(o, paths[i], false) : NULL;
		bool dup = false;

		for (size_t j = 0; ob && j < b.n && !dup; j++)
			dup = b.objs[j] == ob;
		if (ob && !dup && ob->fd < 0) {
			if (ob->head.size > max)
				r = errfmt(-EFBIG, err, errlen, "%s: %" PRIu64 " bytes, more than the object "
					   "cache's cache_bytes %" PRIu64 ": %s", ob->url, ob->head.size, max, why);
			total += ob->head.size;
			b.objs[b.n++] = ob;
		}
	}
	pthread_mutex_unlock(&o->lock);
	if (r == 0 && total > max)
		r = errfmt(-EFBIG, err, errlen, "%s ...: %zu objects of %" PRIu64 " bytes in all, more than the "
			   "object cache's cache_bytes %" PRIu64 ": %s", b.objs[0]->url, b.n, total, max, why);
	if (r == 0 && b.n)
		r = batch_run(&b, err, errlen);
	if (r < 0 && b.ks)
		objects_error(o, b.ks, r, err, errlen);
	objects_put(o, b.ks);
	free(b.objs);
	pthread_mutex_destroy(&b.lock);
	return r;
}

int source_object_id(const struct source *src, const char *url, char *buf, size_t len)
{
	struct source_objects *o = src->objs;
	struct obj *ob;
	int r = -ENOENT;

	if (!o)
		return r;
	pthread_mutex_lock(&o->lock);
	ob = objects_find(o, url, false);
	if (ob && ob->head.etag[0]) {
		snprintf(buf, len, "%s %s %s %" PRIu64, o->endpoint, url, ob->head.etag, ob->head.size);
		r = 0;
	}
	pthread_mutex_unlock(&o->lock);
	return r;
}

static bool source_reads_by_range(const struct source *src)
{
	return src->objs && src->objs->ranged;
}

bool source_ranged(const struct source *src, const char *path)
{
	return src && src->objs && src->objs->ranged && source_is_url(path);
}

int source_object_size(const struct source *src, const char *url, uint64_t *size, char *err, size_t errlen)
{
	struct source_objects *o = src->objs;
	struct obj *ob;

	pthread_mutex_lock(&o->lock);
	ob = objects_find(o, url, false);
	if (ob)
		*size = ob->head.size;
	pthread_mutex_unlock(&o->lock);
	return ob ? 0 : errfmt(-ENOENT, err, errlen, "%s: not an object of this source", url);
}

int source_read_range(const struct source *src, const char *url, uint64_t off, size_t len, void *buf, char *err,
		      size_t errlen)
{
	struct source_objects *o = src->objs;
	struct keyed_store *ks = NULL;
	char etag[sizeof(((struct store_object *)0)->etag)];
	struct obj *ob;
	int r, why;

	read_why = 0;
	/* a worker's read-ahead (source_ahead_take()) noted it, or has its bytes */
	if (source_ahead_take(src, url, off, len, buf, err, errlen, &r, &why)) {
		read_why = why;
		return r;
	}
	pthread_mutex_lock(&o->lock);
	ob = objects_find(o, url, false);
	if (!ob)
		r = errfmt(-ENOENT, err, errlen, "%s: not an object of this source", url);
	else if ((r = objects_get(o, &ks, err, errlen)) == 0)
		memcpy(etag, ob->head.etag, sizeof(etag));
	pthread_mutex_unlock(&o->lock);
	if (r < 0)
		return r;
	store_transport_clear();
	/* If-Match the create's ETag: a changed object is -ESTALE, naming it */
	r = store_get_range(ks->st, url, etag, off, len, buf, err, errlen);
	if (r < 0) {
		objects_error(o, ks, r, err, errlen);
		/* neither the data's fault: the batch waits (source.h) */
		read_why = r == -EACCES ? SOURCE_READ_KEYS : store_transport_failed() ? SOURCE_READ_STORE : 0;
	} else {
		atomic_fetch_add(&o->ranged_gets, 1);
		atomic_fetch_add(&o->ranged_bytes, len);
		atomic_fetch_add(&all_ranged_gets, 1);
		atomic_fetch_add(&all_ranged_bytes, len);
	}
	objects_put(o, ks);
	return r;
}

void source_objects_parts(struct source *src, struct source *const *parts, size_t n)
{
	if (src->objs) {
		src->objs->parts = parts;
		src->objs->nparts = n;
	}
}

/* The sum over a blend's parts read by range, NULL when none is. */
static json_t *parts_ranged_json(const struct source_objects *o)
{
	json_int_t gets = 0, bytes = 0;
	bool any = false;

	for (size_t i = 0; i < o->nparts; i++) {
		const struct source_objects *p = o->parts[i] ? o->parts[i]->objs : NULL;

		if (p && p->ranged) {
			any = true;
			gets += (json_int_t)atomic_load(&p->ranged_gets);
			bytes += (json_int_t)atomic_load(&p->ranged_bytes);
		}
	}
	return any ? json_pack("{s:b, s:I, s:I}", "ranged", 1, "ranged_gets", gets, "ranged_bytes", bytes)
		   : NULL;
}

json_t *source_ranged_json(const struct source *src)
{
	struct source_objects *o = src ? src->objs : NULL;

	if (o && !o->ranged && o->nparts)
		return parts_ranged_json(o);
	if (!o || !o->ranged)
		return NULL;
	return json_pack("{s:b, s:I, s:I}", "ranged", 1, "ranged_gets", (json_int_t)atomic_load(&o->ranged_gets),
			 "ranged_bytes", (json_int_t)atomic_load(&o->ranged_bytes));
}

static int stream_urls(struct source *src, char *const *paths, size_t n, int mode,
		       const char *(*object_of)(void *arg, uint64_t idx), void *arg, char *err, size_t errlen)
{
	int r = fetch_urls(src, paths, n, mode, err, errlen);

	if (r == 0 && src->objs && src->objs->stream) {
		src->objs->object_of = object_of;
		src->objs->object_arg = arg;
		pthread_mutex_lock(&streams_lock);
		src->objs->next_stream = streams;
		streams = src->objs;
		pthread_mutex_unlock(&streams_lock);
	}
	return r;
}

int source_stream_urls(struct source *src, char *const *paths, size_t n, const char *(*object_of)(void *arg,
		       uint64_t idx), void *arg, char *err, size_t errlen)
{
	return stream_urls(src, paths, n, FIT_OR_STREAM, object_of, arg, err, errlen);
}

int source_stream_objects(struct source *src, char *const *paths, size_t n, const char *(*object_of)(void *arg,
			  uint64_t idx), void *arg, char *err, size_t errlen)
{
	return stream_urls(src, paths, n, FIT_OR_STREAM_NO_INDEX, object_of, arg, err, errlen);
}

/*
 * A streamed source whose reads want a part of an object each (a shuffled
 * webdataset's samples: docs/storage.md, "Webdataset samples by range"): once its index
 * is built, read by range instead (source_read_range()), no fetch-ahead,
 * nothing held (source-private.h).
 */
void source_stream_by_range(struct source *src)
{
	struct source_objects *o = src ? src->objs : NULL;

	if (!o || !o->stream)
		return;
	streams_remove(o);
	pthread_mutex_lock(&o->lock);
	o->stream = false;
	o->ranged = true;
	pthread_mutex_unlock(&o->lock);
}

bool source_streams(const struct source *src)
{
	return src && src->objs && src->objs->stream;
}

int source_list_url(const struct source *src, const char *url, int (*fn)(void *arg, const char *key,
		    uint64_t size, const char *etag), void *arg, char *err, size_t errlen)
{
	struct source_objects *o = src->objs;
	struct keyed_store *ks;
	int r;

	if (!o)
		return errfmt(-EINVAL, err, errlen, "%s: objects in a store are not read here", url);
	pthread_mutex_lock(&o->lock);
	r = objects_get(o, &ks, err, errlen);
	pthread_mutex_unlock(&o->lock);
	if (r < 0)
		return r;
	r = store_list(ks->st, url, fn, arg, err, errlen);
	if (r < 0)
		objects_error(o, ks, r, err, errlen);
	objects_put(o, ks);
	return r;
}

int source_open_path(const struct source *src, const char *path, struct stat *st, char *err, size_t errlen)
{
	struct source_objects *o = src ? src->objs : NULL;
	struct keyed_store *ks = NULL;
	struct obj *ob;
	int fd, r = 0;

	if (!source_is_url(path))
		return ds_open(&src->who, path, st, err, errlen);
	if (!o)
		return errfmt(-EINVAL, err, errlen, "%s: objects in a store are not read here", path);
	pthread_mutex_lock(&o->lock);
	ob = objects_find(o, path, true);
	if (!ob)
		r = errfmt(-ENOMEM, err, errlen, "out of memory");
	else if (ob->fd < 0 && (r = objects_get(o, &ks, err, errlen)) == 0 &&
		 (r = store_head(ks->st, path, &ob->head, err, errlen)) == 0)
		/* one at a time: a kind that did not fetch its objects ahead */
		r = objcache_open(ks->st, path, &ob->head, &ob->fd, &ob->pin, err, errlen);
	if (ks && r < 0)
		objects_error(o, ks, r, err, errlen);
	objects_put_locked(o, ks); /* a store retired meanwhile is freed, not kept */
	fd = r == 0 ? dup(ob->fd) : -1;
	pthread_mutex_unlock(&o->lock);
	if (r < 0)
		return r;
	if (fd < 0 || (st && fstat(fd, st) < 0)) {
		r = errfmt(-errno, err, errlen, "%s: its cached copy: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return r;
	}
	return fd;
}

/* ---- read as a stream ---- */

static _Atomic uint64_t fetch_ahead_bytes = SOURCE_FETCH_AHEAD_DEFAULT;


/* The bound of what one source holds fetched ahead: fetch_ahead, at most
 * half the cache (the rest is for the reads and the other pipelines). */
static uint64_t ahead_bound(void)
{
	uint64_t b = atomic_load(&fetch_ahead_bytes), max = objcache_max_bytes();

	return max && b > max / 2 ? max / 2 : b;
}

/* Take a reference to @ob's cached copy, installed with @fd and @pin unless
 * one is there already. Under o->lock. */
static void obj_install(struct obj *ob, int fd, struct objcache_pin *pin)
{
	if (ob->fd >= 0) {
		close(fd);
		objcache_unpin(pin);
	} else {
		ob->fd = fd;
		ob->pin = pin;
	}
	ob->refs++;
}

/* Drop a reference: the last gives the copy back to the cache (evictable).
 * Under o->lock. */
static void obj_drop(struct obj *ob)
{
	if (--ob->refs == 0) {
		close(ob->fd);
		objcache_unpin(ob->pin);
		ob->fd = -1;
		ob->pin = NULL;
	}
}

/* Give back the fetch-ahead's hold of @ob. Under o->lock. */
static void unhold(struct source_objects *o, struct obj *ob)
{
	ob->ahead = false;
	ob->ahead_reads = 0;
	o->ahead_bytes -= ob->head.size;
	o->ahead_objects--;
	obj_drop(ob);
	pthread_cond_broadcast(&o->moved); /* room under fetch_ahead */
}

/* Every hold of the fetch-ahead (a read's own stays): a read waits for
 * room in the cache, which comes before reading ahead. Under o->lock. */
static void unhold_all(struct source_objects *o)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->v[i].ahead)
			unhold(o, &o->v[i]);
}

/* Objects fetched ahead whose last batch the reads began: no longer held
 * for them (a read under way holds its own reference). Under o->lock. */
static void release_passed(struct source_objects *o)
{
	for (size_t i = 0; i < o->n; i++) {
		struct obj *ob = &o->v[i];

		if (ob->ahead && AT(ob->until_epoch, ob->until_batch) + RELEASE_LAG < o->frontier)
			unhold(o, ob);
	}
}

/*
 * The next object the reads will need that is neither held nor on its way,
 * walking the order from the fetch-ahead's place; every held one met on the
 * way is kept until that batch. NULL when the bound is reached (or the
 * walk is an epoch past the reads'). Under o->lock.
 *
 * The walk looks only at batches after the frontier, which no read has
 * begun: each row it counts (ahead_reads) is read after it was counted
 * (a read notes its batch, source_note_read(), before it opens), so every
 * hold ends at the read of its last counted row. A row of a batch already
 * begun may have been read: a hold counted for it would never end (only
 * release_passed(), RELEASE_LAG batches on, and never after the last
 * batch), pinning its object and blocking the fetch-ahead's bound; and an
 * object fetched for it could be one no read needs any more. So the
 * fetch-ahead never fetches for a batch a read has begun, nor anything
 * once the last batch has begun: what it fetches, a read needs later.
 */
static struct obj *next_wanted(struct source_objects *o)
{
	uint64_t bound = ahead_bound(), fe = o->frontier >> 40;

	if (AT(o->cur_epoch, o->cur_batch) <= o->frontier) {
		o->cur_epoch = fe;
		o->cur_batch = (o->frontier & ((1ull << 40) - 1)) + 1;
		o->cur_row = 0;
		if (o->cur_batch >= o->order.batches) {
			o->cur_batch = 0;
			o->cur_epoch++;
		}
	}
	while (o->cur_epoch <= fe + 1 && o->order.batches && (!o->order.epochs || o->cur_epoch < o->order.epochs)) {
		uint32_t rows = o->order.rows(o->order_arg, o->cur_epoch, o->cur_batch);
		const char *url;
		struct obj *ob;

		if (o->cur_row >= rows) {
			o->cur_row = 0;
			if (++o->cur_batch >= o->order.batches) {
				o->cur_batch = 0;
				o->cur_epoch++;
			}
			continue;
		}
		url = o->object_of(o->object_arg, o->order.sample(o->order_arg, o->cur_epoch, o->cur_batch,
								  o->cur_row));
		ob = url ? objects_find(o, url, false) : NULL;
		if (!ob) {
			o->cur_row++;
			continue;
		}
		if (!ob->ahead && !ob->fetching) {
			if (o->ahead_objects + o->inflight_objects > 0 &&
			    o->ahead_bytes + o->inflight_bytes + ob->head.size > bound)
				return NULL;
			if (ob->refs > 0) {
				/* a read holds it: held for the batches ahead too */
				ob->refs++;
				ob->ahead = true;
				o->ahead_bytes += ob->head.size;
				o->ahead_objects++;
			}
		}
		ob->until_epoch = o->cur_epoch;
		ob->until_batch = o->cur_batch;
		ob->ahead_reads++;
		o->cur_row++;
		if (!ob->ahead && !ob->fetching)
			return ob;
	}
	return NULL;
}

/* objcache_open() of object @at through the store of the spec's current
 * keys (objects_get()): a refusal says the keys' expiry where known. */
static int objects_open(struct source_objects *o, size_t at, int *fd, struct objcache_pin **pin, char *err,
			size_t errlen)
{
	struct keyed_store *ks;
	const char *url;
	struct store_object head;
	int r;

	pthread_mutex_lock(&o->lock);
	r = objects_get(o, &ks, err, errlen);
	url = o->v[at].url;     /* o->v moves only at create, never while streamed */
	head = o->v[at].head;
	pthread_mutex_unlock(&o->lock);
	if (r < 0)
		return r;
	store_transport_clear();
	r = objcache_open(ks->st, url, &head, fd, pin, err, errlen);
	if (r < 0)
		objects_error(o, ks, r, err, errlen);
	objects_put(o, ks);
	return r;
}

/* objcache_open() of object @at for the fetch-ahead: while what is pinned
 * leaves no room, it waits for room (a read's pin ends soon), unless a
 * read waits for room too or the source is going. A failure is only the
 * fetch-ahead's: the read that needs the object meets it and reports it
 * (on_error). */
static int ahead_open(struct source_objects *o, size_t at, int *fd, struct objcache_pin **pin, char *err,
		      size_t errlen)
{
	for (;;) {
		int r = objects_open(o, at, fd, pin, err, errlen);
		struct timespec now;
		bool stop;

		pthread_mutex_lock(&o->lock);
		stop = o->stop;
		pthread_mutex_unlock(&o->lock);
		if (r != -ENOSPC || stop || atomic_load(&room_waiters))
			return r;
		clock_gettime(CLOCK_REALTIME, &now);
		objcache_wait_room(o->v[at].head.size, ((uint64_t)now.tv_sec + 1) * 1000000000ull +
				   (uint64_t)now.tv_nsec);
	}
}

/* One of a streamed source's fetch-ahead threads. */
static void *ahead_thread(void *arg)
{
	struct source_objects *o = arg;
	char err[1024];
	bool last;

	pthread_mutex_lock(&o->lock);
	while (!o->stop) {
		struct obj *ob;
		struct objcache_pin *pin = NULL;
		size_t at;
		int fd = -1, r;

		release_passed(o);
		ob = o->have_order && !atomic_load(&room_waiters) ? next_wanted(o) : NULL;
		if (!ob) {
			pthread_cond_wait(&o->moved, &o->lock);
			continue;
		}
		at = (size_t)(ob - o->v);
		ob->fetching = true;
		o->inflight_bytes += ob->head.size;
		o->inflight_objects++;
		pthread_mutex_unlock(&o->lock);
		r = ahead_open(o, at, &fd, &pin, err, sizeof(err));
		pthread_mutex_lock(&o->lock);
		ob = &o->v[at];
		ob->fetching = false;
		o->inflight_bytes -= ob->head.size;
		o->inflight_objects--;
		if (r == 0 && atomic_load(&room_waiters)) {
			/* a read waits for room: fetched, but not held */
			obj_install(ob, fd, pin);
			obj_drop(ob);
			ob->ahead_reads = 0;
		} else if (r == 0) {
			obj_install(ob, fd, pin);
			ob->ahead = true;
			o->ahead_bytes += ob->head.size;
			o->ahead_objects++;
		} else {
			ob->ahead_reads = 0;
		}
		pthread_cond_broadcast(&o->moved);
	}
	last = --o->running == 0;
	pthread_mutex_unlock(&o->lock);
	if (last)
		objects_destroy(o);
	return NULL;
}

/* A detached fetch-ahead thread (it may outlive the source: ahead_thread()). */
static int start_thread(struct source_objects *o)
{
	pthread_attr_t attr;
	pthread_t t;
	int r;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	r = pthread_create(&t, &attr, ahead_thread, o);
	pthread_attr_destroy(&attr);
	return r;
}

/* The batch the calling worker reads for (source_note_read()), UINT64_MAX
 * unknown: its reads give back the holds of the fetch-ahead they end. */
static _Thread_local uint64_t reading_at = UINT64_MAX;

void source_note_read(const struct source *src, const struct sample_ctx *ctx)
{
	struct source_objects *o = src->objs;
	const struct sample_order *ord = ctx->order;
	uint64_t at;

	reading_at = UINT64_MAX;
	if (!o || !o->stream || !ord || ord->arg_size > sizeof(o->order_arg))
		return;
	at = AT(ctx->epoch, ctx->batch);
	pthread_mutex_lock(&o->lock);
	if (o->have_order && (memcmp(o->order_arg, ord->arg, ord->arg_size) || o->order.batches != ord->batches ||
			      o->order.epochs != ord->epochs)) {
		/* another stream's read: the fetch-ahead follows one stream, and
		 * another only once the one it follows has stopped reading */
		if (++o->foreign < FOREIGN_READS) {
			pthread_mutex_unlock(&o->lock);
			return;
		}
		o->have_order = false;
		unhold_all(o); /* held for the other order's batches */
	}
	o->foreign = 0;
	reading_at = at;
	if (!o->have_order) {
		/* the first read, or the reads of another stream (a resume) */
		o->order = *ord;
		memcpy(o->order_arg, ord->arg, ord->arg_size);
		o->have_order = true;
		o->frontier = at;
		o->cur_epoch = ctx->epoch;
		o->cur_batch = ctx->batch;
		o->cur_row = 0;
		while (o->nthreads < AHEAD_THREADS && !start_thread(o))
			o->nthreads++, o->running++;
		pthread_cond_broadcast(&o->moved);
	} else if (at > o->frontier) {
		o->frontier = at;
		pthread_cond_broadcast(&o->moved);
	}
	pthread_mutex_unlock(&o->lock);
}

/* ---- fetched ahead of the create's index ---- */

/* One of the threads that fetch a streamed source's objects ahead of its
 * index at create (struct index_ahead). */
static void *index_thread(void *arg)
{
	struct source_objects *o = arg;
	struct index_ahead *ix = &o->ix;
	char err[1024];

	pthread_mutex_lock(&o->lock);
	for (;;) {
		struct objcache_pin *pin = NULL;
		uint64_t size;
		size_t at;
		int fd = -1, r;

		while (ix->next < ix->n && o->v[ix->at[ix->next]].ix != IX_QUEUED)
			ix->next++; /* taken by the index itself */
		if (ix->stop || ix->next >= ix->n)
			break;
		at = ix->at[ix->next];
		size = o->v[at].head.size;
		/* a read of another pipeline that waits for room comes first */
		if (ix->failed || ix->paused || atomic_load(&room_waiters) ||
		    (ix->objects && (ix->objects >= INDEX_HELD_MAX || ix->bytes + size > ahead_bound()))) {
			pthread_cond_wait(&o->moved, &o->lock);
			continue;
		}
		ix->next++;
		o->v[at].ix = IX_FETCHING;
		ix->bytes += size;
		ix->objects++;
		pthread_mutex_unlock(&o->lock);
		r = objects_open(o, at, &fd, &pin, err, sizeof(err));
		pthread_mutex_lock(&o->lock);
		if (r == 0) {
			obj_install(&o->v[at], fd, pin);
			o->v[at].ix = IX_HELD;
		} else {
			/* the index fetches it itself and meets the error (or
			 * waits for room) as without this; nothing more is
			 * fetched ahead until it did */
			o->v[at].ix = IX_FAILED;
			ix->failed++;
			ix->bytes -= size;
			ix->objects--;
		}
		pthread_cond_broadcast(&o->moved);
	}
	ix->running--;
	pthread_cond_broadcast(&o->moved);
	pthread_mutex_unlock(&o->lock);
	return NULL;
}

/* @objs (o->v's, unique) fetched ahead of the index, in that order. Without
 * memory or a thread, the index fetches each itself. */
static void index_ahead_start(struct source_objects *o, struct obj **objs, size_t n)
{
	struct index_ahead *ix = &o->ix;
	size_t nt = n < FETCH_THREADS ? n : FETCH_THREADS;

	ix->at = malloc((n ? n : 1) * sizeof(*ix->at));
	if (!ix->at)
		return;
	pthread_mutex_lock(&o->lock);
	for (size_t i = 0; i < n; i++) {
		ix->at[i] = (size_t)(objs[i] - o->v);
		objs[i]->ix = IX_QUEUED;
	}
	ix->n = n;
	ix->running = nt;
	pthread_mutex_unlock(&o->lock);
	for (ix->nt = 0; ix->nt < nt; ix->nt++)
		if (pthread_create(&ix->t[ix->nt], NULL, index_thread, o) != 0)
			break;
	pthread_mutex_lock(&o->lock);
	ix->running -= nt - ix->nt; /* those that did not start */
	pthread_cond_broadcast(&o->moved);
	pthread_mutex_unlock(&o->lock);
}

/* The index is done (or failed): the threads end after the fetch under
 * way, and what they hold that the index did not take is given back. */
static void index_ahead_end(struct source_objects *o)
{
	struct index_ahead *ix = &o->ix;

	pthread_mutex_lock(&o->lock);
	ix->stop = true;
	pthread_cond_broadcast(&o->moved);
	pthread_mutex_unlock(&o->lock);
	for (size_t i = 0; i < ix->nt; i++)
		pthread_join(ix->t[i], NULL);
	ix->nt = 0;
	pthread_mutex_lock(&o->lock);
	for (size_t i = 0; i < ix->n; i++) {
		struct obj *ob = &o->v[ix->at[i]];

		if (ob->ix == IX_HELD)
			obj_drop(ob);
		ob->ix = IX_NONE;
	}
	free(ix->at);
	ix->at = NULL;
	ix->n = ix->next = 0;
	ix->bytes = ix->objects = ix->failed = 0;
	ix->paused = false;
	pthread_mutex_unlock(&o->lock);
}

/* Every object the index-ahead holds given back (fetched again, from the
 * cache while there, when the index comes closer): room for the index's
 * own fetch of one whose fetch ahead failed (no room, maybe). Under
 * o->lock. */
static void index_unhold(struct source_objects *o)
{
	for (size_t i = 0; i < o->ix.n; i++) {
		struct obj *ob = &o->v[o->ix.at[i]];

		if (ob->ix == IX_HELD) {
			obj_drop(ob);
			ob->ix = IX_QUEUED;
			o->ix.bytes -= ob->head.size;
			o->ix.objects--;
		}
	}
	o->ix.next = 0;
}

void source_index_ahead_end(const struct source *src)
{
	if (src && src->objs)
		index_ahead_end(src->objs);
}

/* Will a thread take object @at next, at once: nothing held nor on its
 * way, @at the first queued, the threads not waiting? Under o->lock. */
static bool index_next(struct source_objects *o, size_t at)
{
	const struct index_ahead *ix = &o->ix;

	if (!ix->running || ix->stop || ix->failed || ix->paused || ix->objects ||
	    atomic_load(&room_waiters))
		return false;
	for (size_t i = ix->next; i < ix->n; i++)
		if (o->v[ix->at[i]].ix == IX_QUEUED)
			return ix->at[i] == at;
	return false;
}

/* The index's read of object @at, in the index-ahead's hands: waits while
 * it is on its way, or about to be (the threads' first, just started);
 * true when it is held, the hold then the read's. Under o->lock. */
static bool index_take(struct source_objects *o, size_t at)
{
	struct obj *ob;

	/* past the one it fetched itself (else the create failed there) */
	o->ix.paused = false;
	for (;;) {
		struct timespec until;

		if (o->v[at].ix == IX_FETCHING) {
			pthread_cond_wait(&o->moved, &o->lock);
			continue;
		}
		if (o->v[at].ix != IX_QUEUED || !index_next(o, at))
			break;
		/* the threads may wait for what just changed (paused) */
		pthread_cond_broadcast(&o->moved);
		/* room_waiters moves without a signal here: looked at again */
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 100000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&o->moved, &o->lock, &until);
	}
	ob = &o->v[at];
	if (ob->ix == IX_HELD) {
		o->ix.bytes -= ob->head.size;
		o->ix.objects--;
	} else if (ob->ix == IX_FAILED) {
		o->ix.failed--;
		o->ix.paused = true;
		index_unhold(o);
	}
	/* queued or failed: the read fetches it */
	pthread_cond_broadcast(&o->moved);
	if (ob->ix == IX_HELD) {
		ob->ix = IX_NONE;
		return true;
	}
	ob->ix = IX_NONE;
	return false;
}

/* How long a read waits for room that other readers' pins hold. */
#define ROOM_WAIT_S 60

/* objcache_open() of object @at for a read: when what is pinned leaves no
 * room, the fetch-ahead gives back its holds and the read waits for the
 * other reads' pins (each read holds one object at a time). */
static int open_waiting(struct source_objects *o, size_t at, int *fd, struct objcache_pin **pin, char *err,
			size_t errlen)
{
	struct timespec now;
	uint64_t deadline;
	int r;

	clock_gettime(CLOCK_REALTIME, &now);
	deadline = ((uint64_t)now.tv_sec + ROOM_WAIT_S) * 1000000000ull + (uint64_t)now.tv_nsec;
	for (;;) {
		struct obj *ob = &o->v[at];
		bool room;

		r = objects_open(o, at, fd, pin, err, errlen);
		clock_gettime(CLOCK_REALTIME, &now);
		if (r != -ENOSPC || (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec >= deadline)
			return r;
		atomic_fetch_add(&room_waiters, 1);
		pthread_mutex_lock(&streams_lock);
		for (struct source_objects *s = streams; s; s = s->next_stream) {
			pthread_mutex_lock(&s->lock);
			unhold_all(s);
			pthread_mutex_unlock(&s->lock);
		}
		pthread_mutex_unlock(&streams_lock);
		/* a second at a time: a fetch ahead under way may hold room
		 * when it ends, given back then */
		room = objcache_wait_room(ob->head.size, ((uint64_t)now.tv_sec + 1) * 1000000000ull +
					  (uint64_t)now.tv_nsec);
		atomic_fetch_sub(&room_waiters, 1);
		pthread_mutex_lock(&streams_lock);
		for (struct source_objects *s = streams; s; s = s->next_stream) {
			pthread_mutex_lock(&s->lock);
			pthread_cond_broadcast(&s->moved);
			pthread_mutex_unlock(&s->lock);
		}
		pthread_mutex_unlock(&streams_lock);
		(void)room; /* tried again either way, until the deadline */
	}
}


int source_read_why(void)
{
	return read_why;
}

bool source_read_refused(void)
{
	return read_why == SOURCE_READ_KEYS;
}

void source_read_refused_clear(void)
{
	read_why = 0;
}

int source_open_read(const struct source *src, const char *path, struct stat *st, size_t *hold, char *err,
		     size_t errlen)
{
	struct source_objects *o = src ? src->objs : NULL;
	struct objcache_pin *pin = NULL;
	uint64_t begin = 0;
	struct obj *ob;
	bool taken;
	size_t at;
	int fd = -1, r;

	*hold = 0;
	read_why = 0;
	if (!o || !o->stream || !source_is_url(path))
		return source_open_path(src, path, st, err, errlen);
	pthread_mutex_lock(&o->lock);
	ob = objects_find(o, path, false);
	if (!ob) {
		pthread_mutex_unlock(&o->lock);
		return source_open_path(src, path, st, err, errlen);
	}
	at = (size_t)(ob - o->v);
	taken = ob->ix != IX_NONE && index_take(o, at);
	ob = &o->v[at];
	if (!taken && ob->fd < 0) {
		begin = mono_ns();
		o->waiting++;
		/* on its way from a fetch-ahead thread: wait for it */
		while (o->v[at].fetching && !o->stop)
			pthread_cond_wait(&o->moved, &o->lock);
		ob = &o->v[at];
	}
	if (taken) {
		/* the index-ahead's hold, now this read's */
	} else if (ob->fd < 0) {
		pthread_mutex_unlock(&o->lock);
		r = open_waiting(o, at, &fd, &pin, err, errlen);
		pthread_mutex_lock(&o->lock);
		ob = &o->v[at];
		if (r < 0) {
			o->waiting--;
			pthread_mutex_unlock(&o->lock);
			/* the store refused the keys, or did not answer (its
			 * retries spent): neither is the data's fault */
			read_why = r == -EACCES ? SOURCE_READ_KEYS
				 : store_transport_failed() ? SOURCE_READ_STORE : 0;
			return r;
		}
		obj_install(ob, fd, pin);
	} else {
		ob->refs++;
		atomic_fetch_add(&o->reads_ahead, begin == 0 && ob->ahead);
	}
	/* the last of the reads it was fetched ahead for: that read holds it
	 * now, and then the cache (evictable) */
	if (ob->ahead && reading_at != UINT64_MAX && ob->ahead_reads && --ob->ahead_reads == 0)
		unhold(o, ob);
	if (begin) {
		o->waiting--;
		atomic_fetch_add(&o->waits, 1);
		atomic_fetch_add(&o->wait_ns, mono_ns() - begin);
	}
	fd = ob->fd;
	pthread_mutex_unlock(&o->lock);
	if (st && fstat(fd, st) < 0) {
		r = errfmt(-errno, err, errlen, "%s: its cached copy: %s", path, strerror(errno));
		source_close_read(src, fd, at + 1);
		return r;
	}
	*hold = at + 1;
	return fd;
}

void source_close_read(const struct source *src, int fd, size_t hold)
{
	struct source_objects *o = src ? src->objs : NULL;

	if (!hold) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&o->lock);
	obj_drop(&o->v[hold - 1]);
	pthread_mutex_unlock(&o->lock);
}

const char *source_store_endpoint(const struct source *src)
{
	const struct source_objects *o = src ? src->objs : NULL;

	/* a blend's: that of its first part read by range */
	for (size_t i = 0; o && !o->stream && !o->ranged && i < o->nparts; i++)
		if (o->parts[i] && o->parts[i]->objs && o->parts[i]->objs->ranged)
			return source_store_endpoint(o->parts[i]);
	/* streamed, or read by range: the reads wait on that store */
	return o && (o->stream || o->ranged) && o->endpoint[0] ? o->endpoint : NULL;
}

uint64_t source_fetch_wait_ns(const struct source *src)
{
	return source_streams(src) ? atomic_load(&src->objs->wait_ns) : 0;
}

json_t *source_stream_json(const struct source *src)
{
	struct source_objects *o = src ? src->objs : NULL;
	json_t *j;

	if (!o || !o->stream)
		return NULL;
	pthread_mutex_lock(&o->lock);
	j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "fetch_ahead", (json_int_t)ahead_bound(),
		      "ahead_objects", (json_int_t)o->ahead_objects, "ahead_bytes", (json_int_t)o->ahead_bytes,
		      "fetching_objects", (json_int_t)o->inflight_objects, "fetching_bytes",
		      (json_int_t)o->inflight_bytes, "readers_waiting", (json_int_t)o->waiting,
		      "reads_fetched_ahead", (json_int_t)atomic_load(&o->reads_ahead), "reads_waited",
		      (json_int_t)atomic_load(&o->waits), "wait_seconds",
		      (double)atomic_load(&o->wait_ns) / 1e9);
	pthread_mutex_unlock(&o->lock);
	return j;
}

static uint64_t source_fetch_ahead_bytes(void)
{
	return atomic_load(&fetch_ahead_bytes);
}

void source_set_fetch_ahead(uint64_t bytes)
{
	atomic_store(&fetch_ahead_bytes, bytes ? bytes : SOURCE_FETCH_AHEAD_DEFAULT);
}

/* ---- the node's cache ---- */

int source_set_object_cache(const char *cache_dir, uint64_t max_bytes, char *err, size_t errlen)
{
	char dir[4200];

	if (!cache_dir || !*cache_dir)
		return 0;
	snprintf(dir, sizeof(dir), "%s/objects", cache_dir);
	return objcache_init(dir, max_bytes, err, errlen);
}

json_t *source_object_cache_json(void)
{
	struct objcache_stats s;
	json_t *j;

	objcache_get_stats(&s);
	j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "cache_bytes",
			 (json_int_t)s.max_bytes, "bytes_used", (json_int_t)s.bytes_used, "objects",
			 (json_int_t)s.objects, "pinned", (json_int_t)s.pinned, "hits", (json_int_t)s.hits, "misses",
			 (json_int_t)s.misses, "bytes_fetched", (json_int_t)s.bytes_fetched, "evictions",
			 (json_int_t)s.evictions, "fetching", (json_int_t)s.fetching, "fetching_bytes",
			 (json_int_t)s.fetching_bytes, "fetch_ahead", (json_int_t)ahead_bound(),
			 "checksum_mismatches", (json_int_t)s.checksum_mismatches);
	json_object_set_new(j, "rechecked", json_integer((json_int_t)s.rechecked));
	json_object_set_new(j, "recheck_failures", json_integer((json_int_t)s.recheck_failures));
	json_object_set_new(j, "store_endpoints", source_store_endpoints_json());
	json_object_set_new(j, "ranged_gets", json_integer((json_int_t)atomic_load(&all_ranged_gets)));
	json_object_set_new(j, "ranged_bytes", json_integer((json_int_t)atomic_load(&all_ranged_bytes)));
	return j;
}

/* ---- read-ahead of a source read by range (source.h) ----
 *
 * A source read by range (source_read_range()) makes a GET per
 * piece of a sample. A worker building rows of a batch reads them first in
 * a recording pass (source_ahead_record()): each source_read_range() then
 * notes its range and GETs nothing. source_ahead_start() starts up to
 * AHEAD_GETS threads that GET the noted ranges in order, at most fetch_ahead
 * bytes held (GOT and not yet taken, or on their way); the worker reads its
 * rows again, and each source_read_range() takes its range's bytes from
 * there (waiting for it), one copy into the batch. A range a read does not
 * find (a read that went another way) is GOT by the read itself, as without
 * a plan. So a batch costs about one request's latency per AHEAD_GETS
 * samples, and its bytes are those of the reads one after the other: the
 * same reads, the same ranges, whatever the timing.
 *
 * The plan is the calling thread's (a worker's), alive from record to end.
 */

/* GETs in flight for one task */
#define AHEAD_GETS 16

enum { R_WAIT, R_RUNNING, R_DONE, R_TAKEN };

struct range {
	const struct source *src;
	const char *url;             /* the kind's, alive as long as its source */
	uint64_t off;
	size_t len;
	void *buf;                   /* R_DONE without error: its bytes */
	int state, r, why;
	bool passed;                 /* the reads went past it while it ran: dropped when done */
	char *err;                   /* R_DONE with an error: its text */
};

struct ahead_plan {
	pthread_mutex_t lock;
	pthread_cond_t moved;        /* a range done or taken, or stop */
	struct range *v;
	size_t n, cap;
	size_t next;                 /* the next range to GET */
	size_t cursor;               /* the reads are past the ranges before it */
	uint64_t held, bound;        /* bytes of ranges started, not yet taken */
	bool recording, stop;
	pthread_t threads[AHEAD_GETS];
	size_t nthreads;
};

static _Thread_local struct ahead_plan *ahead_plan;

bool source_ahead_wanted(const struct source *src)
{
	if (!src)
		return false;
	if (source_reads_by_range(src))
		return true;
	/* a blend (megatron's prefixes too): its parts read by range are its */
	for (size_t i = 0; src->objs && i < src->objs->nparts; i++)
		if (source_reads_by_range(src->objs->parts[i]))
			return true;
	return false;
}

bool source_ahead_recording(void)
{
	return ahead_plan && ahead_plan->recording;
}

void source_ahead_note(const struct source *src, const char *url, uint64_t off, size_t len)
{
	if (source_ahead_recording())
		plan_note(ahead_plan, src, url, off, len);
}

void source_ahead_record(void)
{
	struct ahead_plan *p = calloc(1, sizeof(*p));

	if (!p)
		return; /* no plan: every read GETs its own */
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->moved, NULL);
	p->recording = true;
	ahead_plan = p;
}

static void range_drop(struct ahead_plan *p, struct range *rg)
{
	if (rg->state == R_DONE || rg->state == R_RUNNING)
		p->held -= rg->len;
	free(rg->buf);
	free(rg->err);
	rg->buf = NULL;
	rg->err = NULL;
	rg->state = R_TAKEN;
}

static void *range_thread(void *arg)
{
	struct ahead_plan *p = arg;
	char err[512];

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct range *rg;
		void *buf;
		int r, why = 0;

		while (p->next < p->n && p->v[p->next].state != R_WAIT)
			p->next++;
		/* one range at least, whatever its size; more within the bound */
		while (!p->stop && p->next < p->n && p->held && p->held + p->v[p->next].len > p->bound)
			pthread_cond_wait(&p->moved, &p->lock);
		if (p->stop || p->next >= p->n)
			break;
		rg = &p->v[p->next++];
		if (rg->state != R_WAIT)
			continue;
		rg->state = R_RUNNING;
		p->held += rg->len;
		pthread_mutex_unlock(&p->lock);
		/* this thread has no plan: a GET of its own */
		buf = malloc(rg->len);
		r = buf ? source_read_range(rg->src, rg->url, rg->off, rg->len, buf, err, sizeof(err))
			: errfmt(-ENOMEM, err, sizeof(err), "out of memory");
		if (r < 0)
			why = source_read_why();
		pthread_mutex_lock(&p->lock);
		rg->state = R_DONE;
		rg->r = r;
		rg->why = why;
		if (r < 0) {
			free(buf);
			rg->err = strdup(err);
			/* the reads stop at it: GET no more (one they went past
			 * stops none: its error is no read's) */
			p->stop = p->stop || !rg->passed;
		} else {
			rg->buf = buf;
		}
		/* no read will take it: its bytes leave the bound at once */
		if (rg->passed)
			range_drop(p, rg);
		pthread_cond_broadcast(&p->moved);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

void source_ahead_start(void)
{
	struct ahead_plan *p = ahead_plan;
	size_t want;

	if (!p)
		return;
	p->recording = false;
	p->bound = source_fetch_ahead_bytes();
	/* a single range: nothing to overlap, its read GETs it */
	want = p->n > 1 ? (p->n < AHEAD_GETS ? p->n : AHEAD_GETS) : 0;
	for (size_t i = 0; i < want; i++)
		if (pthread_create(&p->threads[p->nthreads], NULL, range_thread, p) == 0)
			p->nthreads++;
}

void source_ahead_end(void)
{
	struct ahead_plan *p = ahead_plan;

	if (!p)
		return;
	ahead_plan = NULL;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->moved);
	pthread_mutex_unlock(&p->lock);
	for (size_t i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	for (size_t i = 0; i < p->n; i++)
		range_drop(p, &p->v[i]);
	free(p->v);
	pthread_cond_destroy(&p->moved);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

static void plan_note(struct ahead_plan *p, const struct source *src, const char *url, uint64_t off, size_t len)
{
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		struct range *v = realloc(p->v, cap * sizeof(*v));

		if (!v)
			return; /* not noted: its read GETs it */
		p->v = v;
		p->cap = cap;
	}
	p->v[p->n++] = (struct range){ .src = src, .url = url, .off = off, .len = len, .state = R_WAIT };
}

static bool range_same(const struct range *rg, const struct source *src, const char *url, uint64_t off, size_t len)
{
	return rg->src == src && rg->off == off && rg->len == len && (rg->url == url || !strcmp(rg->url, url));
}

/* The range of @p a read wants, from the cursor on; those it passes are
 * dropped (a read that went another way). NULL: not noted. */
static struct range *plan_find(struct ahead_plan *p, const struct source *src, const char *url, uint64_t off, size_t len)
{
	for (size_t i = p->cursor; i < p->n; i++) {
		if (p->v[i].state != R_TAKEN && range_same(&p->v[i], src, url, off, len)) {
			for (size_t j = p->cursor; j < i; j++)
				if (p->v[j].state == R_RUNNING)
					p->v[j].passed = true;
				else
					range_drop(p, &p->v[j]);
			p->cursor = i + 1;
			return &p->v[i];
		}
	}
	return NULL;
}

static bool source_ahead_take(const struct source *src, const char *url, uint64_t off, size_t len, void *buf,
		       char *err, size_t errlen, int *r, int *why)
{
	struct ahead_plan *p = ahead_plan;
	struct range *rg;
	bool took = false;

	if (!p)
		return false;
	if (p->recording) {
		plan_note(p, src, url, off, len);
		/* defined bytes, so that a kind's checks of them pass */
		memset(buf, 0, len);
		*r = 0;
		*why = 0;
		return true;
	}
	pthread_mutex_lock(&p->lock);
	rg = plan_find(p, src, url, off, len);
	if (rg && rg->state == R_WAIT) {
		rg->state = R_TAKEN;  /* not started: the read GETs it */
	} else if (rg) {
		while (rg->state == R_RUNNING)
			pthread_cond_wait(&p->moved, &p->lock);
		*r = rg->r;
		*why = rg->why;
		if (rg->r < 0)
			snprintf(err, errlen, "%s", rg->err ? rg->err : "out of memory");
		else
			memcpy(buf, rg->buf, len);
		range_drop(p, rg);
		pthread_cond_broadcast(&p->moved);
		took = true;
	}
	pthread_mutex_unlock(&p->lock);
	return took;
}
