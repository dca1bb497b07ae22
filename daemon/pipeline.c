/* SPDX-License-Identifier: MIT */
/* pipeline - pipelines, their streams, slots and leases
 *
 * Everything here runs on the loop thread, except the bodies of the worker
 * tasks, which only read immutable pipeline state (source, sampler, field
 * layout) and write into the one slot their job owns.
 *
 * A pipeline has a fixed pool of `prefetch` slots in one sealed memfd slab. A
 * stream is one sequence of batches drawn from it: the broadcast stream and the
 * dynamic stream are shared by their attachments; each partition attachment has
 * a stream of its own (its rank's share, from its start position). Streams
 * produce batches in order into a ring; batches are filled by the workers in any
 * order and delivered strictly in order. A slot counts one reference for the
 * ring and one per lease; it is reused only when none is left. A broadcast batch
 * leaves the ring when every attached client has received and released it, so
 * the slowest client holds the stream back (backpressure), a client that
 * attaches later starts at the oldest batch still held, and a client that
 * leaves stops holding anyone back.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common.h"
#include "cudadev.h"
#include "log.h"
#include "pipeline.h"
#include "sampler.h"
#include "slab.h"
#include "source.h"
#include "workers.h"

#define FIELD_ALIGN 256
#define SLOT_ALIGN 4096
#define TOKEN_TTL_MS 30000
#define TASK_MIN_BYTES (2u << 20)

struct slot {
	uint32_t idx;
	uint32_t refs;
	uint32_t leases;
	struct stream *owner;
};

struct batch {
	uint64_t seq;
	uint64_t epoch;
	uint64_t index;
	uint32_t rows;
	bool ready;
	struct slot *slot;
};

/* Copy states of one slot on one device. */
enum { DEV_NONE = 0, DEV_COPYING, DEV_DONE };

/* A pipeline's slots on one CUDA device: device slot i mirrors host slot i
 * (cudadev.h), so it is free exactly when the host slot is. */
struct devcopy {
	struct devcopy *next;
	struct pipeline *pl;
	int device;
	struct cuda_dslab *ds;
	uint32_t natts;           /* attachments delivered on this device */
	uint32_t inflight;        /* copies queued, each holding a slot reference */
	uint64_t copies;
	uint8_t *state;           /* per slot: DEV_NONE, DEV_COPYING, DEV_DONE */
	bool failed;
	char error[320];
};

struct copy_cookie {
	struct devcopy *dc;
	struct slot *slot;
};

struct lease {
	struct lease *next;
	uint64_t id;
	struct slot *slot;
};

struct stream {
	struct stream *next;
	struct pipeline *pl;
	int mode;
	struct sampler sampler;
	uint64_t bpe;
	uint64_t end_seq;         /* UINT64_MAX when endless */
	uint64_t next_produce;
	uint64_t cursor;          /* dynamic: next seq to hand out */
	struct batch *ring;       /* capacity pl->nslots */
	uint32_t ring_head, ring_len;
	uint64_t head_seq;
	uint32_t slots_held;
	uint32_t jobs;
	struct attachment *atts;
	uint32_t natts;
	struct pending *dyn_head, *dyn_tail;
	bool started;
	bool dead;
};

struct attachment {
	struct attachment *next;  /* in stream->atts */
	struct attachment *all_next; /* in engine->atts */
	struct engine *eng;
	struct pipeline *pl;      /* NULL once the pipeline was dropped */
	struct stream *stream;
	struct devcopy *dev;      /* CUDA delivery, NULL for host memory */
	uint64_t id;
	uint64_t client_id;
	uid_t uid;
	int mode;
	uint32_t rank, world;
	uint32_t credits;
	uint64_t start_seq;
	uint64_t cursor;
	uint64_t deliver_no;
	uint64_t delivered;
	struct pending *pend_head, *pend_tail;
	uint32_t npending;
	struct lease *leases;
	size_t nleases;
	uint8_t token[FD_TOKEN_BYTES];
	bool token_valid;
	uint64_t token_expiry;
	bool dead;                /* pipeline gone: answer with an error */
	char dead_msg[160];
};

struct pipeline {
	struct pipeline *next;
	struct engine *eng;
	struct spec *spec;
	struct source *src;
	struct slab *slab;
	uid_t owner;
	uint32_t nslots;
	uint64_t slot_bytes;
	uint64_t row_bytes;
	size_t nfields;
	uint64_t field_off[SOURCE_MAX_FIELDS];
	struct field_desc fields[SOURCE_MAX_FIELDS];
	struct slot *slots;
	uint32_t *free_slots;
	uint32_t nfree;
	struct stream *streams;
	struct stream *shared[3]; /* broadcast and dynamic streams, by mode */
	struct devcopy *devs;     /* device slabs of CUDA clients */
	bool host_pinned;         /* the slab was registered with pin_device's engine */
	int pin_device;
	uint32_t nstreams;
	uint32_t jobs;
	uint64_t lease_ctr;
	uint64_t produced;
	uint64_t natts;
	bool failed;
	bool dropped;
	char error[512];
	uint64_t blocked_since;   /* broadcast held back by a slow client, ms */
	uint64_t backpressure_ms;
};

struct job {
	struct job *done_next;
	struct engine *eng;
	struct pipeline *pl;
	struct stream *stream;
	uint64_t seq;
	uint64_t epoch, index;
	uint32_t rows;
	uint8_t *base;
	atomic_uint remaining;
	atomic_int err;
	char errmsg[512];
	unsigned ntasks;
	struct task {
		struct work work;
		struct job *job;
		uint32_t begin, end;
	} tasks[];
};

struct engine {
	uv_loop_t *loop;
	uv_async_t async;
	pthread_mutex_t done_lock;
	struct job *done_head;
	struct workers *workers;
	struct engine_ops ops;
	void *userdata;
	uint64_t memory_limit;
	uint64_t memory_used;
	struct pipeline *pipelines;
	struct attachment *atts;
	uint64_t att_ctr;
	struct cuda_devices *cuda; /* copy engines, from the first CUDA attach */
	bool shutdown;
};

static void stream_dispatch(struct stream *s);
static void pipeline_pump(struct pipeline *pl);
static void pipeline_maybe_free(struct pipeline *pl);
static void pipeline_update(struct pipeline *pl);

/* --- slots and the ring ------------------------------------------------- */

static uint32_t pipeline_quota(const struct pipeline *pl)
{
	uint32_t n = 0;

	for (const struct stream *s = pl->streams; s; s = s->next)
		if (!s->dead && s->natts)
			n++;
	n = n ? n : 1;
	uint32_t q = pl->nslots / n;
	return q ? q : 1;
}

