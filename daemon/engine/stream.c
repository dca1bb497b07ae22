/* SPDX-License-Identifier: MIT */
/* stream - a stream's ring of batches and their production by the workers
 *
 * A stream is one sequence of batches drawn from a pipeline's slots (see
 * sched.c for how many it may hold). Batches are produced in order into the
 * ring; workers fill them in any order, and a batch becomes ready when its
 * job completes on the loop thread. A slot counts one reference for the ring
 * and one per lease; it goes back to the pool when none is left
 * (slot_unref(), engine-private.h). The slots a stream may hold, its quota,
 * are reckoned here too, by sched.c's rule.
 */
#include "engine-private.h"
#include "pyworkers.h"

struct batch *ring_at(struct stream *s, uint64_t seq)
{
	if (seq < s->head_seq || seq - s->head_seq >= s->ring_len)
		return NULL;
	return &s->ring[(s->ring_head + (seq - s->head_seq)) % s->pl->nslots];
}

void stream_maybe_free(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct stream **pp;

	if (s->dead && s->parked)
		stream_unpark(s); /* they end now: their batches are not wanted */
	if (!s->dead || s->jobs || s->slots_held)
		return;
	for (pp = &pl->streams; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	stream_free(s);
}

void stream_free(struct stream *s)
{
	/* refused jobs still aside: only when the daemon stops (the workers
	 * are gone), as stream_maybe_free() ran them again otherwise */
	while (s->parked) {
		struct job *job = s->parked;

		s->parked = job->park_next;
		job_free(job);
	}
	for (uint32_t i = 0; i < s->ring_len; i++)
		free(s->ring[(s->ring_head + i) % s->pl->nslots].errmsg);
	free(s->ring);
	free(s->returned);
	order_free(s);
	free(s);
}

/* @b's slots go back (the ring's references). */
void batch_unref(struct pipeline *pl, struct batch *b)
{
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++) {
		struct slot *slot = batch_slot(b, g);
		if (slot)
			slot_unref(pl, slot);
	}
	b->slot = NULL;
	memset(b->more, 0, sizeof(b->more));
	free(b->errmsg);
	b->errmsg = NULL;
	b->failed = false;
}

bool batch_leased(const struct batch *b)
{
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++) {
		const struct slot *slot = batch_slot(b, g);
		if (slot && slot->leases)
			return true;
	}
	return false;
}

void ring_pop_head(struct stream *s)
{
	struct batch *b = &s->ring[s->ring_head];

	s->ring_head = (s->ring_head + 1) % s->pl->nslots;
	s->ring_len--;
	s->head_seq++;
	batch_unref(s->pl, b);
}

/* --- quotas: the numbers of sched.c's rule, which deliver.c and slow.c
 * read too ---------------------------------------------------------------- */

uint32_t pipeline_active_streams(const struct pipeline *pl)
{
	uint32_t n = 0;

	for (const struct stream *s = pl->streams; s; s = s->next)
		if (!s->dead && s->natts)
			n++;
	return n;
}

/* Slots @s may hold: an equal part of the prefetch (the slab's slots, or
 * fewer after `loaderctl set prefetch`) for each active stream, the
 * remainder to the oldest streams; a stream nobody reads prefetches only while no other
 * stream is read. */
uint32_t stream_quota(const struct stream *s)
{
	const struct pipeline *pl = s->pl;
	uint32_t n = 0, older = 0;

	if (s->dead)
		return 0;
	for (const struct stream *t = pl->streams; t; t = t->next)
		if (!t->dead && t->natts) {
			n++;
			if (t->order < s->order)
				older++;
		}
	if (!s->natts)
		return n ? 0 : pl->prefetch;
	return pl->prefetch / n + (older < pl->prefetch % n ? 1 : 0);
}

uint32_t att_share(const struct attachment *a)
{
	const struct stream *s = a->stream;
	uint32_t q;

	if (!s)
		return 0;
	q = stream_quota(s);
	if (s->mode == LDR_MODE_DYNAMIC && s->natts > 1)
		q /= s->natts;
	/* each batch takes a slot per seed group: a client holds batches */
	q /= stream_batch_slots(s);
	return q ? q : 1;
}

