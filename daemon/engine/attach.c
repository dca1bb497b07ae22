/* SPDX-License-Identifier: MIT */
/* attach - attachments: joining a stream (engine_attach())
 *
 * An attachment is one client's reading of a pipeline in one mode: this file
 * makes it, with its seed group, its job and its stream; attachment.c is the
 * rest of its life (its Next and Release requests, its leaving).
 */
#include "engine-private.h"
#include "pyworkers.h"

/* --- attachments -------------------------------------------------------- */

/* Undo an attachment that never joined a stream. */
static void att_free_unattached(struct attachment *a)
{
	if (a->dev) {
		a->dev->natts--;
		devcopy_maybe_free(a->dev);
	}
	free(a);
}

/* No slot left for another stream of @pl: what there is, and what would
 * make room (a live prefetch below the slab's slots can be raised). */
static int no_slot_error(const struct pipeline *pl, uint32_t active, char *err, size_t errlen)
{
	const char *name = pl->spec->name;
	char has[96], fix[LDR_NAME_MAX + 128];

	if (pl->prefetch < pl->nslots)
		snprintf(has, sizeof(has), "a live prefetch of %u (its slab has %u slots)", pl->prefetch,
		         pl->nslots);
	else
		snprintf(has, sizeof(has), "%u slots", pl->nslots);
	if (active + 1 <= pl->nslots)
		snprintf(fix, sizeof(fix), "raise it with `loaderctl set prefetch %s %u`", name,
		         active + 1);
	else
		snprintf(fix, sizeof(fix), "create the pipeline with a prefetch of at least %u",
		         active + 1);
	return errfmt(-ENOSPC, err, errlen, "attach: pipeline '%s' has %s and %u streams read it "
	              "already (one per partition rank, one for its broadcast and one for its dynamic "
	              "clients): each stream needs a slot of its own; %s", name, has, active, fix);
}

/* Where a broadcast client of seed group @g starts: at the oldest batch
 * still held, as every broadcast client, from which on each batch has the
 * group's slot; else at the next batch built (docs/spec.md, "Augment seeds"). */
static uint64_t group_start(const struct stream *s, uint32_t g)
{
	uint32_t i = s->ring_len;

	/* a failed batch has no slot for any group: every client gets its error */
	while (i && (s->ring[(s->ring_head + i - 1) % s->pl->nslots].failed ||
	             batch_slot(&s->ring[(s->ring_head + i - 1) % s->pl->nslots], g)))
		i--;
	return i < s->ring_len ? s->head_seq + i : s->next_produce;
}

/* Has seed group @g of @s slots in the ring? Batches being built keep
 * those of a group whose last client left until they are done. */
static bool group_has_slots(const struct stream *s, uint32_t g)
{
	for (uint32_t i = 0; i < s->ring_len; i++)
		if (batch_slot(&s->ring[(s->ring_head + i) % s->pl->nslots], g))
			return true;
	return false;
}

/* The augment seeds read in @s, "1 (2 clients), 7 (1 client)", into @buf:
 * groups with clients but group 0 (no augment_seed, outside the limit). */
static uint32_t seeds_describe(const struct stream *s, char *buf, size_t len)
{
	size_t at = 0;
	uint32_t n = 0;

	buf[0] = 0;
	for (uint32_t g = 1; g < s->ngroups; g++)
		if (s->groups[g].natts) {
			n++;
			if (at < len)
				at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64 " (%u client%s)",
				                       at ? ", " : "", s->groups[g].seed, s->groups[g].natts,
				                       s->groups[g].natts == 1 ? "" : "s");
		}
	return n;
}

/*
 * The seed group of broadcast stream @s that a client with @seed reads,
 * made when none has it (docs/spec.md, "Augment seeds"): -ENOSPC naming the
 * limit when LDR_AUGMENT_SEEDS_MAX are in use, or when the slots do not
 * allow one more (a batch takes a slot per group read; @streams: the active
 * streams once this client reads).
 */
