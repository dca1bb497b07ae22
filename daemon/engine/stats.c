/* SPDX-License-Identifier: MIT */
/* stats - rates, data stalls and what limits a pipeline (stall accounting)
 *
 * Counters grow on the batch path at the cost of a few additions: a
 * pipeline's when a batch is built (job_done()), an attachment's when a
 * batch is leased (deliver.c) and when its trainer reports how long it
 * waited inside ldr_next() and how long it computed between calls
 * (TrainerStats, in the attachment's batch ring, read when shown and at
 * each snapshot, or carried by the Next and Release requests libloader
 * sends anyway). Once a second a timer copies them into a ring of snapshots; the
 * status JSON's rates, wait fraction and wait percentiles are the difference
 * between now and the oldest snapshot, so they cover the last STATS_WINDOW_S
 * seconds and cost nothing while nobody asks.
 */

#include "engine-private.h"
#include "pyworkers.h"

#define STATS_TICK_MS 1000

static const char *const stage_names[STAGES] = {
	[STAGE_READ] = "read", [STAGE_DECODE] = "decode",
	[STAGE_TRANSFORM] = "transform", [STAGE_COLLATE] = "collate",
};

/* --- snapshots ----------------------------------------------------------- */

static void on_stats_tick(uv_timer_t *t);

static void stats_timer_arm(struct engine *eng)
{
	if (eng->shutdown || eng->stats_timer)
		return;
	uv_timer_t *t = calloc(1, sizeof(*t));
	if (!t || uv_timer_init(eng->loop, t) < 0) {
		free(t);
		log_err("no timer for the statistics: rates in status stay empty");
		return;
	}
	t->data = eng;
	eng->stats_timer = t;
	uv_timer_start(t, on_stats_tick, STATS_TICK_MS, STATS_TICK_MS);
	/* it never keeps the loop running: a stop that leaves stuck workers
	 * behind does not close it (engine_free()) */
	uv_unref((uv_handle_t *)t);
}

static void att_snapshot(struct attachment *a, uint64_t now)
{
	struct att_counts *c = &a->st_snap[a->st_head];

	*c = a->st;
	c->ms = now;
	c->batches = a->delivered;
	a->st_head = (a->st_head + 1) % STATS_SNAPS;
	if (a->st_nsnap < STATS_SNAPS)
		a->st_nsnap++;
}

static void pipeline_snapshot(struct pipeline *pl, uint64_t now)
{
	struct pl_counts *c = &pl->st_snap[pl->st_head];

	*c = pl->st;
	c->ms = now;
	pl->st_head = (pl->st_head + 1) % STATS_SNAPS;
	if (pl->st_nsnap < STATS_SNAPS)
		pl->st_nsnap++;
}

void engine_stats_pull(struct engine *eng)
{
	struct trainer_stats st;
	uint64_t buckets[WAIT_BUCKETS];

	for (struct attachment *a = eng->atts; a; a = a->all_next)
		if (attring_stats(a, &st, buckets))
			stats_report(a, &st);
}

static void on_stats_tick(uv_timer_t *t)
{
	struct engine *eng = t->data;
	uint64_t now = uv_now(eng->loop);

	engine_stats_pull(eng);
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		pipeline_snapshot(pl, now);
	for (struct attachment *a = eng->atts; a; a = a->all_next)
		att_snapshot(a, now);
}

static void stats_timer_closed(uv_handle_t *h)
{
	free(h);
}

void stats_close(struct engine *eng)
{
	if (eng->stats_timer) {
		uv_close((uv_handle_t *)eng->stats_timer, stats_timer_closed);
		eng->stats_timer = NULL;
	}
}

void stats_att_init(struct attachment *a)
{
	a->st = (struct att_counts){ 0 };
	a->st_nsnap = a->st_head = 0;
	a->st_born_ms = uv_now(a->eng->loop);
	att_snapshot(a, uv_now(a->eng->loop));
	stats_timer_arm(a->eng);
}

void stats_pipeline_init(struct pipeline *pl)
{
	pipeline_snapshot(pl, uv_now(pl->eng->loop));
	stats_timer_arm(pl->eng);
}

