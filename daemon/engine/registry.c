/* SPDX-License-Identifier: MIT */
/* registry - the engine's pipelines by name, their access, lifetimes
 *
 * A pipeline is made by create.c; here it is found by name, checked against
 * who asks (its access), kept while in use, and dropped; a dropped pipeline
 * is freed once no job or copy still uses it.
 *
 * Lifetime (docs/spec.md, "Lifetime"): a pipeline a client created is in use
 * while an attachment reads it or while a connection that created it (or
 * found it with exist_ok) is open, its holders. Once unused it lingers, the
 * daemon's linger or its spec's ttl, so that the ranks of one job may come
 * in any order; an attach or an exist_ok create meanwhile keeps it. Then it
 * is dropped, its slab back to the budget. Persistent pipelines (the config,
 * "persist": true) stay until dropped. One timer, armed for the earliest
 * expiry; dropping happens only in its callback, never under a caller.
 */

#include "engine-private.h"
#include "pyworkers.h"

/* --- pipelines ---------------------------------------------------------- */

struct pipeline *engine_find(struct engine *eng, const char *name)
{
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped && !pl->retired && strcmp(pl->spec->name, name) == 0)
			return pl;
	return NULL;
}

/* A pipeline a reload retired (retire.c) is no longer found by name but here. */
struct pipeline *engine_find_retired(struct engine *eng, const char *name)
{
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped && pl->retired && strcmp(pl->spec->name, name) == 0)
			return pl;
	return NULL;
}

bool engine_has(struct engine *eng, const char *name)
{
	return engine_find(eng, name) != NULL;
}

void pipeline_free(struct pipeline *pl)
{
	while (pl->streams) {
		struct stream *s = pl->streams;
		pl->streams = s->next;
		stream_free(s);
	}
	devcopy_free_all(pl);
	pyw_pipeline_free(pl);
	holds_forget(pl);
	source_free(pl->src);
	/* after the source: its fetch-ahead threads follow the sampler */
	sampler_windows_free(pl->windows);
	devcopy_slab_free(pl);
	spec_free(pl->spec);
	free(pl->slots);
	free(pl->free_slots);
	free(pl->holders);
	free(pl);
}

void pipeline_maybe_free(struct pipeline *pl)
{
	struct engine *eng = pl->eng;
	struct pipeline **pp;

	if (!pl->dropped || pl->jobs)
		return;
	for (pp = &eng->pipelines; *pp; pp = &(*pp)->next)
		if (*pp == pl) {
			*pp = pl->next;
			break;
		}
	/* a slab that clients still map stays in the budget (holds.c) */
	if (pl->slab && !holds_retain(pl))
		eng->memory_used -= pl->slab->size;
	/* the source (and its cache) goes now, whoever maps the slab */
	if (pl->src)
		eng->memory_used -= source_memory_bytes(pl->src);
	pipeline_free(pl);
}

/* --- access (docs/security.md) ----------------------------------------- */

static const char *access_name(int access)
{
	switch (access) {
	case SPEC_ACCESS_ALL: return "all";
	case SPEC_ACCESS_GROUP: return "group";
	default: return "owner";
	}
}

void principal_daemon(struct principal *p)
{
	creds_self(&p->creds);
	p->admin = true;
}

bool pipeline_may_use(const struct pipeline *pl, const struct principal *who)
{
	if (who->admin || who->creds.uid == pl->owner)
		return true;
	switch (pl->access) {
	case SPEC_ACCESS_ALL: return true;
	case SPEC_ACCESS_GROUP: return creds_in_group(&who->creds, pl->group);
	default: return false;
	}
}

int pipeline_owned_error(const struct pipeline *pl, int r, const char *tail, char *err, size_t errlen)
{
	char user[128];

	creds_user_name(pl->owner, user, sizeof(user));
	return errfmt(r, err, errlen, "pipeline '%s' belongs to %s, access %s%s", pl->spec->name, user,
	              access_name(pl->access), tail);
}

bool engine_may_use(struct engine *eng, const char *name, const struct principal *who)
{
	struct pipeline *pl = engine_find(eng, name);

	return pl && pipeline_may_use(pl, who);
}

int engine_owner(struct engine *eng, const char *name, uid_t *owner)
{
	struct pipeline *pl = engine_find(eng, name);

	if (!pl)
		return -ENOENT;
	*owner = pl->owner;
	return 0;
}

/* --- lifetime ----------------------------------------------------------- */

uint64_t pipeline_linger_ms(const struct pipeline *pl)
{
	return pl->has_ttl ? pl->ttl_ms : pl->eng->linger_ms;
}