static struct batch *ring_at(struct stream *s, uint64_t seq)
{
	if (seq < s->head_seq || seq - s->head_seq >= s->ring_len)
		return NULL;
	return &s->ring[(s->ring_head + (seq - s->head_seq)) % s->pl->nslots];
}

static void stream_maybe_free(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct stream **pp;

	if (!s->dead || s->jobs || s->slots_held)
		return;
	for (pp = &pl->streams; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	free(s->ring);
	free(s);
}

static void slot_unref(struct pipeline *pl, struct slot *slot)
{
	struct stream *s = slot->owner;

	if (--slot->refs)
		return;
	slot->owner = NULL;
	pl->free_slots[pl->nfree++] = slot->idx;
	if (s)
		s->slots_held--;
}

static void ring_pop_head(struct stream *s)
{
	struct batch *b = &s->ring[s->ring_head];
	struct slot *slot = b->slot;

	s->ring_head = (s->ring_head + 1) % s->pl->nslots;
	s->ring_len--;
	s->head_seq++;
	b->slot = NULL;
	slot_unref(s->pl, slot);
}

/* --- workers ------------------------------------------------------------ */

static void task_run(struct work *work)
{
	struct task *t = (struct task *)work;
	struct job *job = t->job;
	struct pipeline *pl = job->pl;
	void *dsts[SOURCE_MAX_FIELDS];
	char err[512];

	for (uint32_t r = t->begin; r < t->end && !atomic_load(&job->err); r++) {
		uint64_t idx = sampler_sample(&job->stream->sampler, job->epoch, job->index, r);
		int rc;

		for (size_t f = 0; f < pl->nfields; f++)
			dsts[f] = job->base + pl->field_off[f] + (uint64_t)r * pl->fields[f].sample_bytes;
		rc = source_read(pl->src, &(struct sample_ctx){ pl->spec->seed, job->epoch }, idx, dsts,
				 err, sizeof(err));
		if (rc < 0) {
			int zero = 0;
			if (atomic_compare_exchange_strong(&job->err, &zero, -rc))
				snprintf(job->errmsg, sizeof(job->errmsg), "%s", err);
			break;
		}
	}
	if (atomic_fetch_sub(&job->remaining, 1) == 1) {
		struct engine *eng = job->eng;
		pthread_mutex_lock(&eng->done_lock);
		job->done_next = eng->done_head;
		eng->done_head = job;
		pthread_mutex_unlock(&eng->done_lock);
		uv_async_send(&eng->async);
	}
}

static int stream_start_batch(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct engine *eng = pl->eng;
	unsigned nworkers = workers_count(eng->workers);
	struct batch *b;
	struct slot *slot;
	struct job *job;
	uint32_t rows, ntasks;
	uint64_t seq = s->next_produce;

	rows = sampler_batch_rows(&s->sampler, seq % s->bpe);
	/* Several batches are in flight anyway; split one only when it is big
	 * enough to pay for the extra wake-ups (they cost more than small copies). */
	ntasks = (uint32_t)(((uint64_t)rows * pl->row_bytes + TASK_MIN_BYTES - 1) / TASK_MIN_BYTES);
	if (ntasks > nworkers)
		ntasks = nworkers;
	if (ntasks > rows)
		ntasks = rows;
	if (ntasks == 0)
		ntasks = 1;
	job = calloc(1, sizeof(*job) + ntasks * sizeof(job->tasks[0]));
	if (!job)
		return -ENOMEM;

	slot = &pl->slots[pl->free_slots[--pl->nfree]];
	for (struct devcopy *dc = pl->devs; dc; dc = dc->next)
		dc->state[slot->idx] = DEV_NONE;
	slot->refs = 1;
	slot->owner = s;
	s->slots_held++;

	b = &s->ring[(s->ring_head + s->ring_len) % pl->nslots];
	if (s->ring_len == 0)
		s->head_seq = seq;
	s->ring_len++;
	b->seq = seq;
	b->epoch = seq / s->bpe;
	b->index = seq % s->bpe;
	b->rows = rows;
	b->ready = false;
	b->slot = slot;
	s->next_produce++;
	s->jobs++;
	pl->jobs++;

	job->eng = eng;
	job->pl = pl;
	job->stream = s;
	job->seq = seq;
	job->epoch = b->epoch;
	job->index = b->index;
	job->rows = rows;
	job->base = pl->slab->base + (uint64_t)slot->idx * pl->slot_bytes;
	job->ntasks = ntasks;
	atomic_init(&job->remaining, ntasks);
	atomic_init(&job->err, 0);
	for (uint32_t i = 0; i < ntasks; i++) {
		job->tasks[i].work.fn = task_run;
		job->tasks[i].job = job;
		job->tasks[i].begin = (uint32_t)((uint64_t)rows * i / ntasks);
		job->tasks[i].end = (uint32_t)((uint64_t)rows * (i + 1) / ntasks);
	}
	for (uint32_t i = 0; i < ntasks; i++)
		workers_submit(eng->workers, &job->tasks[i].work);
	return 0;
}

static bool stream_can_produce(struct stream *s)
{
	struct pipeline *pl = s->pl;

	if (s->dead || s->next_produce >= s->end_seq)
		return false;
	if (s->mode == LDR_MODE_PARTITION && s->natts == 0)
		return false;
	return pl->nfree > 0 && s->slots_held < pipeline_quota(pl) && s->ring_len < pl->nslots;
}

static void pipeline_pump(struct pipeline *pl)
{
	struct engine *eng = pl->eng;
	bool progress = true;

	if (pl->failed || pl->dropped || eng->shutdown)
		return;
	/* A stream nobody is attached to gives up its prefetched batches when a
	 * stream with clients needs the slots. */
	if (pl->nfree == 0) {
		bool starved = false;
		for (struct stream *s = pl->streams; s; s = s->next)
			if (!s->dead && s->natts && s->next_produce < s->end_seq &&
			    s->slots_held < pipeline_quota(pl))
				starved = true;
		for (struct stream *s = pl->streams; starved && s; s = s->next)
			while (!s->dead && s->natts == 0 && s->ring_len && s->ring[s->ring_head].ready &&
			       s->ring[s->ring_head].slot->leases == 0)
				ring_pop_head(s);
	}
	while (progress) {
		progress = false;
		for (struct stream *s = pl->streams; s; s = s->next) {
			if (!stream_can_produce(s))
				continue;
			if (stream_start_batch(s) < 0)
				return;
			progress = true;
		}
	}
	/* Report how long a slow broadcast client held the stream back. */
	struct stream *bs = pl->shared[LDR_MODE_BROADCAST];
	bool blocked = bs && bs->natts > 1 && bs->next_produce < bs->end_seq &&
	               (bs->slots_held >= pipeline_quota(pl) || pl->nfree == 0) &&
	               bs->ring_len > 0 && bs->ring[bs->ring_head].ready;
	uint64_t now = uv_now(eng->loop);
	if (blocked && !pl->blocked_since)
		pl->blocked_since = now ? now : 1;
	else if (!blocked && pl->blocked_since) {
		pl->backpressure_ms += now - pl->blocked_since;
		pl->blocked_since = 0;
	}
}

/* --- device copies ------------------------------------------------------ */

static void devcopy_maybe_free(struct devcopy *dc)
{
	struct pipeline *pl = dc->pl;
	struct devcopy **pp;

	/* A legacy IPC allocation must outlive every importer's cuIpcOpenMemHandle
	 * (freeing it first is undefined), and a client may keep batches past its
	 * detach: it stays until the pipeline goes. A VMM allocation lives on in
	 * the clients' mappings; ours can go now. */
	if (dc->natts || dc->inflight || dc->ds->kind == CUDA_MEM_IPC)
		return;
	for (pp = &pl->devs; *pp; pp = &(*pp)->next)
		if (*pp == dc) {
			*pp = dc->next;
			break;
		}
	cuda_dslab_free(pl->eng->cuda, dc->ds);
	free(dc->state);
	free(dc);
}

static void devcopy_fail(struct devcopy *dc, const char *msg)
{
	if (dc->failed)
		return;
	dc->failed = true;
	snprintf(dc->error, sizeof(dc->error), "cuda:%d: %s", dc->device, msg);
	log_err("pipeline %s: %s", dc->pl->spec->name, dc->error);
}

static void copy_done(void *cookie, int err, const char *msg)
{
	struct copy_cookie *c = cookie;
	struct devcopy *dc = c->dc;
	struct slot *slot = c->slot;
	struct pipeline *pl = dc->pl;

	free(c);
	dc->inflight--;
	pl->jobs--;
	if (err) {
		dc->state[slot->idx] = DEV_NONE;
		devcopy_fail(dc, msg);
	} else {
		dc->state[slot->idx] = DEV_DONE;
		dc->copies++;
	}
	slot_unref(pl, slot);
	devcopy_maybe_free(dc);
	if (pl->dropped) {
		pipeline_maybe_free(pl);
		return;
	}
	pipeline_update(pl);
}

/* Queue the copy of ready batch @b to @dc's device, unless it is there or on its way. */
static void devcopy_kick(struct devcopy *dc, struct batch *b)
{
	struct pipeline *pl = dc->pl;
	struct slot *slot = b->slot;
	struct cuda_span spans[SOURCE_MAX_FIELDS];
	struct copy_cookie *c;
	char msg[160];
	int r;

	if (dc->failed || dc->state[slot->idx] != DEV_NONE)
		return;
	for (size_t f = 0; f < pl->nfields; f++)
		spans[f] = (struct cuda_span){ pl->field_off[f], (uint64_t)b->rows * pl->fields[f].sample_bytes };
	c = malloc(sizeof(*c));
	if (!c) {
		devcopy_fail(dc, "out of memory queueing a copy");
		return;
	}
	c->dc = dc;
	c->slot = slot;
	r = cuda_copy(pl->eng->cuda, dc->ds, slot->idx, pl->slab->base + (uint64_t)slot->idx * pl->slot_bytes,
	              spans, pl->nfields, copy_done, c);
	if (r < 0) {
		free(c);
		snprintf(msg, sizeof(msg), "cannot queue a copy: %s", strerror(-r));
		devcopy_fail(dc, msg);
		return;
	}
	dc->state[slot->idx] = DEV_COPYING;
	slot->refs++;
	dc->inflight++;
	pl->jobs++;
}

/* Copy ready batch @b ahead of time to the devices of @s's attachments. A
 * dynamic stream whose clients sit on several devices copies on demand only:
 * each batch goes to one client, and its device is known when it is asked. */
static void stream_prefetch_devices(struct stream *s, struct batch *b)
{
	struct devcopy *first = NULL;

	if (!s->pl->devs)
		return;
	if (s->mode == LDR_MODE_DYNAMIC)
		for (struct attachment *a = s->atts; a; a = a->next) {
			if (!a->dev)
				continue;
			if (first && a->dev != first)
				return;
			first = a->dev;
		}
	for (struct attachment *a = s->atts; a; a = a->next)
		if (a->dev)
			devcopy_kick(a->dev, b);
}

/* Can @b be delivered to @a now? For a CUDA client, once it is on the device. */
static bool batch_ready(struct attachment *a, struct batch *b)
{
	struct devcopy *dc = a->dev;

	if (!b->ready)
		return false;
	if (!dc || dc->state[b->slot->idx] == DEV_DONE)
		return true;
	devcopy_kick(dc, b);
	return false;
}

/* --- delivery ----------------------------------------------------------- */

static void deliver(struct engine *eng, struct pending *p, const struct delivery *d)
{
	eng->ops.deliver(eng->userdata, p, d);
}

static struct pending *att_pop_pending(struct attachment *a)
{
	struct pending *p = a->pend_head;

	if (p) {
		a->pend_head = p->next;
		if (!a->pend_head)
			a->pend_tail = NULL;
		a->npending--;
		p->next = NULL;
	}
	return p;
}

static struct pending *dyn_pop(struct stream *s)
{
	struct pending *p = s->dyn_head;

	if (p) {
		s->dyn_head = p->next;
		if (!s->dyn_head)
			s->dyn_tail = NULL;
		p->next = NULL;
		p->att->npending--;
	}
	return p;
}

static void answer_end(struct attachment *a, struct pending *p)
{
	struct delivery d = { .kind = DELIVER_END, .seq = a->deliver_no++ };
	deliver(a->eng, p, &d);
}

static void answer_error(struct attachment *a, struct pending *p, int err, const char *msg)
{
	struct delivery d = { .kind = DELIVER_ERROR, .seq = a->deliver_no++, .err = err, .msg = msg };
	deliver(a->eng, p, &d);
}

/* Lease @b to @a and describe the delivery in @out. */
static int lease_batch(struct attachment *a, struct batch *b, struct delivered_batch *out)
{
	struct pipeline *pl = a->pl;
	struct lease *l = malloc(sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->id = ++pl->lease_ctr;
	l->slot = b->slot;
	l->next = a->leases;
	a->leases = l;
	a->nleases++;
	b->slot->refs++;
	b->slot->leases++;
	a->delivered++;
	*out = (struct delivered_batch){
		.seq = a->deliver_no++,
		.lease = l->id,
		.epoch = b->epoch,
		.index = b->index,
		.slot = b->slot->idx,
		.rows = b->rows,
	};
	return 0;
}

static void answer_batches(struct attachment *a, struct pending *p,
                           const struct delivered_batch *out, uint32_t n)
{
	struct delivery d = { .kind = DELIVER_BATCH, .batches = out, .nbatches = n };

	if (n == 0) {
		answer_error(a, p, ENOMEM, "out of memory");
		return;
	}
	deliver(a->eng, p, &d);
}

static void att_fail_pending(struct attachment *a, int err, const char *msg)
{
	struct pending *p;

	if (a->stream && a->mode == LDR_MODE_DYNAMIC) {
		struct stream *s = a->stream;
		struct pending **pp = &s->dyn_head, *prev = NULL;
		while (*pp) {
			p = *pp;
			if (p->att != a) {
				prev = p;
				pp = &p->next;
				continue;
			}
			*pp = p->next;
			if (s->dyn_tail == p)
				s->dyn_tail = prev;
			p->next = NULL;
			a->npending--;
			answer_error(a, p, err, msg);
		}
	}
	while ((p = att_pop_pending(a)))
		answer_error(a, p, err, msg);
}

static void stream_dispatch(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct pending *p;

	if (pl->failed) {
		for (struct attachment *a = s->atts; a; a = a->next)
			att_fail_pending(a, EIO, pl->error);
		return;
	}
	if (s->mode == LDR_MODE_DYNAMIC) {
		while (s->dyn_head) {
			struct delivered_batch out[DELIVER_MAX_BATCHES];
			struct batch *b;
			uint32_t n = 0;
			if (s->cursor >= s->end_seq) {
				p = dyn_pop(s);
				answer_end(p->att, p);
				continue;
			}
			if (s->dyn_head->att->dev && s->dyn_head->att->dev->failed) {
				p = dyn_pop(s);
				answer_error(p->att, p, EIO, p->att->dev->error);
				continue;
			}
			b = ring_at(s, s->cursor);
			if (!b || !batch_ready(s->dyn_head->att, b))
				break;
			p = dyn_pop(s);
			while (n < p->max && s->cursor < s->end_seq && (b = ring_at(s, s->cursor)) &&
			       batch_ready(p->att, b) && lease_batch(p->att, b, &out[n]) == 0) {
				n++;
				s->cursor++;
				ring_pop_head(s);
			}
			answer_batches(p->att, p, out, n);
		}
		return;
	}

	if (s->mode == LDR_MODE_BROADCAST && !s->started) {
		if (s->natts < pl->spec->min_clients)
			return;
		s->started = true;
	}
	uint64_t min_cursor = UINT64_MAX;
	for (struct attachment *a = s->atts; a; a = a->next) {
		if (a->dev && a->dev->failed)
			att_fail_pending(a, EIO, a->dev->error);
		while (a->pend_head) {
			struct delivered_batch out[DELIVER_MAX_BATCHES];
			struct batch *b;
			uint32_t n = 0;
			if (a->cursor >= s->end_seq) {
				answer_end(a, att_pop_pending(a));
				continue;
			}
			b = ring_at(s, a->cursor);
			if (!b || !batch_ready(a, b))
				break;
			p = att_pop_pending(a);
			while (n < p->max && a->cursor < s->end_seq && (b = ring_at(s, a->cursor)) &&
			       batch_ready(a, b) && lease_batch(a, b, &out[n]) == 0) {
				n++;
				a->cursor++;
			}
			answer_batches(a, p, out, n);
		}
		if (a->cursor < min_cursor)
			min_cursor = a->cursor;
	}
	if (s->natts == 0)
		return;
	/* Batches every client has received leave the ring. One that somebody
	 * still holds stays, so a late joiner starts there, unless a later one
	 * is free to go: a batch kept for long must not block the ring. */
	uint32_t drop = 0;
	for (uint32_t i = 0; i < s->ring_len; i++) {
		const struct batch *b = &s->ring[(s->ring_head + i) % pl->nslots];
		if (b->seq >= min_cursor || !b->ready)
			break;
		if (b->slot->leases == 0)
			drop = i + 1;
	}
	while (drop--)
		ring_pop_head(s);
}

static void pipeline_dispatch(struct pipeline *pl)
{
	for (struct stream *s = pl->streams; s; s = s->next)
		if (!s->dead)
			stream_dispatch(s);
}

static void pipeline_update(struct pipeline *pl)
{
	pipeline_dispatch(pl);
	pipeline_pump(pl);
	pipeline_dispatch(pl);
}

static void pipeline_fail(struct pipeline *pl, int err, const char *msg)
{
	if (pl->failed)
		return;
	pl->failed = true;
	snprintf(pl->error, sizeof(pl->error), "%s", msg);
	log_err("pipeline %s failed: %s", pl->spec->name, msg);
	(void)err;
	pipeline_dispatch(pl);
}

static void job_done(struct job *job)
{
	struct pipeline *pl = job->pl;
	struct stream *s = job->stream;
	int err = atomic_load(&job->err);

	s->jobs--;
	pl->jobs--;
	struct batch *b = ring_at(s, job->seq);
	if (b) {
		b->ready = true;
		pl->produced++;
		if (!err && !s->dead && !pl->dropped)
			stream_prefetch_devices(s, b);
	}
	if (err && !pl->dropped)
		pipeline_fail(pl, err, job->errmsg);
	free(job);
	if (s->dead) {
		/* release the ring's references now that no worker writes */
		while (s->ring_len && s->ring[s->ring_head].ready)
			ring_pop_head(s);
		stream_maybe_free(s);
	}
	if (pl->dropped) {
		pipeline_maybe_free(pl);
		return;
	}
	pipeline_update(pl);
}

static void on_async(uv_async_t *handle)
{
	struct engine *eng = handle->data;
	struct job *list, *rev = NULL;

	pthread_mutex_lock(&eng->done_lock);
	list = eng->done_head;
	eng->done_head = NULL;
	pthread_mutex_unlock(&eng->done_lock);
	/* restore submission order of completion, oldest first */
	while (list) {
		struct job *n = list->done_next;
		list->done_next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct job *n = rev->done_next;
		job_done(rev);
		rev = n;
	}
}

/* --- pipelines ---------------------------------------------------------- */

static struct pipeline *engine_find(struct engine *eng, const char *name)
{
	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped && strcmp(pl->spec->name, name) == 0)
			return pl;
	return NULL;
}

bool engine_has(struct engine *eng, const char *name)
{
	return engine_find(eng, name) != NULL;
}

static void slab_free_cb(void *slab)
{
	slab_free(slab);
}

static void pipeline_free(struct pipeline *pl)
{
	while (pl->streams) {
		struct stream *s = pl->streams;
		pl->streams = s->next;
		free(s->ring);
		free(s);
	}
	while (pl->devs) {
		struct devcopy *dc = pl->devs;
		pl->devs = dc->next;
		cuda_dslab_free(pl->eng->cuda, dc->ds);
		free(dc->state);
		free(dc);
	}
	source_free(pl->src);
	/* a pinned slab is unmapped only after its engine unregistered it */
	if (pl->host_pinned)
		cuda_host_unregister(pl->eng->cuda, pl->pin_device, pl->slab->base, slab_free_cb, pl->slab);
	else
		slab_free(pl->slab);
	spec_free(pl->spec);
	free(pl->slots);
	free(pl->free_slots);
	free(pl);
}

static void pipeline_maybe_free(struct pipeline *pl)
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
	eng->memory_used -= pl->slab ? pl->slab->size : 0;
	pipeline_free(pl);
}

