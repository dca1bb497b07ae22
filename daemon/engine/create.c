/* SPDX-License-Identifier: MIT */
/* create - making a pipeline: checks, the slab's layout, creates off the loop
 *
 * Creating a pipeline opens its source, lays out its fields in a slot and
 * allocates its slab within --memory-limit (registry.c keeps the pipelines
 * once made). A create whose name exists with the same spec joins it
 * (exist_ok); one with another spec, or another user's pipeline the creator
 * may not use, is refused, naming why. The dataset's files are opened,
 * listed and indexed on libuv's pool as the creator (engine_create_async()),
 * so the loop serves everyone meanwhile; creates of one name wait for the
 * one in flight.
 */
#include "engine-private.h"
#include "pyworkers.h"

/*
 * A create found @pl with the same spec (exist_ok): @client holds it too, and
 * the lifetime only grows: persist upgrades it, a longer ttl extends it.
 */
static int pipeline_join(struct pipeline *pl, const struct spec *spec, uint64_t client)
{
	int r = pipeline_holder_add(pl, client);

	if (r < 0)
		return r;
	if (!client)
		pl->from_config = true;
	if ((!client || spec->persist) && !pl->persist) {
		pl->persist = true;
		log_event(LOG_INFO, "pipeline.persist", "pipeline=%s why=%s", pl->spec->name,
		          client ? "\"a create asked for persist\"" : "\"the config has it\"");
	} else if (!pl->persist && spec->has_ttl && spec->ttl_ms > pipeline_linger_ms(pl)) {
		pl->has_ttl = true;
		pl->ttl_ms = spec->ttl_ms;
	}
	pipeline_lifetime(pl);
	linger_arm(pl->eng);
	return 0;
}

/*
 * A lingering pipeline (scoped, unused) is joined only by an exist_ok create
 * with the same spec, the next rank of its job. Any other create by a client
 * of its owner, another spec or no exist_ok, starts a new job: the old one is
 * dropped and the name created afresh, instead of an error for the rest of
 * the linger. Return: true when @old was dropped.
 */
static bool lingering_gives_way(struct pipeline *old, const struct spec *spec,
                                const struct principal *who, uint64_t client, bool exist_ok)
{
	struct engine *eng = old->eng;
	char diff[512], why[640];
	size_t n;

	if (old->persist || !old->unused || !client || (!who->admin && who->creds.uid != old->owner))
		return false;
	n = spec_diff(spec, old->spec, diff, sizeof(diff));
	if (n == 0 && exist_ok)
		return false;
	snprintf(why, sizeof(why), "unused, and client %" PRIu64 " creates it %s%s", client,
	         n ? "with another spec: " : "anew (without exist_ok)", n ? diff : "");
	pipeline_drop_now(old, why); /* may free it */
	linger_arm(eng);
	return true;
}

static void owner_lookup(struct pipeline *pl)
{
	if (!creds_user_name_only(pl->owner, pl->owner_name, sizeof(pl->owner_name)))
		pl->owner_name[0] = '\0';
}

/*
 * May an exist_ok create of @who join @pl? Its own, the daemon's (the
 * config's, trusted as the daemon is), or the one of the owner it named:
 * a name a client computes must never lead it into another user's data
 * (docs/security.md, "Whose pipeline, whose daemon").
 */
static bool join_allowed(const struct pipeline *pl, const struct principal *who)
{
	return pl->owner == who->creds.uid || pl->owner == geteuid() ||
	       (who->has_join_owner && who->join_owner == pl->owner);
}

/* -EEXIST: @pl is another user's, whom @who did not name. */
static int join_refused(const struct pipeline *pl, const struct principal *who, char *err,
                        size_t errlen)
{
	char user[128];

	creds_user_name(pl->owner, user, sizeof(user));
	return errfmt(-EEXIST, err, errlen, "pipeline '%s' exists already, owned by %s: exist_ok "
	              "joins only your own pipelines%s; attach it by name if you mean to read it, "
	              "or use another name", pl->spec->name, user,
	              who->has_join_owner ? " and those of the owner you named" : "");
}