static int seed_group(struct stream *s, uint64_t seed, uint32_t streams, uint32_t *out,
                      char *err, size_t errlen)
{
	const struct pipeline *pl = s->pl;
	uint32_t g, free_g = AUG_GROUPS_MAX, used = 0;
	char have[AUG_GROUPS_MAX * 48], who[64];

	/* a client without augment_seed reads the stream's own seed's group */
	snprintf(who, sizeof(who), seed == s->groups[0].seed ? "the spec's seed %" PRIu64
	         " (no augment_seed, or one equal to it)" : "augment_seed %" PRIu64, seed);

	for (g = 0; g < s->ngroups; g++)
		if (s->groups[g].seed == seed)
			break;
	/* entry 0 stays the stream's seed's, and is never refused for the
	 * limit: another user's seeds must not lock out a plain client. Only
	 * groups with clients count; one whose last client left is reused once
	 * its slots went back. */
	used = seeds_describe(s, have, sizeof(have));
	for (uint32_t i = 1; i < s->ngroups && free_g == AUG_GROUPS_MAX; i++)
		if (!s->groups[i].natts && !group_has_slots(s, i))
			free_g = i;
	if (free_g == AUG_GROUPS_MAX && s->ngroups < AUG_GROUPS_MAX)
		free_g = s->ngroups;
	bool new_group = g == s->ngroups || !s->groups[g].natts;
	if (g && new_group && used >= LDR_AUGMENT_SEEDS_MAX)
		return errfmt(-ENOSPC, err, errlen, "attach: %s: pipeline '%s' "
		              "serves %u distinct augment seeds already (%s), the most one pipeline "
		              "serves (LDR_AUGMENT_SEEDS_MAX %d); attach with one of those seeds or "
		              "without augment_seed", who, pl->spec->name, used, have,
		              LDR_AUGMENT_SEEDS_MAX);
	if (g == s->ngroups && free_g == AUG_GROUPS_MAX)
		return errfmt(-EAGAIN, err, errlen, "attach: %s: pipeline '%s': the batches being "
		              "built still hold the slots of seeds whose last client left; attach "
		              "again in a moment", who, pl->spec->name);
	uint32_t k = stream_batch_slots(s) + (new_group ? 1 : 0);
	if (!s->natts)
		k = 1; /* the first client: its group alone */
	if (k > 1 && pl->prefetch / streams < k)
		return errfmt(-ENOSPC, err, errlen, "attach: %s: pipeline '%s''s "
		              "broadcast clients would read %u distinct augment seeds, so each of its "
		              "batches takes %u slots, but its prefetch of %u split between %u streams "
		              "leaves it %u; create the pipeline with a prefetch of at least %u%s",
		              who, pl->spec->name, k, k, pl->prefetch, streams, pl->prefetch / streams,
		              k * streams, k * streams <= pl->nslots ?
		              " (or raise it with `loaderctl set prefetch`)" : "");
	if (g == s->ngroups) {
		g = free_g;
		if (g == s->ngroups)
			s->ngroups++;
		s->groups[g] = (struct aug_group){ .seed = seed };
	}
	/* a group read from now on: the batches nobody has received yet are
	 * built again with its slot, so that it starts at the first of them */
	if (!s->groups[g].natts && s->natts)
		stream_rebuild_unreceived(s);
	*out = g;
	return 0;
}

/* May a client ask for an augment seed in this mode of @pl? */
static int seed_allowed(const struct pipeline *pl, const struct attach_params *p, char *err,
                        size_t errlen)
{
	if (!p->has_seed)
		return 0;
	if (p->seed > INT64_MAX)
		return errfmt(-EINVAL, err, errlen, "attach: augment_seed %" PRIu64 " is above %" PRId64
		              " (2^63 - 1): an augment seed takes a spec seed's place, and spec seeds "
		              "are 0..2^63 - 1", p->seed, INT64_MAX);
	if (p->mode == LDR_MODE_DYNAMIC)
		return errfmt(-EINVAL, err, errlen, "attach: augment_seed applies to broadcast and "
		              "partition clients: a dynamic stream's batches go to whichever client asks "
		              "first, so none can follow one client's seed");
	if (pl->py)
		return errfmt(-EINVAL, err, errlen, "attach: augment_seed: pipeline '%s' builds its "
		              "samples in Python workers, which draw from the spec's seed; augment_seed "
		              "applies to the daemon's own sources", pl->spec->name);
	return 0;
}

/* The broadcast stream's seed groups take a slot each per batch: a new
 * stream may not leave it fewer (@streams: active ones with it). */