/* The oldest snapshot: the start of the window. */
static const struct att_counts *att_base(const struct attachment *a)
{
	return &a->st_snap[a->st_nsnap < STATS_SNAPS ? 0 : a->st_head];
}

static const struct pl_counts *pipeline_base(const struct pipeline *pl)
{
	return &pl->st_snap[pl->st_nsnap < STATS_SNAPS ? 0 : pl->st_head];
}

/* --- counting ------------------------------------------------------------ */

/* Time a report may claim beyond the daemon's clock since the attach: the
 * two clocks' reads are not simultaneous. */
#define STATS_SLACK_MS 2000

/*
 * A trainer's report: totals since its attach, so each one replaces the last.
 * One that is malformed, goes backwards, claims more wait and compute than
 * the time since the attach, or has a figure JSON and Prometheus cannot show
 * (above INT64_MAX) is ignored and counted: a buggy or hostile client can
 * only blur its own figures, not make a shared pipeline look starved.
 */
void stats_report(struct attachment *a, const struct trainer_stats *st)
{
	struct att_counts *c = &a->st;
	uint64_t calls = 0, most_ns = (uv_now(a->eng->loop) - a->st_born_ms + STATS_SLACK_MS) * 1000000u;

	if (st->nbuckets != WAIT_BUCKETS || st->wait_ns < c->wait_ns ||
	    st->compute_ns < c->compute_ns || st->calls < c->calls || st->calls > INT64_MAX ||
	    st->wait_ns > most_ns || st->compute_ns > most_ns - st->wait_ns)
		goto bad;
	for (size_t i = 0; i < WAIT_BUCKETS; i++) {
		if (st->buckets[i] < c->buckets[i] || __builtin_add_overflow(calls, st->buckets[i], &calls))
			goto bad;
	}
	if (calls != st->calls)
		goto bad;
	c->wait_ns = st->wait_ns;
	c->compute_ns = st->compute_ns;
	c->calls = st->calls;
	memcpy(c->buckets, st->buckets, sizeof(c->buckets));
	a->st_reported = true;
	return;
bad:
	a->st_bad_reports++;
}

void stats_job_done(struct job *job)
{
	struct pipeline *pl = job->pl;

	pl->st.batches++;
	pl->st.samples += job->rows;
	pl->st.bytes += (uint64_t)job->rows * pl->row_bytes;
	pl->st.worker_ns += atomic_load_explicit(&job->worker_ns, memory_order_relaxed);
	for (int i = 0; i < STAGES; i++)
		pl->st.stage_ns[i] += atomic_load_explicit(&job->stage_ns[i], memory_order_relaxed);
}

