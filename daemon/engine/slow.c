/* SPDX-License-Identifier: MIT */
/* slow - a broadcast client that holds its stream back (docs/spec.md, "Slow
 * broadcast clients")
 *
 * A broadcast batch leaves the ring once every client has received and
 * released it, so the slowest client sets the pace: that is the mode's
 * promise. A client that stops altogether would stop the others for good. A
 * client holds the stream back when the stream cannot build another batch and
 * the client is at least max_lag batches behind the most advanced one,
 * counted from its oldest batch not yet released. Progress (a batch received
 * (a batch released, a request sent: what a stopped process cannot do;
 * deliveries to it do not count) restarts its clock. Policy "wait" detaches
 * it after slow_client_timeout without progress. Policy "skip" sets it aside
 * then instead: its cursor follows the others' and it is delivered one batch
 * at a time (from where the stream is) until it shows progress, then it is
 * served as before; what it holds stays its own, and if its own leases are
 * what holds the stream, it is detached after another timeout as under
 * "wait". A slow but live client is never detached nor skipped: it sets the
 * pace, as broadcast promises.
 *
 * Only the holder of each pipeline is watched, from pipeline_update() and a
 * timer that runs while some pipeline is held back.
 */
#include "engine-private.h"

#define SLOW_TICK_MS 250
#define SLOW_LOG_MS 1000          /* held this long: say so in the log */

/* The oldest batch @a has not released, or its cursor. */
static uint64_t att_oldest(const struct attachment *a)
{
	uint64_t oldest = a->cursor;

	for (const struct lease *l = a->leases; l; l = l->next)
		if (l->seq < oldest)
			oldest = l->seq;
	return oldest;
}

static uint32_t att_max_lag(const struct attachment *a)
{
	uint32_t lag = a->pl->spec->max_lag;

	return lag ? lag : att_share(a);
}

/* Can the broadcast stream build no further batch for want of a slot? */
static bool stream_stuck(const struct stream *s)
{
	const struct pipeline *pl = s->pl;

	return s->started && s->natts > 1 && s->next_produce < s->end_seq &&
	       (s->slots_held + stream_batch_slots(s) > stream_quota(s) ||
	        pl->nfree < stream_batch_slots(s) || s->ring_len >= pl->nslots);
}

/* The attachment that holds @s back, with its lag; NULL if none. */
static struct attachment *stream_holder(struct stream *s, uint64_t *lag)
{
	struct attachment *slowest = NULL;
	uint64_t lo = UINT64_MAX, hi = 0;

	if (!stream_stuck(s))
		return NULL;
	for (struct attachment *a = s->atts; a; a = a->next) {
		uint64_t o = att_oldest(a);
		if (o < lo) {
			lo = o;
			slowest = a;
		}
		if (a->cursor > hi)
			hi = a->cursor;
	}
	if (!slowest || hi < lo || hi - lo < att_max_lag(slowest))
		return NULL;
	*lag = hi - lo;
	return slowest;
}

static void on_slow_tick(uv_timer_t *t);

static void slow_timer_arm(struct engine *eng)
{
	if (eng->shutdown)
		return;
	if (!eng->slow_timer) {
		uv_timer_t *t = calloc(1, sizeof(*t));
		if (!t || uv_timer_init(eng->loop, t) < 0) {
			free(t);
			log_err("no timer for slow broadcast clients: a stopped one holds its stream");
			return;
		}
		t->data = eng;
		eng->slow_timer = t;
	}
	if (!uv_is_active((uv_handle_t *)eng->slow_timer))
		uv_timer_start(eng->slow_timer, on_slow_tick, SLOW_TICK_MS, SLOW_TICK_MS);
}

static void on_slow_tick(uv_timer_t *t)
{
	struct engine *eng = t->data;
	bool any = false;

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped && pl->held_by) {
			pipeline_check_slow(pl);
			any = any || pl->held_by;
		}
	if (!any)
		uv_timer_stop(t);
}

static void slow_timer_closed(uv_handle_t *h)
{
	free(h);
}

void slow_close(struct engine *eng)
{
	if (eng->slow_timer) {
		uv_close((uv_handle_t *)eng->slow_timer, slow_timer_closed);
		eng->slow_timer = NULL;
	}
}

static void progress_mark(struct attachment *a, uint64_t now)
{
	a->slow_since = now;
	a->slow_delivered = a->delivered;
	a->slow_nleases = a->nleases;
	a->slow_npending = a->npending;
}

/* Has @a released a batch or sent a request since progress_mark()? */
static bool progressed(const struct attachment *a)
{
	uint64_t held_then = a->slow_nleases + (a->delivered - a->slow_delivered);

	return a->nleases < held_then || a->npending > a->slow_npending;
}

static void holder_set(struct pipeline *pl, struct attachment *a, uint64_t now)
{
	pl->held_by = a;
	pl->held_logged = false;
	if (a && !a->skip_hold)
		progress_mark(a, now);
}