static int groups_fit(const struct pipeline *pl, uint32_t streams, char *err, size_t errlen)
{
	const struct stream *bs = pl->shared[LDR_MODE_BROADCAST];
	uint32_t k = bs && bs->natts ? stream_batch_slots(bs) : 1;

	if (k <= 1 || pl->prefetch / streams >= k)
		return 0;
	return errfmt(-ENOSPC, err, errlen, "attach: pipeline '%s''s broadcast clients read %u "
	              "distinct augment seeds, so each of its batches takes %u slots, and a new "
	              "stream would leave it %u of its prefetch of %u (%u streams); create the "
	              "pipeline with a prefetch of at least %u", pl->spec->name, k, k,
	              pl->prefetch / streams, pl->prefetch, streams, k * streams);
}

/*
 * The window of a client of @pl that left it to the daemon: WINDOW_AUTO_BYTES
 * of its batches, within WINDOW_AUTO_MIN..MAX and, beyond the minimum, a
 * quarter of the slab's slots. Small batches get the deep window that hides
 * a round trip per batch; a window only changes when a batch arrives, never
 * which batch it is.
 */
static uint32_t window_auto(const struct pipeline *pl)
{
	uint64_t n = pl->slot_bytes ? WINDOW_AUTO_BYTES / pl->slot_bytes : WINDOW_AUTO_MAX;

	if (n > WINDOW_AUTO_MAX)
		n = WINDOW_AUTO_MAX;
	if (n > pl->nslots / 4)
		n = pl->nslots / 4;
	return n < WINDOW_AUTO_MIN ? WINDOW_AUTO_MIN : (uint32_t)n;
}