uint64_t stats_task_time(struct job *job, uint64_t begin_ns, const uint64_t *stage_ns, int rest_stage)
{
	uint64_t total = mono_ns() - begin_ns, split = 0;

	for (int i = 0; i < STAGES; i++) {
		split += stage_ns[i];
		if (stage_ns[i])
			atomic_fetch_add_explicit(&job->stage_ns[i], stage_ns[i], memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&job->worker_ns, total, memory_order_relaxed);
	if (total > split)
		atomic_fetch_add_explicit(&job->stage_ns[rest_stage], total - split,
		                          memory_order_relaxed);
	return total;
}

/* --- the JSON ------------------------------------------------------------ */

/* batches_total ... bytes_per_s of @o: totals @now, rates since @base, @secs ago */
static json_t *with_rates(json_t *o, const uint64_t now[3], const uint64_t base[3], double secs)
{
	static const char *const names[3][2] = { { "batches_total", "batches_per_s" },
		{ "samples_total", "samples_per_s" }, { "bytes_total", "bytes_per_s" } };

	for (int i = 0; o && i < 3; i++) {
		json_object_set_new(o, names[i][0], json_integer((json_int_t)now[i]));
		json_object_set_new(o, names[i][1],
		                    json_real(secs > 0 ? (double)(now[i] - base[i]) / secs : 0.0));
	}
	return o;
}

/* Seconds within which fraction @p of the waits in @d (per-bucket counts of
 * @n waits) ended, interpolated inside its bucket; the last bucket has no
 * upper bound, so it answers its lower one. */
static double wait_quantile(const uint64_t *d, uint64_t n, double p)
{
	double target = p * (double)n, cum = 0;

	for (int i = 0; i < WAIT_BUCKETS; i++) {
		double lo = i ? (double)wait_bucket_bound_ns[i - 1] : 0;
		if (!d[i])
			continue;
		if (cum + (double)d[i] >= target) {
			if (i == WAIT_BUCKETS - 1)
				return lo / 1e9;
			double hi = (double)wait_bucket_bound_ns[i];
			return (lo + (hi - lo) * (target - cum) / (double)d[i]) / 1e9;
		}
		cum += (double)d[i];
	}
	return (double)wait_bucket_bound_ns[WAIT_BUCKETS - 2] / 1e9;
}

/* Batches of its stream ready for @a that it was not given yet. */
uint64_t stats_att_lag(const struct attachment *a)
{
	const struct stream *s = a->stream;
	uint64_t from, n = 0;

	if (!s)
		return 0;
	from = a->mode == LDR_MODE_DYNAMIC ? s->cursor : a->cursor;
	for (uint32_t i = 0; i < s->ring_len; i++) {
		const struct batch *b = &s->ring[(s->ring_head + i) % s->pl->nslots];
		if (b->seq >= from && b->ready)
			n++;
	}
	if (a->mode == LDR_MODE_DYNAMIC)
		n += s->nreturned;
	return n;
}

json_t *stats_att_json(const struct attachment *a)
{
	const struct att_counts *b = att_base(a), *c = &a->st;
	uint64_t now = uv_now(a->eng->loop), calls = c->calls - b->calls;
	double secs = (double)(now - b->ms) / 1000.0;
	uint64_t dwait = c->wait_ns - b->wait_ns, dbusy = dwait + (c->compute_ns - b->compute_ns);
	uint64_t d[WAIT_BUCKETS];
	json_t *le = json_array(), *counts = json_array();
	uint64_t lag = stats_att_lag(a);

	for (int i = 0; i < WAIT_BUCKETS; i++) {
		d[i] = c->buckets[i] - b->buckets[i];
		if (i < WAIT_BUCKETS - 1)
			json_array_append_new(le, json_real((double)wait_bucket_bound_ns[i] / 1e9));
		json_array_append_new(counts, json_integer((json_int_t)c->buckets[i]));
	}
	json_t *o = json_pack("{s:o, s:o, s:o, s:f, s:f, s:I, s:{s:o, s:o, s:f, s:I}, s:I, s:b, s:I}",
		"wait_fraction", dbusy ? json_real((double)dwait / (double)dbusy) : json_null(),
		"wait_p50_s", calls ? json_real(wait_quantile(d, calls, 0.5)) : json_null(),
		"wait_p99_s", calls ? json_real(wait_quantile(d, calls, 0.99)) : json_null(),
		"wait_seconds_total", (double)c->wait_ns / 1e9,
		"compute_seconds_total", (double)c->compute_ns / 1e9,
		"next_calls_total", (json_int_t)c->calls,
		"wait_histogram",
			"le", le,
			"counts", counts,
			"sum_s", (double)c->wait_ns / 1e9,
			"count", (json_int_t)c->calls,
		"lag_batches", (json_int_t)lag,
		/* a request parked: nothing may be delivered to it now, none built
		 * for it or all held back (min_clients, a revoke, a slow peer) */
		"starving", att_waiting(a) > 0,
		"bad_reports", (json_int_t)a->st_bad_reports);
	return with_rates(o, (const uint64_t[3]){ a->delivered, c->samples, c->bytes },
	                  (const uint64_t[3]){ b->batches, b->samples, b->bytes }, secs);
}

/* The busiest fraction among @pl's attached clients' waits, or -1 when none
 * has reported over the window. */
static double clients_wait(const struct pipeline *pl, bool *starving)
{
	double worst = -1;

	*starving = false;
	for (const struct stream *s = pl->streams; s; s = s->next)
		for (const struct attachment *a = s->atts; a; a = a->next) {
			const struct att_counts *b = att_base(a), *c = &a->st;
			uint64_t dwait = c->wait_ns - b->wait_ns;
			uint64_t dbusy = dwait + (c->compute_ns - b->compute_ns);
			if (att_waiting(a) > 0 && stats_att_lag(a) == 0 && !a->revoking)
				*starving = true;
			if (dbusy && (double)dwait / (double)dbusy > worst)
				worst = (double)dwait / (double)dbusy;
		}
	return worst;
}

/* The attachment of @pl with the most batches ready and not yet read, when
 * some has: the one a broadcast stream waits for. */
static const struct attachment *laggard(const struct pipeline *pl)
{
	const struct attachment *worst = NULL;
	uint64_t most = 0;

	for (const struct stream *s = pl->streams; s; s = s->next)
		for (const struct attachment *a = s->atts; a; a = a->next) {
			uint64_t lag = stats_att_lag(a);
			if (lag > most) {
				most = lag;
				worst = a;
			}
		}
	return worst;
}

/* A trainer that waits more than this share of its time is starved of data. */
#define STARVED_WAIT 0.10
/* Workers this busy have no time to spare. */
#define BUSY_WORKERS 0.70

/*
 * What limits @pl, in one word and one sentence (docs/operations.md,
 * "What limits a pipeline"): its consumers when no trainer waits for data;
 * else the stage that holds the production back: slots all taken (leased or
 * ready for a trainer that lags: a larger prefetch or a faster trainer
 * helps), I/O when the workers are busy mostly reading, the workers when they
 * are busy building.
 */
/* @pl's batches parked as the store did not answer (stream.c). */
static uint64_t store_outage(const struct pipeline *pl)
{
	uint64_t n = 0;

	for (const struct stream *s = pl->streams; s; s = s->next)
		n += s->outage_parked;
	return n;
}

static const char *limited_by(const struct pipeline *pl, const char *state, double busy,
                              double pool_busy, double read_share, uint32_t free_slots,
                              char *why, size_t len)
{
	bool starving;
	double wait = clients_wait(pl, &starving);

	if (!strcmp(state, "failed") || !strcmp(state, "starting") || !strcmp(state, "done")) {
		snprintf(why, len, "the pipeline is %s", state);
		return state;
	}
	if (!pl->natts) {
		snprintf(why, len, "no client is attached");
		return "idle";
	}
	if (wait < STARVED_WAIT && !starving) {
		if (wait < 0)
			snprintf(why, len, "no trainer has reported its waits yet");
		else
			snprintf(why, len, "its trainers wait %.0f %% of their time at most: "
			         "the data is ready before they ask", wait * 100);
		return "consumers";
	}
	if (store_outage(pl) && source_store_endpoint(pl->src)) {
		/* batches parked as the store did not answer (stream.c, job_park()) */
		snprintf(why, len, "%" PRIu64 " batches wait for the store %s, which does not answer: "
		         "tried again every 30 s at most (store.stream.parked; store.parked when read "
		         "by range)", store_outage(pl),
		         source_store_endpoint(pl->src));
		return "io";
	}
	if (wait < 0) {
		/* starving, before any report */
		snprintf(why, len, "a trainer asks and no batch is ready yet (workers %.0f %% busy)",
		         busy * 100);
		return busy >= BUSY_WORKERS || pool_busy >= BUSY_WORKERS ? "workers" : "starting";
	}
	if (free_slots == 0 && pl->jobs == 0) {
		const struct attachment *lags = laggard(pl);
		if (lags) {
			snprintf(why, len, "a trainer waits %.0f %% of its time while every slot is "
			         "taken by batches client %" PRIu64 " (pid %d) has not read yet: "
			         "it is the slowest", wait * 100, lags->client_id, lags->pid);
			return "consumers";
		}
		snprintf(why, len, "a trainer waits %.0f %% of its time while every slot is leased: "
		         "a larger prefetch (or fewer batches held) lets the workers build ahead",
		         wait * 100);
		return "slots";
	}
	if (busy >= BUSY_WORKERS && read_share >= 0.5 && source_store_endpoint(pl->src)) {
		/* a stream of objects (docs/storage.md): the reads wait for the store */
		snprintf(why, len, "a trainer waits %.0f %% of its time while the workers are "
		         "%.0f %% busy, %.0f %% of it reading: objects from the store %s are "
		         "fetched slower than they are read", wait * 100, busy * 100,
		         read_share * 100, source_store_endpoint(pl->src));
		return "io";
	}
	if (busy >= BUSY_WORKERS && read_share >= 0.5) {
		snprintf(why, len, "a trainer waits %.0f %% of its time while the workers are "
		         "%.0f %% busy, %.0f %% of it reading files", wait * 100, busy * 100,
		         read_share * 100);
		return "io";
	}
	if (busy >= BUSY_WORKERS || pool_busy >= BUSY_WORKERS) {
		snprintf(why, len, "a trainer waits %.0f %% of its time while the workers are "
		         "%.0f %% busy%s: more workers or a lighter spec", wait * 100,
		         (busy >= BUSY_WORKERS ? busy : pool_busy) * 100,
		         busy >= BUSY_WORKERS ? "" : " (with other pipelines)");
		return "workers";
	}
	snprintf(why, len, "a trainer waits %.0f %% of its time while the workers are %.0f %% "
	         "busy: each batch takes long to build (latency, not throughput)",
	         wait * 100, busy * 100);
	return "workers";
}

/* Worker seconds per second all pipelines spent over their windows, as a
 * fraction of the daemon's pool. */
static double pool_busy(const struct engine *eng)
{
	double used = 0;
	unsigned n = workers_count(eng->workers);

	for (const struct pipeline *pl = eng->pipelines; pl; pl = pl->next) {
		const struct pl_counts *b = pipeline_base(pl);
		uint64_t ms = uv_now(eng->loop) - b->ms;
		if (!pl->py && ms)
			used += (double)(pl->st.worker_ns - b->worker_ns) / ((double)ms * 1e6);
	}
	return n ? used / n : 0;
}

json_t *stats_pipeline_json(const struct pipeline *pl, const char *state)
{
	const struct pl_counts *b = pipeline_base(pl), *c = &pl->st;
	uint64_t now = uv_now(pl->eng->loop);
	double secs = (double)(now - b->ms) / 1000.0;
	unsigned pool = pl->py ? pyw_nworkers(pl) : workers_count(pl->eng->workers);
	uint64_t dworker = c->worker_ns - b->worker_ns, dsamples = c->samples - b->samples;
	double busy = secs > 0 && pool ? (double)dworker / (secs * 1e9 * pool) : 0;
	uint64_t dread = c->stage_ns[STAGE_READ] - b->stage_ns[STAGE_READ];
	uint32_t in_use = 0, leased = 0, ready;
	json_t *stage_tot = json_object(), *stage_mean = json_object();
	char why[256];

	for (uint32_t i = 0; i < pl->nslots; i++) {
		in_use += pl->slots[i].refs > 0;
		leased += pl->slots[i].leases > 0;
	}
	ready = in_use > leased + pl->jobs ? in_use - leased - pl->jobs : 0;
	for (int i = 0; i < STAGES; i++) {
		uint64_t d = c->stage_ns[i] - b->stage_ns[i];
		json_object_set_new(stage_tot, stage_names[i], json_real((double)c->stage_ns[i] / 1e9));
		json_object_set_new(stage_mean, stage_names[i],
		                    dsamples ? json_real((double)d / 1e9 / (double)dsamples) : json_null());
	}
	const char *lim = limited_by(pl, state, busy, pl->py ? busy : pool_busy(pl->eng),
	                             dworker ? (double)dread / (double)dworker : 0, pl->nfree,
	                             why, sizeof(why));
	json_t *o = json_pack("{s:i, s:f, s:f, s:i, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
		"window_s", STATS_WINDOW_S,
		"worker_seconds_total", (double)c->worker_ns / 1e9,
		"workers_busy", busy > 1 ? 1.0 : busy,
		"workers", (int)pool,
		"stage_seconds_total", stage_tot,
		"sample_seconds", stage_mean,
		"jobs", (json_int_t)pl->jobs,
		"slots_ready", (json_int_t)ready,
		"slots_leased", (json_int_t)leased,
		"slots_free", (json_int_t)pl->nfree,
		"errors_total", (json_int_t)pl->job_errors,
		"skipped_total", (json_int_t)source_skipped(pl->src),
		"limited_by", lim,
		"limited_why", why);
	return with_rates(o, (const uint64_t[3]){ c->batches, c->samples, c->bytes },
	                  (const uint64_t[3]){ b->batches, b->samples, b->bytes }, secs);
}