int engine_create(struct engine *eng, struct spec *spec, uid_t owner, bool exist_ok,
                  char *err, size_t errlen)
{
	struct pipeline *pl, *old;
	struct sampler smp;
	uint64_t off = 0, slab_bytes;
	int r;

	if (eng->shutdown) {
		snprintf(err, errlen, "daemon is shutting down");
		spec_free(spec);
		return -ESHUTDOWN;
	}
	old = engine_find(eng, spec->name);
	if (old) {
		bool same = spec_equal(old->spec, spec);
		snprintf(err, errlen, same ? "pipeline '%s' exists already"
		                           : "pipeline '%s' exists already with another spec",
		         spec->name);
		spec_free(spec);
		return same && exist_ok ? 0 : -EEXIST;
	}
	pl = calloc(1, sizeof(*pl));
	if (!pl) {
		spec_free(spec);
		return -ENOMEM;
	}
	pl->eng = eng;
	pl->spec = spec;
	pl->owner = owner;
	r = source_open(&pl->src, spec, err, errlen);
	if (r < 0)
		goto fail;
	pl->nfields = source_nfields(pl->src);
	if (pl->nfields > SOURCE_MAX_FIELDS) {
		snprintf(err, errlen, "too many fields: %zu (most %d)", pl->nfields, SOURCE_MAX_FIELDS);
		r = -EINVAL;
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
			snprintf(err, errlen, "batch of field '%s' is too large", fd->name);
			r = -EINVAL;
			goto fail;
		}
		off += ALIGN_UP(bytes ? bytes : 1, FIELD_ALIGN);
	}
	pl->slot_bytes = ALIGN_UP(off, SLOT_ALIGN);
	pl->nslots = spec->prefetch;
	smp = (struct sampler){ .nsamples = source_nsamples(pl->src), .batch_size = spec->batch_size,
		.shuffle = spec->shuffle, .drop_last = spec->drop_last, .seed = spec->seed,
		.rank = 0, .world = 1 };
	if (sampler_batches_per_epoch(&smp) == 0) {
		snprintf(err, errlen, "pipeline yields no batch: %" PRIu64 " samples, batch_size %u, drop_last",
		         smp.nsamples, spec->batch_size);
		r = -EINVAL;
		goto fail;
	}
	if (__builtin_mul_overflow(pl->slot_bytes, (uint64_t)pl->nslots, &slab_bytes) ||
	    slab_bytes > eng->memory_limit - eng->memory_used) {
		snprintf(err, errlen,
		         "memory limit: pipeline '%s' needs %" PRIu64 " bytes (%u slots of %" PRIu64
		         "), %" PRIu64 " of %" PRIu64 " bytes are free (--memory-limit)",
		         spec->name, pl->slot_bytes * pl->nslots, pl->nslots, pl->slot_bytes,
		         eng->memory_limit - eng->memory_used, eng->memory_limit);
		r = -ENOSPC;
		goto fail;
	}
	r = slab_new(&pl->slab, spec->name, slab_bytes);
	if (r < 0) {
		snprintf(err, errlen, "cannot create slab of %" PRIu64 " bytes: %s", slab_bytes, strerror(-r));
		goto fail;
	}
	pl->slots = calloc(pl->nslots, sizeof(*pl->slots));
	pl->free_slots = calloc(pl->nslots, sizeof(*pl->free_slots));
	if (!pl->slots || !pl->free_slots) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < pl->nslots; i++) {
		pl->slots[i].idx = i;
		pl->free_slots[pl->nfree++] = pl->nslots - 1 - i;
	}
	eng->memory_used += slab_bytes;
	pl->next = eng->pipelines;
	eng->pipelines = pl;
	log_info("pipeline %s created: %" PRIu64 " samples, %u slots of %" PRIu64 " bytes",
	         spec->name, smp.nsamples, pl->nslots, pl->slot_bytes);
	return 1;