/* --- building ----------------------------------------------------------- */

/* Is seed group @g of @s read? By a client of it, or group 0 by a stream
 * without clients, which builds for it alone (stream_start_batch). */
static bool group_read(const struct stream *s, uint32_t g)
{
	return s->groups[g].natts || (!g && !s->natts);
}

/* Ready @b gives back its slots of the seed groups nobody reads (a lease
 * keeps its own reference: the slot goes back when it is released). */
static void batch_drop_unread(struct stream *s, struct batch *b)
{
	for (uint32_t g = 0; g < s->ngroups; g++) {
		struct slot *slot = batch_slot(b, g);
		if (!slot || group_read(s, g))
			continue;
		slot_unref(s->pl, slot);
		if (g)
			b->more[g - 1] = NULL;
		else
			b->slot = NULL;
	}
}

static bool batch_empty(const struct batch *b)
{
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++)
		if (batch_slot(b, g))
			return false;
	return true;
}

void stream_drop_unread(struct stream *s)
{
	uint64_t min_cursor = UINT64_MAX;

	for (uint32_t i = 0; i < s->ring_len; i++) {
		struct batch *b = &s->ring[(s->ring_head + i) % s->pl->nslots];
		if (b->ready)
			batch_drop_unread(s, b);
	}
	/* a batch left with no slot was read by none of the groups read now:
	 * they start after it (their slots are the ring's newest batches) */
	for (const struct attachment *a = s->atts; a; a = a->next)
		if (a->cursor < min_cursor)
			min_cursor = a->cursor;
	while (s->ring_len && s->ring[s->ring_head].ready && batch_empty(&s->ring[s->ring_head]) &&
	       s->head_seq < min_cursor)
		ring_pop_head(s);
}

uint32_t stream_batch_slots(const struct stream *s)
{
	uint32_t n = 0;

	for (uint32_t g = 0; g < s->ngroups; g++)
		n += s->groups[g].natts > 0;
	return n ? n : 1;
}
/* --- workers ------------------------------------------------------------ */

static uint64_t order_sample(const void *arg, uint64_t epoch, uint64_t batch, uint32_t row)
{
	return sampler_sample(arg, epoch, batch, row);
}

static uint32_t order_rows(const void *arg, uint64_t epoch, uint64_t batch)
{
	return sampler_epoch_rows(arg, epoch, batch);
}

/* The places of row @r of @job in its batch (and its augment seeds'). */
static void row_dsts(const struct job *job, uint32_t r, void **dsts, void **more)
{
	const struct pipeline *pl = job->pl;

	for (size_t f = 0; f < pl->nfields; f++) {
		uint64_t off = pl->field_off[f] + (uint64_t)r * pl->fields[f].sample_bytes;
		dsts[f] = job->base + off;
		for (uint32_t g = 0; g < job->nmore; g++)
			more[g * pl->nfields + f] = job->more_base[g] + off;
	}
}

/* A source read by range: the task's rows read once to note their ranges,
 * which are then GOT at once while the rows are read (source.h). */
static bool task_read_ahead(struct task *t, const struct sample_ctx *ctx, void **dsts, void **more)
{
	struct job *job = t->job;
	char err[512];

	if (t->end - t->begin < 2 || !source_ahead_wanted(job->pl->src))
		return false;
	source_ahead_record();
	for (uint32_t r = t->begin; r < t->end; r++) {
		row_dsts(job, r, dsts, more);
		(void)source_read(job->pl->src, ctx, job_sample(job, r), dsts, err, sizeof(err));
	}
	source_ahead_start();
	return true;
}

