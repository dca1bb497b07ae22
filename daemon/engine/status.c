/* SPDX-License-Identifier: MIT */
/* status - the JSON that `loaderctl status` and `pipelines` show */

#include "engine-private.h"
#include "pyworkers.h"

static const char *pipeline_state(const struct pipeline *pl)
{
	if (pl->failed)
		return "failed";
	if (!pyw_ready(pl))
		return "starting";
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

/* The broadcast stream's seed groups read (docs/spec.md, "Augment seeds"):
 * [{"seed", "clients"}], the spec's seed first, then by seed; [] without
 * broadcast clients. */
static json_t *seed_groups_json(const struct pipeline *pl)
{
	const struct stream *s = pl->shared[LDR_MODE_BROADCAST];
	json_t *a = json_array();
	bool done[AUG_GROUPS_MAX] = { false };

	for (uint32_t k = 0; s && a && k < s->ngroups; k++) {
		uint32_t best = AUG_GROUPS_MAX;
		for (uint32_t g = 0; g < s->ngroups; g++)
			if (!done[g] && (best == AUG_GROUPS_MAX ||
			                 (best && (!g || s->groups[g].seed < s->groups[best].seed))))
				best = g;
		done[best] = true;
		if (s->groups[best].natts)
			json_array_append_new(a, json_pack("{s:I, s:I}", "seed",
				(json_int_t)s->groups[best].seed, "clients",
				(json_int_t)s->groups[best].natts));
	}
	return a;
}
/* Parked batches listed at most (status stays small). */
#define PARKED_SHOWN 8

/* Into a streamed pipeline's store.stream: its batches parked (stream.c,
 * job_park()), waiting for fresh keys ("keys") or for the store to answer
 * ("store"): how many, and the first PARKED_SHOWN of them. */
static void parked_json(const struct pipeline *pl, json_t *stream)
{
	json_t *list = json_array();
	uint64_t now = uv_now(pl->eng->loop), n = 0;

	for (struct stream *s = pl->streams; s; s = s->next)
		for (const struct job *job = s->parked; job; job = job->park_next) {
			const struct batch *b = ring_at(s, job->seq);

			if (!b || (!b->outage && !b->refused))
				continue;
			if (n++ >= PARKED_SHOWN)
				continue;
			json_array_append_new(list, json_pack("{s:I, s:I, s:s, s:I, s:f, s:s}", "epoch",
				(json_int_t)b->epoch, "batch", (json_int_t)b->index, "why",
				b->outage ? "store" : "keys", "tries",
				(json_int_t)(b->outage ? job->outage_tries : b->parks), "waiting_seconds",
				b->outage && job->outage_ms ? (double)(now - job->outage_ms) / 1000.0 : 0.0,
				"error", b->errmsg ? b->errmsg : ""));
		}
	json_object_set_new(stream, "parked_batches", json_integer((json_int_t)n));
	json_object_set_new(stream, "parked", list);
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
	json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:O}",
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
		"batches_reclaimed", (json_int_t)pl->reclaimed,
		"skipped", (json_int_t)source_skipped(pl->src),
		"decoded", (json_int_t)source_decoded(pl->src),
		"index_bytes", (json_int_t)source_index_bytes(pl->src),
		"backpressure_ms", (json_int_t)(pl->backpressure_ms +
			(pl->blocked_since ? now - pl->blocked_since : 0)),
		"fields", fields,
		"devices", devices,
		"spec", pl->spec->json);
	if (o && pl->py)
		json_object_set_new(o, "python", pyw_status(pl));
	/* the slots its streams may fill, slots_total or fewer (set prefetch) */
	if (o)
		json_object_set_new(o, "prefetch", json_integer((json_int_t)pl->prefetch));
	/* its slab's slots were sized by the daemon (spec without "prefetch") */
	if (o)
		json_object_set_new(o, "prefetch_auto", json_boolean(!pl->spec->prefetch));
	if (o)
		json_object_set_new(o, "seed_groups", seed_groups_json(pl));
	if (o)
		json_object_set_new(o, "generation", json_integer((json_int_t)pl->generation));
	/* on_error "raise": batches delivered as errors, and the last one's words */
	if (o)
		json_object_set_new(o, "batches_failed", json_integer((json_int_t)pl->batch_errors));
	if (o)
		json_object_set_new(o, "last_batch_error", pl->last_batch_error[0]
		                    ? json_string(pl->last_batch_error) : json_null());
	/* a decoded-image cache: hits, misses, entries, bytes (imagecache.h) */
	if (o) {
		json_t *cache = pl->src ? source_cache_json(pl->src) : NULL;
		json_object_set_new(o, "cache", cache ? cache : json_null());
	}
	/* the kind's own keys (source_status_json()), never in place of a
	 * general key: a blend's "source" (its parts and their counts), a
	 * tokens corpus's "corpus" and "packing"; "source" is null for the
	 * kinds that say nothing of themselves there */
	if (o) {
		json_t *more = pl->src ? source_status_json(pl->src) : NULL;

		if (more)
			json_object_update_missing(o, more);
		json_decref(more);
		if (!json_object_get(o, "source"))
			json_object_set_new(o, "source", json_null());
	}
	/* the creator's store (objects.c): endpoint, region, the key id's
	 * last 4 characters; never the secret */
	if (o) {
		json_t *store = spec_store_json(pl->spec);
		/* read as a stream: its fetch-ahead (objects.c) */
		json_t *stream = store && pl->src ? source_stream_json(pl->src) : NULL;
		if (stream) {
			parked_json(pl, stream);
			json_object_set_new(store, "stream", stream);
		}
		/* read by range (objects.c): its GETs, and batches an outage parked */
		json_t *ranged = store && pl->src ? source_ranged_json(pl->src) : NULL;
		if (ranged) {
			json_object_update(store, ranged);
			json_decref(ranged);
			parked_json(pl, store);
		}
		json_object_set_new(o, "store", store ? store : json_null());
	}
	/* a reload removed it ("draining") or made a successor ("replaced") */
	if (o && pl->retired && !pl->failed)
		json_object_set_new(o, "state", json_string(retire_state(pl)));
	if (o)
		json_object_set_new(o, "stats", stats_pipeline_json(pl,
			json_string_value(json_object_get(o, "state"))));
	return o;
}