fail:
	pl->spec = NULL;
	spec_free(spec);
	source_free(pl->src);
	slab_free(pl->slab);
	free(pl->slots);
	free(pl->free_slots);
	free(pl);
	return r;
}

static void att_unlink(struct attachment *a)
{
	struct attachment **pp;

	for (pp = &a->eng->atts; *pp; pp = &(*pp)->all_next)
		if (*pp == a) {
			*pp = a->all_next;
			break;
		}
}

/* Cut an attachment off its pipeline: leases released, requests answered. */
static void att_disconnect(struct attachment *a, int err, const char *msg)
{
	struct pipeline *pl = a->pl;
	struct stream *s = a->stream;
	struct attachment **pp;

	if (!pl)
		return;
	att_fail_pending(a, err, msg);
	while (a->leases) {
		struct lease *l = a->leases;
		a->leases = l->next;
		l->slot->leases--;
		slot_unref(pl, l->slot);
		free(l);
	}
	a->nleases = 0;
	if (a->dev) {
		a->dev->natts--;
		devcopy_maybe_free(a->dev);
		a->dev = NULL;
	}
	for (pp = &s->atts; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	s->natts--;
	pl->natts--;
	if (s->mode == LDR_MODE_BROADCAST && s->natts == 0) {
		/* what the last client received is consumed: keep only the rest */
		while (s->ring_len && s->head_seq < a->cursor && s->ring[s->ring_head].ready &&
		       s->ring[s->ring_head].slot->leases == 0)
			ring_pop_head(s);
	}
	if (s->mode == LDR_MODE_PARTITION) {
		s->dead = true;
		pl->nstreams--;
		/* drop ready batches now; in-flight ones when their job ends */
		while (s->ring_len && s->ring[s->ring_head].ready)
			ring_pop_head(s);
		stream_maybe_free(s);
	}
	a->pl = NULL;
	a->stream = NULL;
}

int engine_drop(struct engine *eng, const char *name, uid_t uid, bool force, char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);
	char msg[160];

	if (!pl) {
		snprintf(err, errlen, "no pipeline named '%s'", name);
		return -ENOENT;
	}
	if (uid != 0 && uid != getuid() && uid != pl->owner) {
		snprintf(err, errlen, "pipeline '%s' belongs to uid %u", name, (unsigned)pl->owner);
		return -EPERM;
	}
	if (pl->natts && !force) {
		snprintf(err, errlen, "pipeline '%s' has %" PRIu64 " clients attached (use force)", name, pl->natts);
		return -EBUSY;
	}
	snprintf(msg, sizeof(msg), "pipeline '%s' was dropped", name);
	for (struct attachment *a = eng->atts; a; a = a->all_next)
		if (a->pl == pl) {
			att_disconnect(a, ENOENT, msg);
			a->dead = true;
			snprintf(a->dead_msg, sizeof(a->dead_msg), "%s", msg);
		}
	pl->dropped = true;
	log_info("pipeline %s dropped", name);
	pipeline_maybe_free(pl);
	return 0;
}