static void task_run(struct work *work)
{
	struct task *t = (struct task *)work;
	struct job *job = t->job;
	struct pipeline *pl = job->pl;
	void *dsts[SOURCE_MAX_FIELDS], *more[(AUG_GROUPS_MAX - 1) * SOURCE_MAX_FIELDS];
	uint64_t stage_ns[STAGES] = { 0 }, begin = mono_ns();
	struct sample_ctx ctx = { .seed = job->seeds[0], .epoch = job->epoch, .stage_ns = stage_ns,
		.nmore = job->nmore, .more_seeds = job->seeds + 1, .more_dsts = more };
	struct sample_order order = { .sample = order_sample, .rows = order_rows,
		.arg = &job->stream->sampler, .arg_size = sizeof(job->stream->sampler) };
	char err[512];
	bool ahead;

	source_read_refused_clear();
	if (!job->idx) {
		/* what a source fetching ahead follows (objects.c) */
		order.batches = sampler_batches_per_epoch(&job->stream->sampler);
		if (job->stream->end_seq != UINT64_MAX && order.batches)
			order.epochs = (job->stream->end_seq + order.batches - 1) / order.batches;
		ctx.order = &order;
		ctx.batch = job->index;
	}

	ahead = task_read_ahead(t, &ctx, dsts, more);
	for (uint32_t r = t->begin; r < t->end && !atomic_load(&job->err); r++) {
		uint64_t idx = job_sample(job, r);
		int rc;

		row_dsts(job, r, dsts, more);
		rc = source_read(pl->src, &ctx, idx, dsts, err, sizeof(err));
		if (rc < 0) {
			int why = source_read_why();

			/* the store's doing, not the data's (job_park()) */
			if ((why == SOURCE_READ_KEYS && rc == -EACCES) || why == SOURCE_READ_STORE)
				atomic_store(&job->why, why);
			job_set_error(job, -rc, err);
			break;
		}
	}
	if (ahead)
		source_ahead_end();
	/* before the completion below: the pipeline may go once its job is done */
	workers_queue_cost(&pl->queue, stats_task_time(job, begin, stage_ns, STAGE_READ));
	if (atomic_fetch_sub(&job->remaining, 1) == 1) {
		struct engine *eng = job->eng;
		pthread_mutex_lock(&eng->done_lock);
		job->done_next = eng->done_head;
		eng->done_head = job;
		pthread_mutex_unlock(&eng->done_lock);
		uv_async_send(&eng->async);
	}
}

/* The lowest cursor of each seed group's broadcast clients into @mins
 * (UINT64_MAX: none), so that a group's slot is built only for a batch one
 * of its clients has still to receive (sched.c gives back the slots of a
 * broadcast stream above its quota, received or not). Other streams: 0. */
static void group_cursors(const struct stream *s, uint64_t mins[AUG_GROUPS_MAX])
{
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++)
		mins[g] = s->mode == LDR_MODE_BROADCAST ? UINT64_MAX : 0;
	if (s->mode != LDR_MODE_BROADCAST)
		return;
	for (const struct attachment *a = s->atts; a; a = a->next)
		if (a->cursor < mins[a->group])
			mins[a->group] = a->cursor;
}

/* Does seed group @g need a slot in the batch at @seq, which has none? */
static bool group_wants(const struct stream *s, const uint64_t *mins, uint32_t g, uint64_t seq)
{
	if (!s->natts)
		return !g;   /* a stream without clients builds for its own seed */
	return s->groups[g].natts && mins[g] <= seq;
}

/* The slots the batch at @seq needs for the groups @b (NULL: a new batch)
 * has none of. */
static uint32_t batch_missing(const struct stream *s, const uint64_t *mins, const struct batch *b,
                              uint64_t seq)
{
	uint32_t n = 0;

	for (uint32_t g = 0; g < s->ngroups; g++)
		n += (!b || !batch_slot(b, g)) && group_wants(s, mins, g, seq);
	return n;
}

uint32_t stream_next_build(const struct stream *s, struct batch **refill)
{
	uint64_t mins[AUG_GROUPS_MAX];
	uint32_t n;

	*refill = NULL;
	group_cursors(s, mins);
	/* a ready batch whose slot of a group was given back, that a client of
	 * the group has still to receive: the oldest first */
	if (s->mode == LDR_MODE_BROADCAST)
		for (uint32_t i = 0; i < s->ring_len; i++) {
			struct batch *b = &s->ring[(s->ring_head + i) % s->pl->nslots];
			if (b->ready && !b->failed && (n = batch_missing(s, mins, b, b->seq))) {
				*refill = b;
				return n;
			}
		}
	if (s->next_produce >= s->end_seq || s->ring_len >= s->pl->nslots)
		return UINT32_MAX;
	/* a client's order: only the batches whose order has come */
	if (s->client_order && s->next_produce >= order_end(s))
		return UINT32_MAX;
	return batch_missing(s, mins, NULL, s->next_produce);
}