/* A duration in ms as a JSON number of seconds: whole seconds an integer. */
static json_t *secs_json(uint64_t ms)
{
	return ms % 1000 ? json_real((double)ms / 1000.0) : json_integer((json_int_t)(ms / 1000));
}

/*
 * Who owns it, who made it, how old and how long unused (docs/spec.md,
 * "Lifetime"): owner, created_by (a client id, or "config"), age_s, in_use,
 * idle_s (0 while in use), persist, linger_s (null when persistent),
 * expires_in_s (null when persistent or in use; whole seconds, rounded up).
 */
static void lifetime_json(const struct pipeline *pl, json_t *o)
{
	uint64_t now = uv_now(pl->eng->loop), linger = pipeline_linger_ms(pl);
	uint64_t idle = pl->unused && now > pl->unused_since ? now - pl->unused_since : 0;
	json_t *expires = json_null();

	if (pl->unused && !pl->persist) {
		uint64_t left = idle < linger ? linger - idle : 0;
		expires = json_integer((json_int_t)((left + 999) / 1000));
	}
	json_object_set_new(o, "owner", json_pack("{s:I, s:s?}", "uid", (json_int_t)pl->owner,
		"user", pl->owner_name[0] ? pl->owner_name : NULL));
	json_object_set_new(o, "created_by", pl->created_by ? json_integer((json_int_t)pl->created_by)
	                                                    : json_string("config"));
	json_object_set_new(o, "age_s", json_integer((json_int_t)((now - pl->created_ms) / 1000)));
	json_object_set_new(o, "in_use", json_boolean(!pl->unused));
	json_object_set_new(o, "idle_s", json_integer((json_int_t)(idle / 1000)));
	json_object_set_new(o, "persist", json_boolean(pl->persist));
	json_object_set_new(o, "linger_s", pl->persist ? json_null() : secs_json(linger));
	json_object_set_new(o, "expires_in_s", expires);
}

json_t *engine_cuda_json(struct engine *eng)
{
	return cuda_devices_json(eng->cuda);
}

static const char *const access_names[] = {
	[SPEC_ACCESS_DEFAULT] = "owner", [SPEC_ACCESS_OWNER] = "owner",
	[SPEC_ACCESS_GROUP] = "group", [SPEC_ACCESS_ALL] = "all",
};

/* "access" and, for group access, "group" (gid and name). */
static void access_json(const struct pipeline *pl, json_t *o)
{
	json_object_set_new(o, "access", json_string(access_names[pl->access]));
	if (pl->access == SPEC_ACCESS_GROUP) {
		char buf[256];
		/* cached (creds.c): no directory lookup at every Status and scrape */
		const char *name = creds_group_name(pl->group, buf, sizeof(buf));
		json_object_set_new(o, "group", json_pack("{s:I, s:s?}", "gid", (json_int_t)pl->group,
		                                          "name", name));
	}
}

json_t *engine_pipelines_json(struct engine *eng, const struct principal *who)
{
	json_t *arr = json_array();

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next) {
		json_t *o;
		if (pl->dropped)
			continue;
		if (pipeline_may_use(pl, who)) {
			o = pipeline_json(pl);
			lifetime_json(pl, o);
			json_object_set_new(o, "held_back_by", pipeline_slow_json(pl));
			json_object_set_new(o, "slow_clients_detached", json_integer((json_int_t)pl->slow_detached));
		} else {
			/* another user's private pipeline: that it exists and whose
			 * (its name is taken), nothing of its data or its clients */
			o = json_pack("{s:s}", "name", pl->spec->name);
			json_object_set_new(o, "owner", json_pack("{s:I, s:s?}", "uid", (json_int_t)pl->owner,
				"user", pl->owner_name[0] ? pl->owner_name : NULL));
		}
		access_json(pl, o);
		json_array_append_new(arr, o);
	}
	return arr;
}