static const char *pipeline_state(const struct pipeline *pl)
{
	if (pl->failed)
		return "failed";
	bool any = false, done = true;
	for (struct stream *s = pl->streams; s; s = s->next) {
		if (s->dead)
			continue;
		any = true;
		if (s->next_produce < s->end_seq || s->ring_len)
			done = false;
	}
	return any && done ? "done" : "running";
}

static json_t *pipeline_json(struct pipeline *pl)
{
	struct sampler smp = { .nsamples = source_nsamples(pl->src), .batch_size = pl->spec->batch_size,
		.shuffle = pl->spec->shuffle, .drop_last = pl->spec->drop_last, .seed = pl->spec->seed,
		.rank = 0, .world = 1 };
	uint32_t in_use = 0, leased = 0;
	uint64_t now = uv_now(pl->eng->loop);
	json_t *fields = json_array();

	for (uint32_t i = 0; i < pl->nslots; i++) {
		if (pl->slots[i].refs)
			in_use++;
		if (pl->slots[i].leases)
			leased++;
	}
	for (size_t f = 0; f < pl->nfields; f++) {
		json_t *shape = json_array();
		for (int d = 0; d < pl->fields[f].ndim; d++)
			json_array_append_new(shape, json_integer(pl->fields[f].shape[d]));
		json_array_append_new(fields, json_pack("{s:s, s:s, s:o}", "name", pl->fields[f].name,
			"dtype", dtype_name(pl->fields[f].dtype), "sample_shape", shape));
	}
	json_t *devices = json_array();
	for (const struct devcopy *dc = pl->devs; dc; dc = dc->next) {
		char dev[24];
		snprintf(dev, sizeof(dev), "cuda:%d", dc->device);
		json_array_append_new(devices, json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o}",
			"device", dev,
			"name", dc->ds->device_name,
			"memory", dc->ds->kind == CUDA_MEM_VMM ? "vmm" : "ipc",
			"slab_bytes", (json_int_t)dc->ds->bytes,
			"clients", (json_int_t)dc->natts,
			"copies", (json_int_t)dc->copies,
			"copying", (json_int_t)dc->inflight,
			"error", dc->failed ? json_string(dc->error) : json_null()));
	}
	return json_pack("{s:s, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:O}",
		"name", pl->spec->name,
		"state", pipeline_state(pl),
		"error", pl->failed ? json_string(pl->error) : json_null(),
		"slots_total", (json_int_t)pl->nslots,
		"slots_in_use", (json_int_t)in_use,
		"slots_leased", (json_int_t)leased,
		"slot_bytes", (json_int_t)pl->slot_bytes,
		"samples", (json_int_t)smp.nsamples,
		"batch_size", (json_int_t)pl->spec->batch_size,
		"batches_per_epoch", (json_int_t)sampler_batches_per_epoch(&smp),
		"epochs", (json_int_t)pl->spec->epochs,
		"clients", (json_int_t)pl->natts,
		"batches_produced", (json_int_t)pl->produced,
		"skipped", (json_int_t)source_skipped(pl->src),
		"backpressure_ms", (json_int_t)(pl->backpressure_ms +
			(pl->blocked_since ? now - pl->blocked_since : 0)),
		"fields", fields,
		"devices", devices,
		"spec", pl->spec->json);
}