int stream_start_batch(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct engine *eng = pl->eng;
	unsigned nworkers = workers_count(eng->workers);
	struct batch *b, *refill;
	const struct order_batch *ob = NULL;
	struct slot *slot;
	struct job *job;
	uint32_t rows, ntasks;
	uint64_t seq = s->next_produce, mins[AUG_GROUPS_MAX];

	if (stream_next_build(s, &refill) == UINT32_MAX)
		return 0;
	if (refill)
		seq = refill->seq;
	group_cursors(s, mins);
	if (s->client_order) {
		if (!(ob = order_at(s, seq)))
			return -EPROTO; /* kept until past the ring's head: not reached */
		rows = ob->rows;
	} else {
		rows = sampler_epoch_rows(&s->sampler, seq / s->bpe, seq % s->bpe);
	}
	/* Several batches are in flight anyway; split one only when it is big
	 * enough to pay for the extra wake-ups (they cost more than small copies). */
	ntasks = (uint32_t)(((uint64_t)rows * pl->row_bytes + TASK_MIN_BYTES - 1) / TASK_MIN_BYTES);
	if (pl->py)
		/* Python workers: one task per worker, or the whole batch for a collate_fn */
		ntasks = pl->spec->source.py_collate ? 1 : pyw_nworkers(pl);
	if (ntasks > nworkers && !pl->py)
		ntasks = nworkers;
	if (ntasks > rows)
		ntasks = rows;
	if (ntasks == 0)
		ntasks = 1;
	/* a client's order: the job's copy of the indices, which the loop
	 * thread may move while the workers read */
	job = calloc(1, sizeof(*job) + ntasks * sizeof(job->tasks[0]) +
	                (ob ? rows * sizeof(uint64_t) : 0));
	if (!job)
		return -ENOMEM;
	if (ob) {
		uint64_t *idx = (uint64_t *)&job->tasks[ntasks];
		memcpy(idx, order_indices(s, ob), rows * sizeof(*idx));
		job->idx = idx;
	}

	if (refill) {
		b = refill;
	} else {
		b = &s->ring[(s->ring_head + s->ring_len) % pl->nslots];
		b->slot = NULL;
		memset(b->more, 0, sizeof(b->more));
		b->failed = false;
		b->errmsg = NULL;
	}
	/* a slot for each seed group that reads it and has none (group 0 alone
	 * in a stream without clients), the first one's the job's base */
	for (uint32_t g = 0; g < s->ngroups; g++) {
		if (batch_slot(b, g) || !group_wants(s, mins, g, seq))
			continue;
		slot = &pl->slots[pl->free_slots[--pl->nfree]];
		for (struct devcopy *dc = pl->devs; dc; dc = dc->next)
			dc->state[slot->idx] = DEV_NONE;
		slot->refs = 1;
		slot->owner = s;
		s->slots_held++;
		if (g)
			b->more[g - 1] = slot;
		else
			b->slot = slot;
		uint8_t *base = pl->slab->base + (uint64_t)slot->idx * pl->slot_bytes;
		if (!job->base) {
			job->base = base;
			job->seeds[0] = s->groups[g].seed;
		} else {
			job->more_base[job->nmore] = base;
			job->seeds[++job->nmore] = s->groups[g].seed;
		}
	}
	b->ready = false;
	if (!refill) {
		if (s->ring_len == 0)
			s->head_seq = seq;
		s->ring_len++;
		b->seq = seq;
		b->epoch = ob ? ob->epoch : seq / s->bpe;
		b->index = ob ? ob->index : seq % s->bpe;
		b->rows = rows;
		s->next_produce++;
	}
	if (!job->base) {
		/* every client of the stream has it (sched.c gave its slots back
		 * after they received it): a place in the ring, nothing to build */
		b->ready = true;
		job_free(job);
		return 0;
	}
	s->jobs++;
	pl->jobs++;

	job->eng = eng;
	job->pl = pl;
	job->stream = s;
	job->keys_gen = pl->keys_gen;
	job->seq = seq;
	job->epoch = b->epoch;
	job->index = b->index;
	job->rows = rows;
	job->ntasks = ntasks;
	atomic_init(&job->remaining, ntasks);
	atomic_init(&job->err, 0);
	for (uint32_t i = 0; i < ntasks; i++) {
		job->tasks[i].work.fn = task_run;
		job->tasks[i].work.queue = &pl->queue;
		job->tasks[i].job = job;
		job->tasks[i].begin = (uint32_t)((uint64_t)rows * i / ntasks);
		job->tasks[i].end = (uint32_t)((uint64_t)rows * (i + 1) / ntasks);
	}
	if (pl->py) {
		pyw_submit(job);
		return 0;
	}
	for (uint32_t i = 0; i < ntasks; i++)
		workers_submit(eng->workers, &job->tasks[i].work);
	return 0;
}