/* The spec's "access" and "group" for a pipeline @who creates. */
static int access_init(struct pipeline *pl, const struct spec *spec, const struct principal *who,
                       uint64_t client, char *err, size_t errlen)
{
	pl->access = spec->access;
	if (pl->access == SPEC_ACCESS_DEFAULT)
		pl->access = client ? SPEC_ACCESS_OWNER : SPEC_ACCESS_ALL;
	pl->group = spec->has_group ? (gid_t)spec->group : who->creds.gid;
	if (spec->has_group && !who->admin && !creds_in_group(&who->creds, pl->group)) {
		char user[128];
		return errfmt(-EPERM, err, errlen, "spec: group: %s is not in group %u",
		              creds_user_name(who->creds.uid, user, sizeof(user)), (unsigned)pl->group);
	}
	return 0;
}

/*
 * A create in three steps: create_check() on the loop (the name: another
 * user's, an identical pipeline to join, a lingering one that gives way),
 * source_open_as() anywhere (the files: opening, listing and indexing may
 * take long, so engine_create_async() runs it on libuv's pool), and
 * create_build() on the loop (slab and slots).
 *
 * create_check() returns 1 when the pipeline is to be built, else the
 * create's result (0 joined, < 0 refused), @spec then freed.
 */
static int create_check(struct engine *eng, struct spec *spec, const struct principal *who,
                        uint64_t client, bool exist_ok, char *err, size_t errlen)
{
	struct pipeline *old;
	int r;

	if (eng->shutdown) {
		spec_free(spec);
		return errfmt(-ESHUTDOWN, err, errlen, "daemon is shutting down");
	}
	old = engine_find(eng, spec->name);
	if (old && !pipeline_may_use(old, who)) {
		/* another user's: say whose, so the job that finds its name taken
		 * knows what happened */
		spec_free(spec);
		return pipeline_owned_error(old, -EACCES, "; use another name", err, errlen);
	}
	if (old && lingering_gives_way(old, spec, who, client, exist_ok)) {
		old = NULL;
	} else if (old) {
		char diff[640];
		size_t ndiff = spec_diff(spec, old->spec, diff, sizeof(diff));
		if (ndiff == 0 && exist_ok && !join_allowed(old, who)) {
			r = join_refused(old, who, err, errlen);
		} else if (ndiff == 0) {
			r = exist_ok ? pipeline_join(old, spec, client) : -EEXIST;
			/* also the note for 0, "existed" (main.c logs it) */
			if (r == -ENOMEM)
				errfmt(r, err, errlen, "out of memory");
			else
				errfmt(r, err, errlen, "pipeline '%s' exists already", spec->name);
		} else {
			r = errfmt(-EEXIST, err, errlen,
			           "pipeline '%s' exists already with another spec: %s; "
			           "use another name, or drop it first (loaderctl drop %s)",
			           spec->name, diff, spec->name);
		}
		spec_free(spec);
		return r;
	}
	/* before the dataset is listed: this one can never fit */
	if ((r = source_check_limit(spec, eng->memory_limit, err, errlen)) < 0) {
		spec_free(spec);
		return r;
	}
	return 1;
}

/* The generation of a new pipeline named @name: past every one of that name
 * still there (retired by a reload, or held), so no two have the same. */
static uint32_t next_generation(const struct engine *eng, const char *name)
{
	uint32_t gen = 0;

	for (const struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped && strcmp(pl->spec->name, name) == 0 && pl->generation + 1 > gen)
			gen = pl->generation + 1;
	return gen;
}

/*
 * The slots of a pipeline whose spec leaves "prefetch" to the daemon, slots
 * of @slot_bytes: PREFETCH_AUTO_BYTES of them within PREFETCH_AUTO_MIN..MAX,
 * and beyond the minimum no more than a share of the memory that is @free.
 * It changes only how far the workers may build ahead, never what a batch
 * holds (which is a function of the spec and its index).
 */
static uint32_t prefetch_auto(uint64_t slot_bytes, uint64_t free)
{
	uint64_t n, room;

	if (!slot_bytes)
		return PREFETCH_AUTO_MIN;
	n = PREFETCH_AUTO_BYTES / slot_bytes;
	room = free / PREFETCH_AUTO_SHARE / slot_bytes;
	if (n > PREFETCH_AUTO_MAX)
		n = PREFETCH_AUTO_MAX;
	if (n > room)
		n = room;
	return n < PREFETCH_AUTO_MIN ? PREFETCH_AUTO_MIN : (uint32_t)n;
}