static void evict(struct pipeline *pl, struct attachment *a, uint64_t lag)
{
	char msg[sizeof(a->dead_msg)], q[LOG_QUOTE_MAX];
	uint64_t idle_ms = pl->slow_timeout_ms;   /* the setting, not the tick it was seen at */
	char secs[32];

	if (idle_ms % 1000)
		snprintf(secs, sizeof(secs), "%g", (double)idle_ms / 1000.0);
	else
		snprintf(secs, sizeof(secs), "%" PRIu64, idle_ms / 1000);
	snprintf(msg, sizeof(msg), "detached: %" PRIu64 " batches behind and no progress for %s s "
	         "(slow_client_timeout, docs/spec.md)", lag, secs);
	log_event(LOG_WARNING, "client.slow_detach", "pipeline=%s client=%" PRIu64 " pid=%d lag=%"
	          PRIu64 " idle_s=%s why=%s", pl->spec->name, a->client_id, a->pid, lag, secs,
	          log_quote(q, msg));
	pl->slow_detached++;
	holder_set(pl, NULL, 0);
	pl->eng->hooks->leave(a, ETIMEDOUT, msg);
	a->dead = true;
	a->dead_err = ETIMEDOUT;
	snprintf(a->dead_msg, sizeof(a->dead_msg), "%s", msg);
}

/* The lowest cursor of the attachments not set aside, UINT64_MAX if none. */
static uint64_t others_cursor(const struct stream *s)
{
	uint64_t to = UINT64_MAX;

	for (const struct attachment *o = s->atts; o; o = o->next)
		if (!o->skip_hold && o->cursor < to)
			to = o->cursor;
	return to;
}

/* "skip": what @a has not received and the others have, it never will. */
static void follow(struct attachment *a, uint64_t to)
{
	if (to == UINT64_MAX || to <= a->cursor)
		return;
	a->skipped += to - a->cursor;
	a->cursor = to;
}

/* The attachments set aside: served again once they show progress, else
 * their cursors follow the others'. True when a cursor moved. */
static bool follow_set_aside(struct stream *s, uint64_t now)
{
	bool moved = false;

	for (struct attachment *a = s->atts; a; a = a->next) {
		uint64_t before = a->cursor;
		if (!a->skip_hold)
			continue;
		if (progressed(a)) {
			a->skip_hold = false;
			progress_mark(a, now);
			log_event(LOG_INFO, "client.slow_resume", "pipeline=%s client=%" PRIu64 " pid=%d "
			          "skipped=%" PRIu64, s->pl->spec->name, a->client_id, a->pid, a->skipped);
			continue;
		}
		follow(a, others_cursor(s));
		moved = moved || a->cursor != before;
	}
	return moved;
}

static void set_aside(struct stream *s, struct attachment *a, uint64_t lag, uint64_t now)
{
	log_event(LOG_NOTICE, "client.slow_skip", "pipeline=%s client=%" PRIu64 " pid=%d lag=%" PRIu64
	          " why=\"no progress: served from where the stream is once it reads again "
	          "(slow_clients skip)\"", s->pl->spec->name, a->client_id, a->pid, lag);
	a->skip_hold = true;
	progress_mark(a, now);
	follow(a, others_cursor(s));
}

void pipeline_check_slow(struct pipeline *pl)
{
	struct stream *s = pl->shared[LDR_MODE_BROADCAST];
	uint64_t now = uv_now(pl->eng->loop), lag = 0, idle;
	struct attachment *a;

	if (pl->failed || pl->dropped || !s || s->dead) {
		pl->held_by = NULL;
		return;
	}
	if (follow_set_aside(s, now))
		pipeline_dispatch(pl);
	a = stream_holder(s, &lag);
	if (a != pl->held_by)
		holder_set(pl, a, now);
	if (!a)
		return;   /* one set aside shows progress by a request: pipeline_update() */
	if (!a->skip_hold && progressed(a))
		progress_mark(a, now);   /* a slow client, not a stopped one */
	pl->held_lag = lag;
	idle = now - a->slow_since;
	if (idle >= pl->slow_timeout_ms && pl->spec->slow_skip && !a->skip_hold) {
		set_aside(s, a, lag, now);
		holder_set(pl, NULL, now);
		pl->eng->hooks->update(pl);
		return;
	}
	if (idle >= pl->slow_timeout_ms) {
		evict(pl, a, lag);
		pl->eng->hooks->update(pl);
		return;
	}
	if (idle >= SLOW_LOG_MS && !pl->held_logged) {
		log_event(LOG_NOTICE, "client.slow_hold", "pipeline=%s client=%" PRIu64 " pid=%d lag=%"
		          PRIu64 " idle_s=%.1f why=\"it holds the broadcast stream back\"",
		          pl->spec->name, a->client_id, a->pid, lag, (double)idle / 1000.0);
		pl->held_logged = true;
	}
	slow_timer_arm(pl->eng);
}

json_t *pipeline_slow_json(const struct pipeline *pl)
{
	const struct attachment *a = pl->held_by;

	if (!a)
		return json_null();
	return json_pack("{s:I, s:I, s:i, s:I, s:f}", "client", (json_int_t)a->client_id,
	                 "attachment", (json_int_t)a->id, "pid", a->pid, "lag", (json_int_t)pl->held_lag,
	                 "idle_s", (double)(uv_now(pl->eng->loop) - a->slow_since) / 1000.0);
}