/* The first line of @msg as the pipeline's last batch error (status), cut
 * at a character's boundary (it goes out as JSON). */
static void last_error_set(struct pipeline *pl, const char *msg)
{
	size_t n = strcspn(msg, "\n"), cap = sizeof(pl->last_batch_error) - 1;

	if (n > cap) {
		n = cap;
		while (n && ((unsigned char)msg[n] & 0xc0) == 0x80)
			n--;   /* within a UTF-8 sequence: before its lead byte */
	}
	memcpy(pl->last_batch_error, msg, n);
	pl->last_batch_error[n] = '\0';
}

/* A store that does not answer: a parked job tries again after 1 s,
 * doubling to 30 s (the store retried each try for retry_seconds already). */
#define OUTAGE_BACKOFF_MS 1000
#define OUTAGE_BACKOFF_MAX_MS 30000
#define OUTAGE_TICK_MS 250

static void outage_timer_arm(struct engine *eng);

/*
 * @job read an object the store refused for the pipeline's keys, or that the
 * store did not give (its retries spent: 5xx, 429, a stall, no connection;
 * source.h, source_read_why()): no error of the data, so neither on_error
 * nor a failed pipeline. Its batch stays in the ring, unready, with its
 * slots; the job waits in @s->parked, counted in the jobs, until fresh keys
 * come (engine_set_store()), or for the store its backoff is over
 * (stream_retry_due(), from the engine's outage timer), when it runs again and
 * builds the same batch. A client that reaches a batch refused for the keys
 * is told the store's words once (deliver.c); one that reaches a batch
 * waiting for the store waits, as for a slow store. Keys handed while it
 * read: it runs again at once.
 */
static void job_park(struct job *job, struct batch *b, int why)
{
	struct stream *s = job->stream;
	struct pipeline *pl = job->pl;
	uint64_t now = uv_now(pl->eng->loop);

	s->jobs++;
	pl->jobs++;
	free(b->errmsg);
	b->errmsg = job->errmsg ? job->errmsg : strdup(strerror(atomic_load(&job->err)));
	job->errmsg = NULL;
	b->refused = why == SOURCE_READ_KEYS;
	b->outage = why == SOURCE_READ_STORE;
	b->parks++;
	job->park_next = s->parked;
	s->parked = job;
	if (b->outage) {
		uint32_t n = job->outage_tries < 5 ? job->outage_tries : 5;
		uint64_t wait = (uint64_t)OUTAGE_BACKOFF_MS << n;

		if (wait > OUTAGE_BACKOFF_MAX_MS)
			wait = OUTAGE_BACKOFF_MAX_MS;
		if (!job->outage_ms)
			job->outage_ms = now ? now : 1;
		job->outage_tries++;
		job->retry_ms = now + wait;
		s->outage_parked++;
		outage_timer_arm(pl->eng);
		if (job->outage_tries == 1)
			log_warn("pipeline %s: batch %" PRIu64 " of epoch %" PRIu64 " waits for the store, tried "
			         "again every %g s at most: %s", pl->spec->name, b->index, b->epoch,
			         OUTAGE_BACKOFF_MAX_MS / 1000.0, b->errmsg ? b->errmsg : "");
		return;
	}
	if (b->parks == 1)
		log_warn("pipeline %s: batch %" PRIu64 " of epoch %" PRIu64 " waits for fresh store credentials: %s",
		         pl->spec->name, b->index, b->epoch, b->errmsg ? b->errmsg : "");
	if (job->keys_gen != pl->keys_gen)
		stream_unpark(s);
}