/* Seconds as the log and the errors say them: "5", "0.5". */
static void fmt_secs(char *buf, size_t n, uint64_t ms)
{
	if (ms % 1000 == 0)
		snprintf(buf, n, "%" PRIu64, ms / 1000);
	else
		snprintf(buf, n, "%g", (double)ms / 1000.0);
}

void pipeline_drop_now(struct pipeline *pl, const char *why)
{
	struct engine *eng = pl->eng;
	char msg[160];

	snprintf(msg, sizeof(msg), "pipeline '%s' was dropped", pl->spec->name);
	for (struct attachment *a = eng->atts; a; a = a->all_next)
		if (a->pl == pl) {
			att_disconnect(a, ENOENT, msg);
			a->dead = true;
			snprintf(a->dead_msg, sizeof(a->dead_msg), "%s", msg);
		}
	pl->dropped = true;
	for (struct stream *s = pl->streams; s; s = s->next)
		stream_unpark(s); /* refused by the store: they end now */
	char q[LOG_QUOTE_MAX];
	log_event(LOG_INFO, "pipeline.drop", "pipeline=%s why=%s", pl->spec->name,
	          log_quote(q, why ? why : "dropped"));
	if (pl->py) {
		/* end its workers' jobs; the count held here keeps it until then */
		pl->jobs++;
		pyw_pipeline_dropped(pl);
		pl->jobs--;
	}
	pipeline_maybe_free(pl);
}

static void on_linger(uv_timer_t *t);

void linger_arm(struct engine *eng)
{
	uint64_t now = uv_now(eng->loop), next = UINT64_MAX;

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next) {
		if (pl->dropped || pl->persist || !pl->unused)
			continue;
		uint64_t at = pl->unused_since + pipeline_linger_ms(pl);
		if (at < next)
			next = at;
	}
	if (next == UINT64_MAX || eng->shutdown) {
		if (eng->linger_timer)
			uv_timer_stop(eng->linger_timer);
		return;
	}
	if (!eng->linger_timer) {
		uv_timer_t *t = calloc(1, sizeof(*t));
		if (!t || uv_timer_init(eng->loop, t) < 0) {
			free(t);
			log_err("no timer for the linger of unused pipelines: they stay");
			return;
		}
		t->data = eng;
		eng->linger_timer = t;
	}
	uv_timer_start(eng->linger_timer, on_linger, next > now ? next - now : 0, 0);
}

static void on_linger(uv_timer_t *t)
{
	struct engine *eng = t->data;
	uint64_t now = uv_now(eng->loop);
	struct pipeline *pl, *next;

	if (eng->shutdown)
		return;
	for (pl = eng->pipelines; pl; pl = next) {
		next = pl->next;
		if (pl->dropped || pl->persist || !pl->unused ||
		    pl->unused_since + pipeline_linger_ms(pl) > now)
			continue;
		char secs[32], why[96];
		fmt_secs(secs, sizeof(secs), pipeline_linger_ms(pl));
		if (pl->retired)
			snprintf(why, sizeof(why), "%s by a reload, and no client reads it any more",
			         pl->retired == RETIRE_DRAIN ? "removed" : "replaced");
		else
			snprintf(why, sizeof(why), "unused for %s s", secs);
		pipeline_drop_now(pl, why);
	}
	linger_arm(eng);
}

void pipeline_lifetime(struct pipeline *pl)
{
	bool unused = !pl->natts && !pl->nholders;

	if (pl->dropped || unused == pl->unused)
		return;
	pl->unused = unused;
	if (unused)
		pl->unused_since = uv_now(pl->eng->loop);
	if (!pl->persist)
		linger_arm(pl->eng);
}

int pipeline_holder_add(struct pipeline *pl, uint64_t client)
{
	if (!client)
		return 0;
	for (uint32_t i = 0; i < pl->nholders; i++)
		if (pl->holders[i] == client)
			return 0;
	if (pl->nholders == pl->holders_cap) {
		uint32_t cap = pl->holders_cap ? pl->holders_cap * 2 : 4;
		uint64_t *h = realloc(pl->holders, cap * sizeof(*h));
		if (!h)
			return -ENOMEM;
		pl->holders = h;
		pl->holders_cap = cap;
	}
	pl->holders[pl->nholders++] = client;
	return 0;
}

void engine_client_gone(struct engine *eng, uint64_t client)
{
	if (!client)
		return;
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		for (uint32_t i = 0; i < pl->nholders; i++)
			if (pl->holders[i] == client) {
				pl->holders[i] = pl->holders[--pl->nholders];
				pipeline_lifetime(pl);
				break;
			}
}

void engine_set_linger(struct engine *eng, uint64_t ms)
{
	eng->linger_ms = ms;
	linger_arm(eng);
}

/* For the pipelines created from now on: a running one keeps its own. */
void engine_set_slow_timeout(struct engine *eng, uint64_t ms)
{
	eng->slow_timeout_ms = ms;
}