json_t *engine_cuda_json(struct engine *eng)
{
	return cuda_devices_json(eng->cuda);
}

json_t *engine_pipelines_json(struct engine *eng)
{
	json_t *arr = json_array();

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (!pl->dropped)
			json_array_append_new(arr, pipeline_json(pl));
	return arr;
}

/* --- attachments -------------------------------------------------------- */

static struct stream *stream_new(struct pipeline *pl, int mode, uint32_t rank, uint32_t world)
{
	struct stream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->ring = calloc(pl->nslots, sizeof(*s->ring));
	if (!s->ring) {
		free(s);
		return NULL;
	}
	s->pl = pl;
	s->mode = mode;
	s->sampler = (struct sampler){ .nsamples = source_nsamples(pl->src),
		.batch_size = pl->spec->batch_size, .shuffle = pl->spec->shuffle,
		.drop_last = pl->spec->drop_last, .seed = pl->spec->seed, .rank = rank, .world = world };
	s->bpe = sampler_batches_per_epoch(&s->sampler);
	if (pl->spec->epochs == 0 || __builtin_mul_overflow(pl->spec->epochs, s->bpe, &s->end_seq))
		s->end_seq = UINT64_MAX;
	s->next = pl->streams;
	pl->streams = s;
	pl->nstreams++;
	return s;
}

/* The device slab of @pl on @info's device, allocated on its first client. */
static int devcopy_get(struct pipeline *pl, const struct cuda_device_info *info, struct devcopy **out,
                       char *err, size_t errlen)
{
	struct engine *eng = pl->eng;
	struct devcopy *dc;
	int r;

	for (dc = pl->devs; dc; dc = dc->next)
		if (dc->device == info->index && !dc->failed) {
			dc->natts++;
			*out = dc;
			return 0;
		}
	if (!eng->cuda) {
		r = cuda_devices_new(&eng->cuda, eng->loop);
		if (r < 0) {
			snprintf(err, errlen, "cuda:%d: cannot start the copy engines: %s", info->index, strerror(-r));
			return r;
		}
	}
	dc = calloc(1, sizeof(*dc));
	if (!dc || !(dc->state = calloc(pl->nslots, 1))) {
		free(dc);
		return -ENOMEM;
	}
	r = cuda_dslab_new(eng->cuda, info, pl->slot_bytes, pl->nslots, &dc->ds, err, errlen);
	if (r < 0) {
		free(dc->state);
		free(dc);
		return r;
	}
	if (!pl->host_pinned) {
		cuda_host_register(eng->cuda, info->index, pl->slab->base, pl->slab->size);
		pl->host_pinned = true;
		pl->pin_device = info->index;
	}
	dc->pl = pl;
	dc->device = info->index;
	dc->natts = 1;
	dc->next = pl->devs;
	pl->devs = dc;
	*out = dc;
	return 0;
}