/* Parked @job (taken off its stream's list) built again. */
static void job_rerun(struct stream *s, struct job *job)
{
	struct pipeline *pl = s->pl;
	struct batch *b = ring_at(s, job->seq);

	job->park_next = NULL;
	if (job->retry_ms) {
		s->outage_parked--;
		job->retry_ms = 0;
	}
	if (b) {
		b->refused = false;
		b->outage = false;
		free(b->errmsg);
		b->errmsg = NULL;
	}
	free(job->errmsg);
	job->errmsg = NULL;
	job->keys_gen = pl->keys_gen;
	atomic_store(&job->why, 0);
	atomic_store(&job->err, 0);
	atomic_store(&job->remaining, job->ntasks);
	for (unsigned i = 0; i < job->ntasks; i++)
		workers_submit(pl->eng->workers, &job->tasks[i].work);
}

void stream_unpark(struct stream *s)
{
	struct job *job;

	if (!s->pl->eng->workers)
		return;   /* stopping: the workers are gone */
	while ((job = s->parked)) {
		s->parked = job->park_next;
		job_rerun(s, job);
	}
}

/* The jobs of @s parked as the store did not answer whose backoff is over
 * at @now, built again; whether any is left waiting. */
static bool stream_retry_due(struct stream *s, uint64_t now)
{
	struct job **pp = &s->parked, *job;
	bool left = false;

	while ((job = *pp)) {
		struct batch *b = ring_at(s, job->seq);

		if (b && b->outage && job->retry_ms && job->retry_ms <= now) {
			*pp = job->park_next;
			job_rerun(s, job);
		} else {
			left = left || (b && b->outage);
			pp = &job->park_next;
		}
	}
	return left;
}

static void on_outage_tick(uv_timer_t *t)
{
	struct engine *eng = t->data;
	uint64_t now = uv_now(eng->loop);
	bool left = false;

	if (!eng->workers)
		return;   /* stopping: the workers are gone */
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		for (struct stream *s = pl->streams; s; s = s->next)
			if (s->parked && stream_retry_due(s, now))
				left = true;
	if (!left)
		uv_timer_stop(t);
}

/* The outage timer ticking (OUTAGE_TICK_MS) while a job waits for the store. */
static void outage_timer_arm(struct engine *eng)
{
	if (eng->shutdown)
		return;
	if (!eng->outage_timer) {
		uv_timer_t *t = calloc(1, sizeof(*t));
		if (!t || uv_timer_init(eng->loop, t) < 0) {
			free(t);
			log_err("no timer for batches waiting for the store: they wait for fresh keys or the pipeline's drop");
			return;
		}
		t->data = eng;
		eng->outage_timer = t;
	}
	if (!uv_is_active((uv_handle_t *)eng->outage_timer))
		uv_timer_start(eng->outage_timer, on_outage_tick, OUTAGE_TICK_MS, OUTAGE_TICK_MS);
}

static void outage_timer_closed(uv_handle_t *h)
{
	free(h);
}

void stream_outage_close(struct engine *eng)
{
	if (eng->outage_timer) {
		uv_close((uv_handle_t *)eng->outage_timer, outage_timer_closed);
		eng->outage_timer = NULL;
	}
}