static void on_timer_closed(uv_handle_t *h)
{
	free(h);
}

void registry_close(struct engine *eng)
{
	slow_close(eng);
	holds_close(eng);
	stats_close(eng);
	stream_outage_close(eng);
	if (eng->linger_timer) {
		uv_close((uv_handle_t *)eng->linger_timer, on_timer_closed);
		eng->linger_timer = NULL;
	}
}

void pipeline_fail(struct pipeline *pl, int err, const char *msg)
{
	if (pl->failed)
		return;
	pl->failed = true;
	snprintf(pl->error, sizeof(pl->error), "%s", msg);
	char q[LOG_QUOTE_MAX];
	log_event(LOG_ERR, "pipeline.fail", "pipeline=%s error=%s", pl->spec->name, log_quote(q, msg));
	(void)err;
	pipeline_dispatch(pl);
}
int engine_drop(struct engine *eng, const char *name, const struct principal *who, bool force,
                char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);

	/* a draining one (removed by a reload) an admin may end at once */
	if (!pl)
		pl = engine_find_retired(eng, name);
	if (!pl)
		return errfmt(-ENOENT, err, errlen, "no pipeline named '%s'", name);
	/* access lets others read it, never drop it: that is its owner's (and
	 * an admin's) decision */
	if (!who->admin && who->creds.uid != pl->owner)
		return pipeline_owned_error(pl, -EPERM, ": only its owner or an admin may drop it",
		                            err, errlen);
	if (pl->natts && !force)
		return errfmt(-EBUSY, err, errlen,
		              "pipeline '%s' has %" PRIu64 " clients attached (use force)", name, pl->natts);
	pipeline_drop_now(pl, NULL);
	linger_arm(eng);
	return 0;
}

int engine_set_store(struct engine *eng, const char *name, const struct principal *who,
                     struct source_keys *keys, char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);
	int r;

	if (!pl) {
		source_keys_put(keys);
		return errfmt(-ENOENT, err, errlen, "no pipeline named '%s'", name);
	}
	/* the keys speak for its owner in the store: only the owner (or
	 * root) hands them, never an admin or a reader of an access: all
	 * pipeline (docs/security.md, "Objects in a store") */
	if (who->creds.uid != 0 && who->creds.uid != pl->owner) {
		source_keys_put(keys);
		return pipeline_owned_error(pl, -EPERM, ": only its owner (or root) may hand it credentials",
		                            err, errlen);
	}
	if ((r = spec_swap_store_keys(pl->spec, keys, err, errlen)) < 0) {
		source_keys_put(keys);
		return r;
	}
	source_objects_rekeyed(pl->src);
	/* the batches the store refused for the old keys are built again */
	pl->keys_gen++;
	for (struct stream *s = pl->streams; s; s = s->next)
		stream_unpark(s);
	log_event(LOG_INFO, "pipeline.credentials", "pipeline=%s uid=%u why=\"fresh credentials handed\"",
	          name, (unsigned)who->creds.uid);
	return 0;
}

/* --- a pipeline's live settings ------------------------------------------ */

int engine_set_prefetch(struct engine *eng, const char *name, uint32_t n, uint32_t *old,
                        char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);
	uint32_t active;

	if (!pl)
		return errfmt(-ENOENT, err, errlen, "no pipeline named '%s'", name);
	if (n < 1 || n > pl->nslots)
		return errfmt(-ERANGE, err, errlen, "prefetch: pipeline '%s' has a slab of %u slots, so "
		              "its prefetch is 1..%u live; a larger one needs a new slab: change "
		              "\"prefetch\" in its spec and create it again (or reload the config)",
		              name, pl->nslots, pl->nslots);
	active = pipeline_active_streams(pl);
	if (n < active)
		return errfmt(-ERANGE, err, errlen, "prefetch: pipeline '%s' has %u streams reading it "
		              "and each needs a slot of its own: at least %u", name, active, active);
	const struct stream *bs = pl->shared[LDR_MODE_BROADCAST];
	uint32_t k = bs && bs->natts ? stream_batch_slots(bs) : 1;
	if (k > 1 && n / active < k)
		return errfmt(-ERANGE, err, errlen, "prefetch: pipeline '%s''s broadcast clients read %u "
		              "distinct augment seeds, so each of its batches takes %u slots: with %u "
		              "streams reading it, at least %u", name, k, k, active, k * active);
	*old = pl->prefetch;
	pl->prefetch = n;
	/* above their new quota, streams give back the ready batches nobody
	 * received, build nothing more, and attachments above their share are
	 * sent a Revoke (pipeline_revoke()) */
	pipeline_update(pl);
	return 0;
}