/* Undo an attachment that never joined a stream. */
static void att_free_unattached(struct attachment *a)
{
	if (a->dev) {
		a->dev->natts--;
		devcopy_maybe_free(a->dev);
	}
	free(a);
}

int engine_attach(struct engine *eng, const char *name, const struct attach_params *p,
                  struct attachment **out, char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);
	struct attachment *a;
	struct stream *s;
	uint32_t world = p->world ? p->world : 1;

	if (eng->shutdown) {
		snprintf(err, errlen, "daemon is shutting down");
		return -ESHUTDOWN;
	}
	if (!pl) {
		snprintf(err, errlen, "no pipeline named '%s'", name);
		return -ENOENT;
	}
	if (pl->failed) {
		snprintf(err, errlen, "pipeline '%s' failed: %s", name, pl->error);
		return -EIO;
	}
	if (p->mode < 0 || p->mode > LDR_MODE_DYNAMIC) {
		snprintf(err, errlen, "attach: unknown mode %d", p->mode);
		return -EINVAL;
	}
	if (p->mode != LDR_MODE_PARTITION && (p->rank || world != 1 || p->has_start)) {
		snprintf(err, errlen, "attach: rank, world_size and start apply to partition mode only");
		return -EINVAL;
	}
	if (world > 1u << 20 || p->rank >= world) {
		snprintf(err, errlen, "attach: rank %u out of range for world_size %u", p->rank, world);
		return -EINVAL;
	}
	if (p->credits > ATTACH_MAX_CREDITS) {
		snprintf(err, errlen, "attach: credits %u above the limit of %d", p->credits, ATTACH_MAX_CREDITS);
		return -EINVAL;
	}
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	if (p->cuda) {
		int r = devcopy_get(pl, p->cuda, &a->dev, err, errlen);
		if (r < 0) {
			free(a);
			return r;
		}
	}
	if (p->mode == LDR_MODE_PARTITION) {
		s = stream_new(pl, p->mode, p->rank, world);
		if (!s) {
			att_free_unattached(a);
			return -ENOMEM;
		}
		if (s->bpe == 0) {
			snprintf(err, errlen, "attach: rank %u of %u gets no batch (%" PRIu64 " samples, batch_size %u)",
			         p->rank, world, s->sampler.nsamples, pl->spec->batch_size);
			s->dead = true;
			pl->nstreams--;
			stream_maybe_free(s);
			att_free_unattached(a);
			return -EINVAL;
		}
		uint64_t start = 0;
		if (p->has_start) {
			if (p->start_batch >= s->bpe ||
			    __builtin_mul_overflow(p->start_epoch, s->bpe, &start) ||
			    __builtin_add_overflow(start, p->start_batch, &start) ||
			    start > s->end_seq) {
				snprintf(err, errlen,
				         "attach: start (epoch %" PRIu64 ", batch %" PRIu64 ") is outside the stream "
				         "(%" PRIu64 " batches per epoch, %" PRIu64 " epochs)",
				         p->start_epoch, p->start_batch, s->bpe, pl->spec->epochs);
				s->dead = true;
				pl->nstreams--;
				stream_maybe_free(s);
				att_free_unattached(a);
				return -EINVAL;
			}
		}
		s->next_produce = s->head_seq = s->cursor = start;
		a->cursor = start;
	} else {
		s = pl->shared[p->mode];
		if (!s) {
			s = stream_new(pl, p->mode, 0, 1);
			if (!s) {
				att_free_unattached(a);
				return -ENOMEM;
			}
			pl->shared[p->mode] = s;
		}
		a->cursor = s->ring_len ? s->head_seq : s->next_produce;
	}
	a->eng = eng;
	a->pl = pl;
	a->stream = s;
	a->id = ++eng->att_ctr;
	a->client_id = p->client_id;
	a->uid = p->uid;
	a->mode = p->mode;
	a->rank = p->rank;
	a->world = world;
	a->credits = p->credits ? p->credits : 4;
	a->start_seq = a->cursor;
	if (getrandom(a->token, sizeof(a->token), 0) != sizeof(a->token)) {
		/* getrandom of 16 bytes does not fail once the pool is ready */
		for (size_t i = 0; i < sizeof(a->token); i++)
			a->token[i] = (uint8_t)rand();
	}
	a->token_valid = true;
	a->token_expiry = uv_now(eng->loop) + TOKEN_TTL_MS;
	a->next = s->atts;
	s->atts = a;
	s->natts++;
	pl->natts++;
	a->all_next = eng->atts;
	eng->atts = a;
	*out = a;
	pipeline_update(pl);
	return 0;
}

void attachment_detach(struct attachment *a)
{
	struct pipeline *pl = a->pl;

	if (!a)
		return;
	att_disconnect(a, ECANCELED, "detached");
	att_unlink(a);
	free(a);
	if (pl)
		pipeline_update(pl);
}

void attachment_get_info(const struct attachment *a, struct attach_info *info)
{
	const struct pipeline *pl = a->pl;
	const struct stream *s = a->stream;

	memset(info, 0, sizeof(*info));
	info->id = a->id;
	memcpy(info->token, a->token, sizeof(info->token));
	if (!pl)
		return;
	info->slab_bytes = pl->slab->size;
	info->slot_bytes = pl->slot_bytes;
	info->nslots = pl->nslots;
	info->batch_size = pl->spec->batch_size;
	info->batches_per_epoch = s->bpe;
	info->epochs = pl->spec->epochs;
	info->samples = sampler_samples_per_epoch(&s->sampler);
	info->start_epoch = a->start_seq / s->bpe;
	info->start_batch = a->start_seq % s->bpe;
	info->nfields = pl->nfields;
	info->fields = pl->fields;
	info->field_offsets = pl->field_off;
	if (a->dev)
		info->dslab = a->dev->ds;
}

uint64_t attachment_id(const struct attachment *a)
{
	return a->id;
}