/* Build the pipeline of @spec over @src (NULL: open it here). Takes both. */
static int create_build(struct engine *eng, struct spec *spec, const struct principal *who,
                        uint64_t client, struct source *src, char *err, size_t errlen)
{
	struct pipeline *pl;
	struct sampler smp;
	uint64_t off = 0, slab_bytes, cache_bytes = 0, need = 0, free_bytes;
	int r;

	pl = calloc(1, sizeof(*pl));
	if (!pl) {
		spec_free(spec);
		source_free(src);
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	}
	pl->src = src;
	pl->eng = eng;
	pl->spec = spec;
	pl->owner = who->creds.uid;
	pl->owner_creds = who->creds;
	pl->created_by = client;
	pl->persist = !client || spec->persist;
	pl->from_config = !client;
	pl->has_ttl = spec->has_ttl;
	pl->ttl_ms = spec->ttl_ms;
	pl->slow_timeout_ms = spec->has_slow_timeout ? spec->slow_timeout_ms : eng->slow_timeout_ms;
	if ((r = bounds_may_create(eng, who, spec->name, err, errlen)) < 0)
		goto fail;
	if ((r = access_init(pl, spec, who, client, err, errlen)) < 0)
		goto fail;
	if (pipeline_holder_add(pl, client) < 0) {
		r = errfmt(-ENOMEM, err, errlen, "out of memory");
		goto fail;
	}
	if (!pl->src && (r = source_open_as(&pl->src, spec, &pl->owner_creds, err, errlen)) < 0)
		goto fail;
	if (spec->shuffle && spec->shuffle_window) {
		uint32_t nshards = 0;
		const uint64_t *first = source_shard_first(pl->src, &nshards);

		pl->windows = first ? sampler_windows_new(first, nshards, spec->shuffle_window) : NULL;
		if (!pl->windows) {
			r = errfmt(-ENOMEM, err, errlen, "out of memory for the shuffle windows");
			goto fail;
		}
	}
	pl->nfields = source_nfields(pl->src);
	if (pl->nfields > SOURCE_MAX_FIELDS) {
		r = errfmt(-EINVAL, err, errlen,
		           "too many fields: %zu (most %d)", pl->nfields, SOURCE_MAX_FIELDS);
		goto fail;
	}
	for (size_t f = 0; f < pl->nfields; f++) {
		const struct field_desc *fd = source_field(pl->src, f);
		uint64_t bytes;
		pl->fields[f] = *fd;
		pl->field_off[f] = off;
		pl->row_bytes += fd->sample_bytes;
		if (__builtin_mul_overflow((uint64_t)spec->batch_size, (uint64_t)fd->sample_bytes, &bytes) ||
		    bytes > (1ull << 40)) {
			r = errfmt(-EINVAL, err, errlen, "batch of field '%s' is too large", fd->name);
			goto fail;
		}
		off += ALIGN_UP(bytes ? bytes : 1, FIELD_ALIGN);
	}
	pl->slot_bytes = ALIGN_UP(off, SLOT_ALIGN);
	if (!spec->prefetch && eng->held)
		holds_check(eng); /* what a held slab let go is free for the auto size too */
	/* the auto size is a share of what the decoded-image cache leaves free */
	cache_bytes = source_memory_bytes(pl->src);
	free_bytes = engine_memory_free(eng);
	free_bytes = free_bytes > cache_bytes ? free_bytes - cache_bytes : 0;
	pl->nslots = pl->prefetch = spec->prefetch ? spec->prefetch
	                                           : prefetch_auto(pl->slot_bytes, free_bytes);
	smp = (struct sampler){ .nsamples = source_nsamples(pl->src), .batch_size = spec->batch_size,
		.shuffle = spec->shuffle, .drop_last = spec->drop_last, .seed = spec->seed,
		.rank = 0, .world = 1 };
	if (sampler_batches_per_epoch(&smp) == 0) {
		r = errfmt(-EINVAL, err, errlen,
		           "pipeline yields no batch: %" PRIu64 " samples, batch_size %u, drop_last",
		           smp.nsamples, spec->batch_size);
		goto fail;
	}
	/* the slab, and a decoded-image cache's arena (imagecache.c) */
	if (!__builtin_mul_overflow(pl->slot_bytes, (uint64_t)pl->nslots, &slab_bytes) &&
	    !__builtin_add_overflow(slab_bytes, cache_bytes, &need) &&
	    need > engine_memory_free(eng) && eng->held)
		holds_check(eng); /* some held slab may be let go by now */
	if (__builtin_mul_overflow(pl->slot_bytes, (uint64_t)pl->nslots, &slab_bytes) ||
	    __builtin_add_overflow(slab_bytes, cache_bytes, &need) ||
	    need > engine_memory_free(eng)) {
		char held[512], users[512], cache[96] = "";
		holds_explain(eng, held, sizeof(held));
		bounds_explain_users(eng, users, sizeof(users));
		if (cache_bytes)
			snprintf(cache, sizeof(cache), ", and %" PRIu64 " of cache.bytes", cache_bytes);
		r = errfmt(-ENOSPC, err, errlen,
		           "memory limit: pipeline '%s' needs %" PRIu64 " bytes (%u slots of %" PRIu64
		           "%s), %" PRIu64 " of %" PRIu64 " bytes are free (--memory-limit)%s%s",
		           spec->name, pl->slot_bytes * pl->nslots + cache_bytes, pl->nslots,
		           pl->slot_bytes, cache, engine_memory_free(eng), eng->memory_limit, held, users);
		goto fail;
	}
	if ((r = bounds_may_allocate(eng, who, spec->name, need, err, errlen)) < 0)
		goto fail;
	/* a python pipeline's slab is sealed once its worker host mapped it */
	if (source_external(pl->src))
		r = slab_new_unsealed(&pl->slab, spec->name, slab_bytes);
	else
		r = slab_new(&pl->slab, spec->name, slab_bytes);
	if (r < 0) {
		errfmt(r, err, errlen, "cannot create slab of %" PRIu64 " bytes: %s", slab_bytes,
		       strerror(-r));
		goto fail;
	}
	pl->slots = calloc(pl->nslots, sizeof(*pl->slots));
	pl->free_slots = calloc(pl->nslots, sizeof(*pl->free_slots));
	if (!pl->slots || !pl->free_slots) {
		r = errfmt(-ENOMEM, err, errlen, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < pl->nslots; i++) {
		pl->slots[i].idx = i;
		pl->free_slots[pl->nfree++] = pl->nslots - 1 - i;
	}
	if (source_external(pl->src) && (r = pyw_pipeline_new(pl, err, errlen)) < 0)
		goto fail;
	eng->memory_used += need;
	pl->created_ms = uv_now(eng->loop);
	owner_lookup(pl);
	pl->generation = next_generation(eng, spec->name);
	pl->next = eng->pipelines;
	eng->pipelines = pl;
	stats_pipeline_init(pl);
	log_event(LOG_INFO, "pipeline.create", "pipeline=%s samples=%" PRIu64 " slots=%u slot_bytes=%"
	          PRIu64 " prefetch_auto=%s owner=%u by=%s", spec->name, smp.nsamples, pl->nslots,
	          pl->slot_bytes, spec->prefetch ? "false" : "true", (unsigned)pl->owner,
	          client ? "client" : "config");
	pipeline_lifetime(pl);
	return 1;

fail:
	pl->spec = NULL;
	spec_free(spec);
	source_free(pl->src);
	sampler_windows_free(pl->windows);
	slab_free(pl->slab);
	free(pl->slots);
	free(pl->free_slots);
	free(pl->holders);
	free(pl);
	return r;
}

int engine_create(struct engine *eng, struct spec *spec, const struct principal *who,
                  uint64_t client, bool exist_ok, char *err, size_t errlen)
{
	int r = create_check(eng, spec, who, client, exist_ok, err, errlen);

	return r == 1 ? create_build(eng, spec, who, client, NULL, err, errlen) : r;
}

/* --- creates off the loop ------------------------------------------------ */

struct create_req {
	struct create_req *next;      /* in eng->creating, or a waiter list */
	struct create_req *waiters;   /* creates of the same name that came meanwhile */
	uv_work_t work;
	struct engine *eng;
	struct spec *spec;
	struct principal who;
	uint64_t client;
	bool exist_ok;
	engine_create_cb cb;
	engine_open_cb open_cb;       /* engine_open_async(): the source is the caller's */
	void *userdata;
	struct source *src;
	int r;
	char err[1024];
};

static void create_work(uv_work_t *w)
{
	struct create_req *q = w->data;

	/* with the owner's file credentials on this pool thread (creds.c) */
	q->r = source_open_as(&q->src, q->spec, &q->who.creds, q->err, sizeof(q->err));
}

static void create_start(struct create_req *q);

static void create_done(struct create_req *q)
{
	struct create_req *w = q->waiters;

	if (q->open_cb)
		q->open_cb(q->userdata, q->r < 0 ? NULL : q->src, q->r, q->err);
	else
		q->cb(q->userdata, q->r, q->err);
	free(q);
	/* the next of the same name: it now finds the pipeline (or opens its own) */
	while (w) {
		struct create_req *n = w->next;
		w->next = NULL;
		create_start(w);
		w = n;
	}
}

static void create_after(uv_work_t *w, int status)
{
	struct create_req *q = w->data, **pp;
	struct engine *eng = q->eng;
	int r;

	for (pp = &eng->creating; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	eng->ncreating--;
	q->next = NULL;
	if (q->r < 0 || status < 0) {
		if (q->r >= 0)
			q->r = errfmt(-ECANCELED, q->err, sizeof(q->err), "create cancelled");
		source_free(q->src);
		q->src = NULL;
		if (!q->open_cb)
			spec_free(q->spec);
	} else if (q->open_cb) {
		/* opened: the caller builds */
	} else if ((r = create_check(eng, q->spec, &q->who, q->client, q->exist_ok, q->err,
	                             sizeof(q->err))) != 1) {
		/* the name changed hands meanwhile (a drop, a config reload) */
		source_free(q->src);
		q->r = r;
	} else {
		q->r = create_build(eng, q->spec, &q->who, q->client, q->src, q->err, sizeof(q->err));
	}
	create_done(q);
}

/* An open alone (engine_open_async()): on the pool, or here without one. */
static void open_start(struct create_req *q)
{
	struct engine *eng = q->eng;

	q->work.data = q;
	if (uv_queue_work(eng->loop, &q->work, create_work, create_after) < 0) {
		create_work(&q->work);
		if (q->r < 0) {
			source_free(q->src);
			q->src = NULL;
		}
		create_done(q);
		return;
	}
	q->next = eng->creating;
	eng->creating = q;
	eng->ncreating++;
}

static void create_start(struct create_req *q)
{
	struct engine *eng = q->eng;
	struct create_req *busy;
	int r;

	q->err[0] = '\0';
	if (q->open_cb) {
		open_start(q);
		return;
	}
	r = create_check(eng, q->spec, &q->who, q->client, q->exist_ok, q->err, sizeof(q->err));
	if (r == 1) {
		/* before its files are listed; create_build() asks again */
		int b = bounds_may_create(eng, &q->who, q->spec->name, q->err, sizeof(q->err));
		if (b < 0) {
			spec_free(q->spec);
			r = b;
		}
	}
	if (r != 1) {
		q->r = r;
		create_done(q);
		return;
	}
	for (busy = eng->creating; busy; busy = busy->next)
		if (strcmp(busy->spec->name, q->spec->name) == 0) {
			/* wait for it: DDP ranks create one name at once, and one of
			 * them indexing the files is enough */
			q->next = busy->waiters;
			busy->waiters = q;
			return;
		}
	q->work.data = q;
	if (uv_queue_work(eng->loop, &q->work, create_work, create_after) < 0) {
		/* no pool: open here */
		q->r = create_build(eng, q->spec, &q->who, q->client, NULL, q->err, sizeof(q->err));
		create_done(q);
		return;
	}
	q->next = eng->creating;
	eng->creating = q;
	eng->ncreating++;
}

void engine_create_async(struct engine *eng, struct spec *spec, const struct principal *who,
                         uint64_t client, bool exist_ok, engine_create_cb cb, void *userdata)
{
	struct create_req *q = calloc(1, sizeof(*q));

	if (!q) {
		spec_free(spec);
		cb(userdata, -ENOMEM, "out of memory");
		return;
	}
	*q = (struct create_req){ .eng = eng, .spec = spec, .who = *who, .client = client,
		.exist_ok = exist_ok, .cb = cb, .userdata = userdata };
	create_start(q);
}

void engine_open_async(struct engine *eng, struct spec *spec, const struct principal *who,
                       engine_open_cb cb, void *userdata)
{
	struct create_req *q = calloc(1, sizeof(*q));

	if (!q) {
		cb(userdata, NULL, -ENOMEM, "out of memory");
		return;
	}
	*q = (struct create_req){ .eng = eng, .spec = spec, .who = *who, .open_cb = cb,
		.userdata = userdata };
	create_start(q);
}

int engine_create_opened(struct engine *eng, struct spec *spec, const struct principal *who,
                         uint64_t client, bool exist_ok, struct source *src, char *err,
                         size_t errlen)
{
	int r = create_check(eng, spec, who, client, exist_ok, err, errlen);

	if (r == 1)
		return create_build(eng, spec, who, client, src, err, errlen);
	source_free(src);
	return r;
}

unsigned engine_creating(const struct engine *eng)
{
	return eng->ncreating;
}