/* The start time of process @pid (/proc/PID/stat, field 22), 0 if unknown. */
static unsigned long long proc_start(int pid)
{
	char path[64], buf[1024];
	unsigned long long start = 0;
	const char *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if (pid <= 0 || !(f = fopen(path, "re")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* after the command's ")" come fields 3 (state) .. 22 (starttime) */
	if (!(p = strrchr(buf, ')')) ||
	    sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
	                  "%*d %llu", &start) != 1)
		return 0;
	return start;
}

/*
 * The job of an attach (docs/spec.md, "Jobs"): its name into @a->job and its
 * key, the uid's and the name's hash (so that another user's job is always
 * another job); without a name, the client process, by pid and start time.
 * -EINVAL for a name the client should not have sent.
 */
static int attach_job(struct attachment *a, const struct attach_params *p, uint64_t *key,
                      char *err, size_t errlen)
{
	const char *job = p->job ? p->job : "";
	size_t len = strlen(job);
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	unsigned char kind = *job ? 'j' : 'p';

	if (len > LDR_JOB_MAX)
		return errfmt(-EINVAL, err, errlen, "attach: job is %zu bytes, the most is %d", len,
		              LDR_JOB_MAX);
	for (size_t i = 0; i < len; i++)
		if (job[i] < 0x20 || job[i] > 0x7e)
			return errfmt(-EINVAL, err, errlen, "attach: job has byte 0x%02x at %zu: printable "
			              "ASCII only", (unsigned char)job[i], i);
	if (*job)
		snprintf(a->job, sizeof(a->job), "%s", job);
	else
		snprintf(a->job, sizeof(a->job), "process %d@%llu", p->pid, proc_start(p->pid));
	for (const unsigned char *c = (const unsigned char *)&p->uid; c < (const unsigned char *)(&p->uid + 1); c++)
		h = (h ^ *c) * 1099511628211ull;
	h = (h ^ kind) * 1099511628211ull;
	for (const char *c = a->job; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ull;
	*key = h;
	return 0;
}

static bool stream_has_job(const struct stream *s, uint64_t key)
{
	for (uint32_t i = 0; i < s->njob_keys; i++)
		if (s->job_keys[i] == key)
			return true;
	return false;
}

static void stream_add_job(struct stream *s, uint64_t key)
{
	if (stream_has_job(s, key))
		return;
	if (s->njob_keys == STREAM_JOBS_MAX)
		memmove(s->job_keys, s->job_keys + 1, --s->njob_keys * sizeof(s->job_keys[0]));
	s->job_keys[s->njob_keys++] = key;
}

/* An attach's refusals before anything is made: who asks, the pipeline's
 * state, the parameters. */
static int attach_check(struct engine *eng, struct pipeline *pl, const char *name,
                        const struct attach_params *p, uint32_t world, char *err, size_t errlen)
{
	int r;

	if (p->who && !pipeline_may_use(pl, p->who))
		return pipeline_owned_error(pl, -EACCES, "", err, errlen);
	if (pl->failed)
		return errfmt(-EIO, err, errlen, "pipeline '%s' failed: %s", name, pl->error);
	if ((r = holds_may_attach(eng, p->uid, err, errlen)) < 0)
		return r;
	if (p->who && (r = bounds_may_attach(eng, p->who, name, err, errlen)) < 0)
		return r;
	if (!pyw_ready(pl))
		/* before the seal a client could map the slab writable (pyworkers.c) */
		return errfmt(-EAGAIN, err, errlen, "pipeline '%s': its Python workers are starting "
		              "(%s); attach again in a moment", name, pyw_state(pl));
	if (p->mode < 0 || p->mode > LDR_MODE_DYNAMIC)
		return errfmt(-EINVAL, err, errlen, "attach: unknown mode %d", p->mode);
	if (p->mode != LDR_MODE_PARTITION && (p->rank || world != 1 || p->has_start ||
	                                      p->has_start_position))
		return errfmt(-EINVAL, err, errlen,
		              "attach: rank, world_size and start apply to partition mode only");
	if (p->has_start_position && (!p->has_start || p->client_order))
		return errfmt(-EINVAL, err, errlen, "attach: start_position %s", p->client_order ?
		              "is the daemon's order's: a client_order attachment gives its own" :
		              "needs has_start (start_epoch says which epoch it is a position of)");
	if (world > 1u << 20 || p->rank >= world)
		return errfmt(-EINVAL, err, errlen,
		              "attach: rank %u out of range for world_size %u", p->rank, world);
	if (p->client_order && (p->mode != LDR_MODE_PARTITION || p->rank || world != 1))
		return errfmt(-EINVAL, err, errlen, "attach: client_order is for a partition attachment "
		              "of rank 0 of 1 (a stream of its own: the order it gives is its share)");
	if (p->credits > ATTACH_MAX_CREDITS)
		return errfmt(-EINVAL, err, errlen,
		              "attach: credits %u above the limit of %d", p->credits, ATTACH_MAX_CREDITS);
	return 0;
}

/* A client_order attachment's stream: its own, whose batches its client
 * gives (order.c); NULL when out of memory. */
static struct stream *attach_order_stream(struct pipeline *pl, const struct attach_params *p,
                                          struct attachment *a)
{
	struct stream *s = stream_new(pl, LDR_MODE_PARTITION, 0, 1);

	if (!s)
		return NULL;
	s->client_order = true;
	s->bpe = 0;
	s->end_seq = UINT64_MAX;
	if (p->has_start) {
		s->corder.next_epoch = p->start_epoch;
		s->corder.next_batch = p->start_batch;
	}
	if (p->has_seed && source_augments(pl->src))
		s->groups[0].seed = p->seed;
	a->cursor = 0;
	return s;
}

/*
 * An elastic resume (docs/spec.md, "Partition"): epoch @p->start_epoch of
 * @s is the tail from position @p->start_position of its permutation, which
 * the ranks of another world size (or this one) read up to there.
 */
static int attach_tail(struct stream *s, const struct attach_params *p, char *err, size_t errlen)
{
	uint64_t n = s->sampler.nsamples;

	if (p->start_position > n)
		return errfmt(-EINVAL, err, errlen, "attach: start_position %" PRIu64 " is past the "
		              "end of the epoch: pipeline '%s' has %" PRIu64 " samples", p->start_position,
		              s->pl->spec->name, n);
	s->sampler.tail_epoch = p->start_epoch;
	s->sampler.tail_start = p->start_position;
	return 0;
}

/* A partition attachment's stream: its own, from its start. Return: 0 with
 * *@out, or a negative errno with @err set (the stream dropped). */
static int attach_partition_stream(struct pipeline *pl, const struct attach_params *p,
                                   uint32_t world, struct attachment *a, struct stream **out,
                                   char *err, size_t errlen)
{
	struct stream *s = stream_new(pl, p->mode, p->rank, world);
	uint64_t start = 0;
	int r;

	if (!s)
		return errfmt(-ENOMEM, err, errlen, "attach: out of memory");
	if (s->bpe == 0) {
		r = errfmt(-EINVAL, err, errlen,
		           "attach: rank %u of %u gets no batch (%" PRIu64 " samples, batch_size %u)",
		           p->rank, world, s->sampler.nsamples, pl->spec->batch_size);
		goto drop_stream;
	}
	if (p->has_start_position && (r = attach_tail(s, p, err, errlen)) < 0)
		goto drop_stream;
	if (p->has_start) {
		/* a tail: its first batch (a later one: a reconnect); a tail with
		 * nothing for this rank (skip == bpe) starts at the next epoch */
		uint64_t skip = sampler_epoch_skip(&s->sampler, p->start_epoch);
		uint64_t batch = p->start_batch > skip ? p->start_batch : skip;

		if ((batch >= s->bpe && !(batch == skip && p->start_batch < s->bpe)) ||
		    __builtin_mul_overflow(p->start_epoch, s->bpe, &start) ||
		    __builtin_add_overflow(start, batch, &start) ||
		    start > s->end_seq) {
			r = errfmt(-EINVAL, err, errlen,
			           "attach: start (epoch %" PRIu64 ", batch %" PRIu64 ") is outside the stream "
			           "(%" PRIu64 " batches per epoch, %" PRIu64 " epochs)",
			           p->start_epoch, p->start_batch, s->bpe, pl->spec->epochs);
			goto drop_stream;
		}
	}
	s->next_produce = s->head_seq = s->cursor = start;
	a->cursor = start;
	/* its own stream: the seed is the stream's (a pure function of
	 * (spec, seed, epoch, index), as a reconnect needs) */
	if (p->has_seed && source_augments(pl->src))
		s->groups[0].seed = p->seed;
	*out = s;
	return 0;

drop_stream:
	/* a partition stream made for this attachment alone, refused */
	s->dead = true;
	pl->nstreams--;
	stream_maybe_free(s);
	return r;
}

/* A broadcast or dynamic attachment's stream: the pipeline's shared one of
 * its mode, made (or made anew for another job) when no client reads it;
 * @nstreams: the active streams with it. Return: 0 with *@out, or a negative
 * errno with @err set. */
static int attach_shared_stream(struct pipeline *pl, const struct attach_params *p,
                                const char *name, uint64_t job_key, uint32_t nstreams,
                                struct attachment *a, struct stream **out, char *err,
                                size_t errlen)
{
	struct stream *s = pl->shared[p->mode];
	int r;

	/* a stream the clients of other jobs left: this job's starts anew,
	 * as on a fresh daemon; a config pipeline's is a service, shared by
	 * every job (docs/spec.md, "Jobs") */
	if (s && !s->natts && !pl->from_config && !stream_has_job(s, job_key)) {
		char q[LOG_QUOTE_MAX], q2[LOG_QUOTE_MAX];
		log_event(LOG_INFO, "stream.restart", "pipeline=%s mode=%s job=%s why=\"the jobs "
		          "that read it have left\"", log_quote(q2, name), mode_name(p->mode),
		          log_quote(q, a->job));
		stream_retire(s);
		s = NULL;
	}
	if (!s) {
		s = stream_new(pl, p->mode, 0, 1);
		if (!s)
			return errfmt(-ENOMEM, err, errlen, "attach: out of memory");
		pl->shared[p->mode] = s;
	}
	a->cursor = s->ring_len ? s->head_seq : s->next_produce;
	if (p->mode == LDR_MODE_BROADCAST && source_augments(pl->src)) {
		uint64_t seed = p->has_seed ? p->seed : s->groups[0].seed;
		r = seed_group(s, seed, nstreams, &a->group, err, errlen);
		if (r < 0)
			return r;
	}
	a->cursor = group_start(s, a->group);
	*out = s;
	return 0;
}

/* @a, on @s, into its stream, its pipeline and the engine: attached. */
static void attach_link(struct engine *eng, struct pipeline *pl, struct stream *s,
                        struct attachment *a, const struct attach_params *p, uint32_t world,
                        uint64_t job_key)
{
	a->eng = eng;
	a->pl = pl;
	a->stream = s;
	a->id = ++eng->att_ctr;
	a->client_id = p->client_id;
	a->uid = p->uid;
	a->admin = !p->who || p->who->admin;
	a->pid = p->pid;
	a->mode = p->mode;
	a->rank = p->rank;
	a->world = world;
	a->credits = p->credits ? p->credits : window_auto(pl);
	a->credits_auto = !p->credits;
	a->has_seed = p->has_seed;
	a->seed = p->seed;
	s->groups[a->group].natts++;
	stream_add_job(s, job_key);
	a->start_seq = a->cursor;
	a->rv_dno = UINT64_MAX;
	a->end_dno = UINT64_MAX;
	a->token_valid = true;
	a->token_expiry = uv_now(eng->loop) + TOKEN_TTL_MS;
	a->next = s->atts;
	s->atts = a;
	s->natts++;
	pl->natts++;
	a->all_next = eng->atts;
	eng->atts = a;
	stats_att_init(a);
}

int engine_attach(struct engine *eng, const char *name, const struct attach_params *p,
                  struct attachment **out, char *err, size_t errlen)
{
	struct pipeline *pl = engine_find(eng, name);
	struct attachment *a;
	struct stream *s = NULL;
	uint32_t world = p->world ? p->world : 1;
	char rerr[256];
	uint64_t job_key = 0;
	int r;

	if (eng->shutdown)
		return errfmt(-ESHUTDOWN, err, errlen, "daemon is shutting down");
	if (!pl && (pl = engine_find_retired(eng, name)) && pl->retired == RETIRE_DRAIN)
		return errfmt(-ENOENT, err, errlen, "pipeline '%s' was removed from the config by a "
		              "reload: its clients finish their epoch, no new ones attach", name);
	if (!pl)
		return errfmt(-ENOENT, err, errlen, "no pipeline named '%s'", name);
	if ((r = attach_check(eng, pl, name, p, world, err, errlen)) < 0)
		return r;
	struct stream *shared = p->mode == LDR_MODE_PARTITION ? NULL : pl->shared[p->mode];
	uint32_t active = pipeline_active_streams(pl);
	bool new_stream = !shared || !shared->natts;
	if (new_stream && active >= pl->prefetch)
		return no_slot_error(pl, active, err, errlen);
	if ((r = seed_allowed(pl, p, err, errlen)) < 0 ||
	    (new_stream && p->mode != LDR_MODE_BROADCAST && (r = groups_fit(pl, active + 1, err, errlen)) < 0))
		return r;
	a = calloc(1, sizeof(*a));
	if (!a)
		return errfmt(-ENOMEM, err, errlen, "attach: out of memory");
	if ((r = attach_job(a, p, &job_key, err, errlen)) < 0) {
		free(a);
		return r;
	}
	if (getrandom(a->token, sizeof(a->token), 0) != sizeof(a->token)) {
		r = errfmt(-EAGAIN, err, errlen, "attach: no random bytes for the fd-channel token: %s",
		           strerror(errno));
		free(a);
		return r;
	}
	if (p->cuda) {
		r = devcopy_get(pl, p->cuda, &a->dev, err, errlen);
		if (r < 0) {
			free(a);
			return r;
		}
	}
	if (p->client_order) {
		s = attach_order_stream(pl, p, a);
		r = s ? 0 : errfmt(-ENOMEM, err, errlen, "attach: out of memory");
	} else if (p->mode == LDR_MODE_PARTITION) {
		r = attach_partition_stream(pl, p, world, a, &s, err, errlen);
	} else {
		r = attach_shared_stream(pl, p, name, job_key, active + (new_stream ? 1 : 0), a, &s,
		                         err, errlen);
	}
	if (r < 0) {
		att_free_unattached(a);
		return r;
	}
	attach_link(eng, pl, s, a, p, world, job_key);
	if (p->ring && !a->dev && attring_open(a, rerr, sizeof(rerr)) < 0)
		/* the client reads through Next requests instead */
		log_warn("attach %" PRIu64 " (pipeline '%s'): no batch ring: %s", a->id, name, rerr);
	*out = a;
	pipeline_lifetime(pl);
	pipeline_update(pl);
	attring_start(a);
	return 0;
}