void job_done(struct job *job)
{
	struct pipeline *pl = job->pl;
	struct stream *s = job->stream;
	int err = atomic_load(&job->err);

	s->jobs--;
	pl->jobs--;
	struct batch *b = ring_at(s, job->seq);
	bool live = !s->dead && !pl->dropped;
	int why = atomic_load(&job->why);
	if (b && err && live && why && !pl->py) {
		job_park(job, b, why);
		pl->eng->hooks->update(pl);
		return;
	}
	if (b && !err && live && job->outage_ms)
		log_info("pipeline %s: the store answers again: batch %" PRIu64 " of epoch %" PRIu64
		         " built after %" PRIu32 " tries over %.1f s", pl->spec->name, b->index, b->epoch,
		         job->outage_tries + 1, (double)(uv_now(pl->eng->loop) - job->outage_ms) / 1000.0);
	if (b && err && live && pl->spec->on_error_raise) {
		/* torch's semantics: this batch is an error at its place, for
		 * every client that reaches it; the stream goes on. Its slots go
		 * back now: nothing is delivered from them. */
		pl->job_errors++;
		pl->batch_errors++;
		last_error_set(pl, job->errmsg ? job->errmsg : strerror(err));
		batch_unref(pl, b);
		b->ready = true;
		b->failed = true;
		b->err = err;
		b->errmsg = job->errmsg ? job->errmsg : strdup(strerror(err));
		job->errmsg = NULL;
		pl->produced++;
	} else if (b && err && live) {
		/* The pipeline fails when a client reaches this batch, not now:
		 * the batches before it are delivered first, whichever job
		 * failed first (deliver.c, stream_failed()). It stays unready. */
		pl->job_errors++;
		if (job->seq < s->fail_seq) {
			s->fail_seq = job->seq;
			s->fail_err = err;
			snprintf(s->fail_msg, sizeof(s->fail_msg), "%s",
			         job->errmsg ? job->errmsg : strerror(err));
		}
	} else if (b) {
		b->ready = true;
		pl->produced++;
		stats_job_done(job);
		if (!err && live)
			stream_prefetch_devices(s, b);
		/* built for a seed group whose last client left since */
		if (s->mode == LDR_MODE_BROADCAST && !s->dead)
			stream_drop_unread(s);
	}
	job_free(job);
	if (s->dead) {
		/* release the ring's references now that no worker writes */
		while (s->ring_len && s->ring[s->ring_head].ready)
			ring_pop_head(s);
		stream_maybe_free(s);
	}
	if (pl->dropped) {
		pl->eng->hooks->maybe_free(pl);
		return;
	}
	pl->eng->hooks->update(pl);
}
struct stream *stream_new(struct pipeline *pl, int mode, uint32_t rank, uint32_t world)
{
	struct stream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->ring = calloc(pl->nslots, sizeof(*s->ring));
	if (mode == LDR_MODE_DYNAMIC)
		s->returned = calloc(pl->nslots, sizeof(*s->returned));
	if (!s->ring || (mode == LDR_MODE_DYNAMIC && !s->returned)) {
		free(s->returned);
		free(s->ring);
		free(s);
		return NULL;
	}
	s->pl = pl;
	s->mode = mode;
	s->fail_seq = UINT64_MAX;
	s->order = pl->stream_ctr++;
	s->sampler = (struct sampler){ .nsamples = source_nsamples(pl->src),
		.batch_size = pl->spec->batch_size, .shuffle = pl->spec->shuffle,
		.drop_last = pl->spec->drop_last, .seed = pl->spec->seed, .rank = rank, .world = world,
		.windows = pl->windows };
	s->groups[0].seed = pl->spec->seed;
	s->ngroups = 1;
	s->bpe = sampler_batches_per_epoch(&s->sampler);
	if (pl->spec->epochs == 0 || __builtin_mul_overflow(pl->spec->epochs, s->bpe, &s->end_seq))
		s->end_seq = UINT64_MAX;
	s->next = pl->streams;
	pl->streams = s;
	pl->nstreams++;
	return s;
}

void stream_retire(struct stream *s)
{
	struct pipeline *pl = s->pl;

	if (pl->shared[s->mode] == s)
		pl->shared[s->mode] = NULL;
	s->dead = true;
	pl->nstreams--;
	while (s->nreturned)
		slot_unref(pl, s->returned[--s->nreturned].slot);
	/* ready batches now; in-flight ones when their job ends (job_done()) */
	while (s->ring_len && s->ring[s->ring_head].ready)
		ring_pop_head(s);
	stream_maybe_free(s);
}
