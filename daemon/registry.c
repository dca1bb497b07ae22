/* SPDX-License-Identifier: MIT */
/* registry - the engine's pipelines by name, and the memory budget
 *
 * Creating a pipeline opens its source, lays out its fields in a slot and
 * allocates its slab within --memory-limit; a dropped pipeline is freed once
 * no job or copy still uses it.
 */
#include "pipeline-private.h"

/* --- pipelines ---------------------------------------------------------- */

struct pipeline *engine_find(struct engine *eng, const char *name)
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

void pipeline_free(struct pipeline *pl)
{
	while (pl->streams) {
		struct stream *s = pl->streams;
		pl->streams = s->next;
		free(s->ring);
		free(s->returned);
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
void pipeline_fail(struct pipeline *pl, int err, const char *msg)
{
	if (pl->failed)
		return;
	pl->failed = true;
	snprintf(pl->error, sizeof(pl->error), "%s", msg);
	log_err("pipeline %s failed: %s", pl->spec->name, msg);
	(void)err;
	pipeline_dispatch(pl);
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
