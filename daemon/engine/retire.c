/* SPDX-License-Identifier: MIT */
/* retire - the config's pipelines on a reload: created, drained, replaced
 *
 * A reload makes the engine's config pipelines those of the file, without
 * cutting off a client that reads one (docs/config.md, "Reload"):
 *
 * - a pipeline the file no longer has drains: no new attachments; each
 *   stream ends at the end of the epoch its clients are in, and the end is
 *   an error that names the reload (not End: a trainer must not take it for
 *   the end of its data); once the last client left, it is dropped.
 * - a pipeline whose spec changed is replaced: the old one is retired (no
 *   longer found by name, so the new one takes the name) and serves the
 *   clients attached to it as before until they detach; new attachments get
 *   the new spec. Both slabs count in the memory limit meanwhile; when the
 *   new one does not fit, the old one stays as it is and the reload says so.
 *
 * A retired pipeline loses "persist" and gets a linger of 0: the linger timer
 * (registry.c) drops it once no attachment is left, never under a caller.
 */
#include "engine-private.h"

const char *retire_state(const struct pipeline *pl)
{
	return pl->retired == RETIRE_DRAIN ? "draining" : pl->retired == RETIRE_REPLACED ? "replaced" : "";
}

/* The first seq past the epoch @seq is in, or @seq itself at an epoch's
 * start when @started (the epoch before it was read: it ends there). */
static uint64_t epoch_end(uint64_t seq, uint64_t bpe, bool started)
{
	uint64_t end;

	if (seq % bpe == 0 && started)
		return seq;
	if (__builtin_mul_overflow(seq / bpe + 1, bpe, &end))
		return UINT64_MAX;
	return end;
}

/* Where @s ends: after the epoch its furthest client is in. */
static uint64_t stream_drain_end(const struct stream *s)
{
	uint64_t end = 0;

	if (s->mode == LDR_MODE_DYNAMIC)
		return epoch_end(s->cursor, s->bpe, s->cursor > 0);
	if (!s->natts)
		return s->head_seq; /* nobody reads it: nothing to finish */
	for (const struct attachment *a = s->atts; a; a = a->next) {
		uint64_t e = epoch_end(a->cursor, s->bpe, a->cursor > a->start_seq);
		if (e > end)
			end = e;
	}
	return end;
}

/* End each stream of @pl at the epoch its clients are in. The partition
 * streams (the ranks of one job) all end after the same epoch, the furthest
 * rank's: a rank that stopped an epoch before the others would leave them
 * waiting in their next collective. */
static void drain_streams(struct pipeline *pl)
{
	uint64_t ranks_epochs = 0;

	for (struct stream *s = pl->streams; s; s = s->next)
		if (!s->dead && s->bpe && s->mode == LDR_MODE_PARTITION && s->natts) {
			uint64_t e = stream_drain_end(s) / s->bpe;
			if (e > ranks_epochs)
				ranks_epochs = e;
		}
	for (struct stream *s = pl->streams; s; s = s->next) {
		uint64_t end;
		if (s->dead || !s->bpe)
			continue;
		end = stream_drain_end(s);
		if (s->mode == LDR_MODE_PARTITION && s->natts &&
		    __builtin_mul_overflow(ranks_epochs, s->bpe, &end))
			end = UINT64_MAX;
		if (end <= s->end_seq) {
			s->end_seq = end;
			s->drained = true;
		}
	}
}

/* What retire() changes of a pipeline that stays, for unretire(). */
struct unretired {
	bool persist, has_ttl, unused;
	uint64_t ttl_ms, unused_since;
	uint32_t nholders;
};

static void retire(struct pipeline *pl, int kind, const char *why, struct unretired *was)
{
	struct engine *eng = pl->eng;

	if (was)
		*was = (struct unretired){ .persist = pl->persist, .has_ttl = pl->has_ttl,
			.unused = pl->unused, .ttl_ms = pl->ttl_ms, .unused_since = pl->unused_since,
			.nholders = pl->nholders };

	pl->retired = kind;
	pl->persist = false;
	pl->has_ttl = true;
	pl->ttl_ms = 0;
	pl->nholders = 0;         /* connections that joined it hold the name, not it */
	if (kind == RETIRE_DRAIN) {
		snprintf(pl->retire_msg, sizeof(pl->retire_msg), "pipeline '%s' was removed from the "
		         "config (%s): it ended with the epoch its clients were in", pl->spec->name, why);
		drain_streams(pl);
	}
	if (!pl->natts && !pl->unused) {
		pl->unused = true;
		pl->unused_since = uv_now(eng->loop);
	} else if (pl->unused) {
		pl->unused_since = uv_now(eng->loop);
	}
	char q[LOG_QUOTE_MAX];
	if (kind == RETIRE_DRAIN)
		log_event(LOG_NOTICE, "pipeline.drain", "pipeline=%s clients=%" PRIu64 " why=%s",
		          pl->spec->name, pl->natts, log_quote(q, why));
	else
		log_event(LOG_NOTICE, "pipeline.replace", "pipeline=%s clients=%" PRIu64 " why=%s",
		          pl->spec->name, pl->natts, log_quote(q, why));
	linger_arm(eng);
	pipeline_update(pl);
}