uint64_t attachment_client(const struct attachment *a)
{
	return a->client_id;
}

size_t attachment_leases(const struct attachment *a)
{
	return a->nleases;
}

json_t *attachment_json(const struct attachment *a)
{
	json_t *o = json_pack("{s:I, s:s?, s:s, s:I, s:I, s:I}",
		"id", (json_int_t)a->id,
		"pipeline", a->pl ? a->pl->spec->name : NULL,
		"mode", mode_name(a->mode),
		"leases", (json_int_t)a->nleases,
		"delivered", (json_int_t)a->delivered,
		"pending", (json_int_t)a->npending);
	if (a->mode == LDR_MODE_PARTITION) {
		json_object_set_new(o, "rank", json_integer(a->rank));
		json_object_set_new(o, "world_size", json_integer(a->world));
	}
	if (a->stream && a->stream->bpe) {
		uint64_t pos = a->mode == LDR_MODE_DYNAMIC ? a->stream->cursor : a->cursor;
		json_object_set_new(o, "position", json_pack("{s:I, s:I}",
			"epoch", (json_int_t)(pos / a->stream->bpe),
			"batch", (json_int_t)(pos % a->stream->bpe)));
	}
	if (a->dead)
		json_object_set_new(o, "error", json_string(a->dead_msg));
	return o;
}

int attachment_next(struct attachment *a, struct pending *p, const uint64_t *leases, size_t nleases,
                    char *err, size_t errlen)
{
	struct pipeline *pl = a->pl;
	int r = 0;

	if (!pl) {
		snprintf(err, errlen, "%s", a->dead ? a->dead_msg : "detached");
		return a->dead ? -ENOENT : -ECANCELED;
	}
	for (size_t i = 0; i < nleases; i++) {
		struct lease **pp = &a->leases;
		while (*pp && (*pp)->id != leases[i])
			pp = &(*pp)->next;
		if (!*pp) {
			snprintf(err, errlen, "release: no lease %" PRIu64 " on attachment %" PRIu64,
			         leases[i], a->id);
			r = -ENOENT;
			continue;
		}
		struct lease *l = *pp;
		*pp = l->next;
		a->nleases--;
		l->slot->leases--;
		slot_unref(pl, l->slot);
		free(l);
	}
	if (p) {
		r = 0; /* a bad release is the client's bug; its request still counts */
		if (a->npending >= a->credits) {
			snprintf(err, errlen, "too many requests in flight: %u (credits %u)", a->npending + 1,
			         a->credits);
			r = -EAGAIN;
		} else {
			p->att = a;
			p->next = NULL;
			if (p->max < 1)
				p->max = 1;
			if (p->max > DELIVER_MAX_BATCHES)
				p->max = DELIVER_MAX_BATCHES;
			a->npending++;
			if (a->mode == LDR_MODE_DYNAMIC) {
				struct stream *s = a->stream;
				if (s->dyn_tail)
					s->dyn_tail->next = p;
				else
					s->dyn_head = p;
				s->dyn_tail = p;
			} else {
				if (a->pend_tail)
					a->pend_tail->next = p;
				else
					a->pend_head = p;
				a->pend_tail = p;
			}
		}
	}
	pipeline_update(pl);
	return r;
}

int engine_take_token(struct engine *eng, const uint8_t *token, uid_t uid, int *fd, uint64_t *size,
                      int *dev_fd, uint64_t *dev_size)
{
	uint64_t now = uv_now(eng->loop);

	for (struct attachment *a = eng->atts; a; a = a->all_next) {
		if (!a->token_valid || memcmp(a->token, token, FD_TOKEN_BYTES) != 0)
			continue;
		a->token_valid = false;
		if (now > a->token_expiry || !a->pl)
			return -ETIMEDOUT;
		if (uid != a->uid && uid != 0)
			return -EPERM;
		*fd = a->pl->slab->ro_fd;
		*size = a->pl->slab->size;
		*dev_fd = -1;
		*dev_size = 0;
		if (a->dev && a->dev->ds->kind == CUDA_MEM_VMM) {
			*dev_fd = a->dev->ds->fd;
			*dev_size = a->dev->ds->bytes;
		}
		return 0;
	}
	return -ENOENT;
}

/* --- the engine --------------------------------------------------------- */

int engine_new(struct engine **out, uv_loop_t *loop, unsigned nworkers, uint64_t memory_limit,
               const struct engine_ops *ops, void *userdata)
{
	struct engine *eng = calloc(1, sizeof(*eng));
	int r;

	if (!eng)
		return -ENOMEM;
	eng->loop = loop;
	eng->ops = *ops;
	eng->userdata = userdata;
	eng->memory_limit = memory_limit;
	pthread_mutex_init(&eng->done_lock, NULL);
	r = workers_new(&eng->workers, nworkers);
	if (r < 0) {
		free(eng);
		return r;
	}
	r = uv_async_init(loop, &eng->async, on_async);
	if (r < 0) {
		workers_free(eng->workers);
		free(eng);
		return r;
	}
	eng->async.data = eng;
	*out = eng;
	return 0;
}

void engine_shutdown(struct engine *eng)
{
	eng->shutdown = true;
	for (struct attachment *a = eng->atts; a; a = a->all_next)
		att_fail_pending(a, ESHUTDOWN, "daemon is shutting down");
}

static void on_async_closed(uv_handle_t *h)
{
	free(h->data);
}

struct engine *engine_free(struct engine *eng)
{
	if (!eng)
		return NULL;
	eng->shutdown = true;
	/* the workers and copy engines finish what is queued; completions are freed here */
	eng->workers = workers_free(eng->workers);
	cuda_devices_stop(eng->cuda);
	while (eng->done_head) {
		struct job *j = eng->done_head;
		eng->done_head = j->done_next;
		free(j);
	}
	while (eng->atts) {
		struct attachment *a = eng->atts;
		eng->atts = a->all_next;
		while (a->leases) {
			struct lease *l = a->leases;
			a->leases = l->next;
			free(l);
		}
		free(a);
	}
	while (eng->pipelines) {
		struct pipeline *pl = eng->pipelines;
		eng->pipelines = pl->next;
		pipeline_free(pl);
	}
	eng->cuda = cuda_devices_free(eng->cuda);
	pthread_mutex_destroy(&eng->done_lock);
	uv_close((uv_handle_t *)&eng->async, on_async_closed);
	return NULL;
}

unsigned engine_workers(const struct engine *eng)
{
	return workers_count(eng->workers);
}

uint64_t engine_memory_limit(const struct engine *eng)
{
	return eng->memory_limit;
}

uint64_t engine_memory_used(const struct engine *eng)
{
	return eng->memory_used;
}