/* Undo retire() of a replace whose successor could not be created, in the
 * same loop turn (the linger timer has not run): its holders, linger and
 * unused clock are what they were. */
static void unretire(struct pipeline *pl, const struct unretired *was)
{
	pl->retired = RETIRE_NONE;
	pl->persist = was->persist;
	pl->has_ttl = was->has_ttl;
	pl->ttl_ms = was->ttl_ms;
	pl->nholders = was->nholders;
	pl->unused = was->unused;
	pl->unused_since = was->unused_since;
	linger_arm(pl->eng);
	pipeline_update(pl);
}

bool engine_config_needs_open(struct engine *eng, const struct spec *spec)
{
	struct pipeline *old = engine_find(eng, spec->name);
	char diff[8];

	return !old || !old->from_config || old->failed ||
	       spec_diff(spec, old->spec, diff, sizeof(diff)) != 0;
}

bool engine_config_prefetch_reset(struct engine *eng, const char *name, uint32_t *old,
                                  uint32_t *now)
{
	struct pipeline *pl = engine_find(eng, name);

	if (!pl || !pl->from_config || pl->prefetch == pl->nslots)
		return false;
	*old = pl->prefetch;
	*now = pl->prefetch = pl->nslots;
	pipeline_update(pl);
	return true;
}

/* engine_create() of the config's @spec, over @op's source when it has one. */
static int config_create(struct engine *eng, struct spec *spec, struct config_open *op,
                         bool exist_ok, char *err, size_t errlen)
{
	struct principal self;
	struct source *src = op ? op->src : NULL;

	/* the config's pipelines are the daemon's, read with its rights */
	principal_daemon(&self);
	if (op)
		op->src = NULL;
	return src ? engine_create_opened(eng, spec, &self, 0, exist_ok, src, err, errlen)
	           : engine_create(eng, spec, &self, 0, exist_ok, err, errlen);
}

int engine_config_apply(struct engine *eng, struct spec *spec, struct config_open *op,
                        const char *why, char *err, size_t errlen)
{
	struct pipeline *old = engine_find(eng, spec->name);
	struct unretired was;
	char diff[512];
	size_t nd = 0;
	int r;

	if (old && old->from_config)
		nd = spec_diff(spec, old->spec, diff, sizeof(diff));
	/* a failed one is made anew: the reload may follow a fix of its files */
	if (!old || !old->from_config || (nd == 0 && !old->failed)) {
		if (op && !op->src && op->r < 0 && !old) {
			spec_free(spec);
			return errfmt(op->r, err, errlen, "%s", op->err);
		}
		r = config_create(eng, spec, op, true, err, errlen);
		return r < 0 ? r : r == 1 ? CONFIG_CREATED : CONFIG_UNCHANGED;
	}
	if (nd == 0)
		snprintf(diff, sizeof(diff), "it had failed: %.480s", old->error);
	if (op && !op->src && op->r < 0) {
		/* its files could not be opened: the old one stays as it is */
		r = errfmt(op->r, err, errlen, "%s", op->err);
		spec_free(spec);
	} else {
		retire(old, RETIRE_REPLACED, why, &was);
		if ((r = config_create(eng, spec, op, false, err, errlen)) < 0)
			unretire(old, &was);
	}
	if (r < 0) {
		log_event(LOG_WARNING, "pipeline.keep", "pipeline=%s why=\"its new spec could not be "
		          "created\"", old->spec->name);
		return r;
	}
	snprintf(err, errlen, "%s", diff);
	return CONFIG_REPLACED;
}

json_t *engine_config_drain(struct engine *eng, json_t *keep, const char *why)
{
	json_t *drained = json_array();
	struct pipeline *pl, *next;

	for (pl = eng->pipelines; pl; pl = next) {
		size_t i;
		json_t *v;
		bool kept = false;

		next = pl->next;
		if (pl->dropped || pl->retired || !pl->from_config)
			continue;
		json_array_foreach(keep, i, v)
			if (strcmp(json_string_value(v), pl->spec->name) == 0)
				kept = true;
		if (kept)
			continue;
		json_array_append_new(drained, json_pack("{s:s, s:I}", "name", pl->spec->name,
		                                         "clients", (json_int_t)pl->natts));
		retire(pl, RETIRE_DRAIN, why, NULL);
	}
	return drained;
}
