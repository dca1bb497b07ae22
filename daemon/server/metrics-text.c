/* SPDX-License-Identifier: MIT */
/* metrics-text - the Status JSON as Prometheus text exposition (format 0.0.4)
 *
 * Built from the very JSON that `loaderctl status` shows (server_status_json()),
 * so the two never disagree and a field added to the status is one table line
 * here. Families follow Prometheus's naming conventions: the loaderd_ prefix,
 * base units in the name (_seconds, _bytes), counters end in _total, 0..1
 * values in _ratio; each family's samples come together after its HELP and
 * TYPE lines. A family is listed even when nothing has a sample of it yet.
 *
 * Labels: pipeline (its name) and generation (what tells a reload's replaced
 * pipeline from its successor of the same name) on pipeline families; on
 * client families the pipeline, client (the connection's id), client_name
 * (its Hello name), uid and attachment (its id: one connection may attach a pipeline twice). They
 * come and go with connections; docs/metrics.md says what that costs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "metrics.h"

/* A number of the status JSON, by a dotted path ("stats.batches_total");
 * "a|b": the first of them that is there. NULL when none is a number. */
static json_t *get_num(json_t *o, const char *paths)
{
	char buf[128];
	char *save = NULL, *alt;

	snprintf(buf, sizeof(buf), "%s", paths);
	for (alt = strtok_r(buf, "|", &save); alt; alt = strtok_r(NULL, "|", &save)) {
		json_t *v = o;
		char *s2 = NULL, *key;
		for (key = strtok_r(alt, ".", &s2); key && v; key = strtok_r(NULL, ".", &s2))
			v = json_object_get(v, key);
		if (json_is_number(v) || json_is_boolean(v))
			return v;
	}
	return NULL;
}

static void put_value(FILE *f, json_t *v)
{
	double d;

	if (json_is_integer(v)) {
		fprintf(f, " %lld\n", (long long)json_integer_value(v));
		return;
	}
	if (json_is_boolean(v)) {
		fprintf(f, " %d\n", json_is_true(v));
		return;
	}
	d = json_real_value(v);
	if (isnan(d))
		fputs(" NaN\n", f);
	else if (isinf(d))
		fputs(d > 0 ? " +Inf\n" : " -Inf\n", f);
	else
		fprintf(f, " %.15g\n", d);
}

/* A label value: backslash, double quote and newline escaped. */
static void put_escaped(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*s, f);
	}
}

static void put_label(FILE *f, bool *first, const char *key, const char *val)
{
	fprintf(f, "%s%s=\"", *first ? "" : ",", key);
	put_escaped(f, val);
	fputc('"', f);
	*first = false;
}

/* name{labels,key="val"} — @labels is preformatted (may be ""), @key may be NULL. */
static void put_name(FILE *f, const char *name, const char *suffix, const char *labels,
                     const char *key, const char *val)
{
	bool first = !*labels;

	fprintf(f, "%s%s", name, suffix);
	if (!*labels && !key)
		return;
	fprintf(f, "{%s", labels);
	if (key)
		put_label(f, &first, key, val);
	fputc('}', f);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

struct num_metric {
	const char *name, *type, *help;
	const char *path;         /* get_num()'s */
	double scale;             /* 0: as is; else multiply (ms to s) */
};

/* A counter never goes down, so never below 0: a negative one (a client's
 * report that did not add up, a bug) is left out rather than shown as a
 * reset to Prometheus's rate(). */
static bool bad_counter(json_t *v)
{
	return json_number_value(v) < 0;
}

static void put_num(FILE *f, const struct num_metric *nm, const char *labels, json_t *v)
{
	if (strcmp(nm->type, "counter") == 0 && bad_counter(v))
		return;
	put_name(f, nm->name, "", labels, NULL, NULL);
	if (nm->scale) {
		json_t *d = json_real(json_number_value(v) * nm->scale);
		put_value(f, d);
		json_decref(d);
	} else {
		put_value(f, v);
	}
}

/* Labels of every object of @arr, preformatted. */
struct labelled {
	json_t *obj;
	char *labels;
};

static char *pipeline_labels(json_t *pl)
{
	char *buf = NULL, num[32];
	size_t len;
	bool first = true;
	FILE *f = open_memstream(&buf, &len);
	const char *name = json_string_value(json_object_get(pl, "name"));
	json_t *gen = json_object_get(pl, "generation");

	if (!f)
		return NULL;
	put_label(f, &first, "pipeline", name ? name : "");
	/* a reload's replaced or draining pipeline and the one made after it
	 * have the same name while both are there; without it their series
	 * would be the same and Prometheus would refuse the whole scrape */
	if (json_is_integer(gen)) {
		snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(gen));
		put_label(f, &first, "generation", num);
	}
	fclose(f);
	return buf;
}

static char *attachment_labels(json_t *cl, json_t *att)
{
	char *buf = NULL, num[32];
	size_t len;
	bool first = true;
	FILE *f = open_memstream(&buf, &len);
	const char *pl = json_string_value(json_object_get(att, "pipeline"));
	const char *name = json_string_value(json_object_get(cl, "name"));

	if (!f)
		return NULL;
	put_label(f, &first, "pipeline", pl ? pl : "");
	snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(json_object_get(cl, "id")));
	put_label(f, &first, "client", num);
	put_label(f, &first, "client_name", name ? name : "");
	snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(json_object_get(cl, "uid")));
	put_label(f, &first, "uid", num);
	snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(json_object_get(att, "id")));
	put_label(f, &first, "attachment", num);
	fclose(f);
	return buf;
}

static void put_nums(FILE *f, const struct num_metric *tab, size_t n, const struct labelled *objs,
                     size_t nobjs)
{
	for (size_t i = 0; i < n; i++) {
		family(f, tab[i].name, tab[i].type, tab[i].help);
		for (size_t j = 0; j < nobjs; j++) {
			json_t *v = get_num(objs[j].obj, tab[i].path);
			if (v)
				put_num(f, &tab[i], objs[j].labels, v);
		}
	}
}

static const struct num_metric daemon_metrics[] = {
	{ "loaderd_uptime_seconds", "gauge", "Seconds since the daemon started.", "uptime_s", 0 },
	{ "loaderd_workers", "gauge", "Worker threads of the daemon's pool.", "workers", 0 },
	{ "loaderd_memory_limit_bytes", "gauge", "Most memory for batch slots and image caches (memory_limit).",
	  "memory_limit", 0 },
	{ "loaderd_memory_used_bytes", "gauge", "Memory of batch slots (held-after-drop slabs included) and image caches now.",
	  "memory_used", 0 },
	{ "loaderd_memory_held_after_drop_bytes", "gauge",
	  "Slab memory of dropped pipelines that clients still map.", "memory_held_after_drop", 0 },
	{ "loaderd_object_cache_limit_bytes", "gauge", "The object cache's bound (cache_bytes).",
	  "object_cache.cache_bytes", 0 },
	{ "loaderd_object_cache_used_bytes", "gauge", "Bytes of objects in the object cache now.",
	  "object_cache.bytes_used", 0 },
	{ "loaderd_object_cache_objects", "gauge", "Objects in the object cache now.", "object_cache.objects", 0 },
	{ "loaderd_object_cache_hits_total", "counter", "Objects a source found in the object cache.",
	  "object_cache.hits", 0 },
	{ "loaderd_object_cache_misses_total", "counter", "Objects fetched into the object cache.",
	  "object_cache.misses", 0 },
	{ "loaderd_object_cache_fetched_bytes_total", "counter", "Bytes fetched from object stores.",
	  "object_cache.bytes_fetched", 0 },
	{ "loaderd_object_cache_evictions_total", "counter", "Objects evicted from the object cache.",
	  "object_cache.evictions", 0 },
	{ "loaderd_object_cache_checksum_mismatches_total", "counter",
	  "Bodies fetched whole that did not match their ETag's MD5 or x-amz-checksum-* (each tried again).",
	  "object_cache.checksum_mismatches", 0 },
	{ "loaderd_object_cache_rechecked_total", "counter",
	  "Cached objects of another boot read and checked against their CRC32C at their first open.",
	  "object_cache.rechecked", 0 },
	{ "loaderd_object_cache_recheck_failures_total", "counter",
	  "Of those, objects a crash of the machine had torn (deleted and fetched again).",
	  "object_cache.recheck_failures", 0 },
	{ "loaderd_object_store_ranged_gets_total", "counter",
	  "Ranged GETs read straight into samples (objects read by range, not cached).",
	  "object_cache.ranged_gets", 0 },
	{ "loaderd_object_store_ranged_bytes_total", "counter", "Bytes of those ranged GETs.",
	  "object_cache.ranged_bytes", 0 },
	{ "loaderd_object_cache_fetching_objects", "gauge", "Objects being fetched into the object cache now.",
	  "object_cache.fetching", 0 },
	{ "loaderd_object_cache_fetching_bytes", "gauge", "Bytes of the objects being fetched now.",
	  "object_cache.fetching_bytes", 0 },
	{ "loaderd_object_cache_fetch_ahead_bytes", "gauge",
	  "What one streamed pipeline holds fetched ahead at most (fetch_ahead).", "object_cache.fetch_ahead", 0 },
};

static const struct num_metric pipeline_metrics[] = {
	{ "loaderd_pipeline_clients", "gauge", "Attachments reading the pipeline.", "clients", 0 },
	{ "loaderd_pipeline_stream_ahead_objects", "gauge",
	  "Objects of a streamed pipeline fetched ahead, not yet read.", "store.stream.ahead_objects", 0 },
	{ "loaderd_pipeline_stream_ahead_bytes", "gauge",
	  "Bytes of a streamed pipeline fetched ahead, not yet read.", "store.stream.ahead_bytes", 0 },
	{ "loaderd_pipeline_stream_fetching_objects", "gauge",
	  "Objects a streamed pipeline's fetch-ahead fetches now.", "store.stream.fetching_objects", 0 },
	{ "loaderd_pipeline_stream_fetching_bytes", "gauge",
	  "Bytes of the objects a streamed pipeline's fetch-ahead fetches now.", "store.stream.fetching_bytes", 0 },
	{ "loaderd_pipeline_stream_readers_waiting", "gauge",
	  "Reads of a streamed pipeline waiting for their object now.", "store.stream.readers_waiting", 0 },
	{ "loaderd_pipeline_stream_reads_waited_total", "counter",
	  "Reads of a streamed pipeline that waited for their object.", "store.stream.reads_waited", 0 },
	{ "loaderd_pipeline_stream_wait_seconds_total", "counter",
	  "Seconds the reads of a streamed pipeline waited for their objects.", "store.stream.wait_seconds", 0 },
	{ "loaderd_pipeline_slot_bytes", "gauge", "Bytes of one batch slot.", "slot_bytes", 0 },
	{ "loaderd_pipeline_dataset_samples", "gauge", "Samples in one epoch of the dataset.", "samples", 0 },
	{ "loaderd_pipeline_batch_size", "gauge", "Samples per batch.", "batch_size", 0 },
	{ "loaderd_pipeline_batches_per_epoch", "gauge", "Batches in one epoch.", "batches_per_epoch", 0 },
	{ "loaderd_pipeline_batches_total", "counter", "Batches built.",
	  "stats.batches_total|batches_produced", 0 },
	{ "loaderd_pipeline_samples_total", "counter", "Samples built into batches.",
	  "stats.samples_total", 0 },
	{ "loaderd_pipeline_bytes_total", "counter", "Bytes of the batches built.", "stats.bytes_total", 0 },
	{ "loaderd_pipeline_batches_reclaimed_total", "counter",
	  "Built batches nobody had received, taken back for another stream and built again later.",
	  "batches_reclaimed", 0 },
	{ "loaderd_pipeline_skipped_samples_total", "counter",
	  "Samples skipped as unreadable (the spec's on_error).", "stats.skipped_total|skipped", 0 },
	{ "loaderd_pipeline_decoded_images_total", "counter",
	  "Images decoded: one decode serves every augment seed of a sample.", "decoded", 0 },
	{ "loaderd_pipeline_errors_total", "counter", "Errors while building batches.",
	  "stats.errors_total", 0 },
	{ "loaderd_pipeline_backpressure_seconds_total", "counter",
	  "Seconds the pipeline waited for its slowest broadcast reader with every slot full.",
	  "backpressure_ms", 1e-3 },
	{ "loaderd_pipeline_slow_clients_detached_total", "counter",
	  "Clients detached for holding a broadcast back too long.", "slow_clients_detached", 0 },
	{ "loaderd_pipeline_worker_seconds_total", "counter",
	  "Worker seconds spent building the pipeline's batches.", "stats.worker_seconds_total", 0 },
	{ "loaderd_pipeline_workers_busy_ratio", "gauge",
	  "Worker seconds per second over the pool size, over the last window_s seconds (0..1).",
	  "stats.workers_busy", 0 },
	{ "loaderd_pipeline_jobs", "gauge", "Batches being built now.", "stats.jobs", 0 },
	{ "loaderd_pipeline_workers", "gauge",
	  "Workers that build the pipeline's batches: the daemon's pool, or its own Python workers.",
	  "stats.workers", 0 },
	/* image pipelines with "cache": {"decoded": true} (docs/spec.md) */
	{ "loaderd_pipeline_image_cache_hits_total", "counter",
	  "Samples cut from decoded images the cache kept.", "cache.hits", 0 },
	{ "loaderd_pipeline_image_cache_misses_total", "counter",
	  "Samples read and decoded from their file under a decoded-image cache.", "cache.misses", 0 },
	{ "loaderd_pipeline_image_cache_entries", "gauge", "Decoded images the cache holds.",
	  "cache.entries", 0 },
	{ "loaderd_pipeline_image_cache_used_bytes", "gauge",
	  "Bytes of the cache's arena its images take.", "cache.bytes_used", 0 },
	{ "loaderd_pipeline_image_cache_bytes", "gauge",
	  "Bytes reserved for the cache, counted in the memory used.", "cache.bytes", 0 },
	{ "loaderd_pipeline_image_cache_refused_total", "counter",
	  "Images not kept: the cache was full.", "cache.refused", 0 },
};

static const struct num_metric client_metrics[] = {
	{ "loaderd_client_batches_total", "counter", "Batches delivered to the attachment.",
	  "stats.batches_total|delivered", 0 },
	{ "loaderd_client_samples_total", "counter", "Samples delivered to the attachment.",
	  "stats.samples_total", 0 },
	{ "loaderd_client_bytes_total", "counter", "Bytes delivered to the attachment.",
	  "stats.bytes_total", 0 },
	{ "loaderd_client_leases", "gauge", "Batches the client holds now (not yet released).", "leases", 0 },
	{ "loaderd_client_pending_requests", "gauge", "Next requests of the client waiting for a batch.",
	  "pending", 0 },
	{ "loaderd_client_lag_batches", "gauge", "Batches ready for the client that it was not given yet.",
	  "stats.lag_batches", 0 },
	{ "loaderd_client_starving", "gauge",
	  "1 while the client waits in ldr_next() and nothing is ready for it.", "stats.starving", 0 },
	{ "loaderd_client_wait_ratio", "gauge",
	  "Share of the client's time spent waiting in ldr_next() over the last window_s seconds (0..1).",
	  "stats.wait_fraction", 0 },
	{ "loaderd_client_compute_seconds_total", "counter",
	  "Seconds the client spent between ldr_next() calls (its own work).",
	  "stats.compute_seconds_total", 0 },
	{ "loaderd_client_next_calls_total", "counter", "ldr_next() calls the client reported.",
	  "stats.next_calls_total", 0 },
	{ "loaderd_client_bad_reports_total", "counter",
	  "Stall reports of the client that did not add up, ignored.", "stats.bad_reports", 0 },
};

/* A gauge with one sample per value of @key, 1 for the value @o has, 0 for the
 * others: an enum (a pipeline's state, what limits it). */
static void put_enum(FILE *f, const char *name, const char *help, const char *key,
                     const char *const *values, const struct labelled *objs, size_t nobjs,
                     const char *path)
{
	family(f, name, "gauge", help);
	for (size_t j = 0; j < nobjs; j++) {
		json_t *o = objs[j].obj;
		char buf[64], *save = NULL, *k;
		const char *now;

		snprintf(buf, sizeof(buf), "%s", path);
		for (k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
			o = json_object_get(o, k);
		if (!(now = json_string_value(o)))
			continue;
		for (size_t v = 0; values[v]; v++) {
			put_name(f, name, "", objs[j].labels, key, values[v]);
			fprintf(f, " %d\n", strcmp(now, values[v]) == 0);
		}
	}
}

/* status.c's states, and retire.c's: a reload removed it or replaced it */
static const char *const pipeline_states[] = { "starting", "running", "done", "failed", "draining",
                                               "replaced", NULL };
static const char *const limits[] = { "consumers", "workers", "io", "slots", "idle", "done", "failed",
                                      "starting", NULL };
static const char *const stages[] = { "read", "decode", "transform", "collate", NULL };

/* Slots by state: ready (built, no client holds it), leased, free, and
 * filling (the rest: being built, the stats' jobs). They sum to the
 * pipeline's slots. */
static void put_slots(FILE *f, const struct labelled *objs, size_t nobjs)
{
	family(f, "loaderd_pipeline_slots", "gauge", "Batch slots of the pipeline, by state "
	       "(ready, leased, free, filling); they sum to its slots.");
	for (size_t j = 0; j < nobjs; j++) {
		json_t *pl = objs[j].obj;
		json_t *st = json_object_get(pl, "stats");
		json_int_t total = json_integer_value(json_object_get(pl, "slots_total"));
		json_int_t in_use = json_integer_value(json_object_get(pl, "slots_in_use"));
		json_int_t leased = json_integer_value(json_object_get(pl, "slots_leased"));
		json_int_t ready, free_, filling;

		if (!json_object_get(pl, "slots_total"))
			continue;
		if (json_is_integer(json_object_get(st, "slots_ready"))) {
			ready = json_integer_value(json_object_get(st, "slots_ready"));
			leased = json_integer_value(json_object_get(st, "slots_leased"));
			free_ = json_integer_value(json_object_get(st, "slots_free"));
		} else {
			/* in use and not leased: built and waiting for a reader */
			ready = in_use - leased;
			free_ = total - in_use;
		}
		filling = total - ready - leased - free_;
		put_name(f, "loaderd_pipeline_slots", "", objs[j].labels, "state", "ready");
		fprintf(f, " %lld\n", (long long)ready);
		put_name(f, "loaderd_pipeline_slots", "", objs[j].labels, "state", "leased");
		fprintf(f, " %lld\n", (long long)leased);
		put_name(f, "loaderd_pipeline_slots", "", objs[j].labels, "state", "free");
		fprintf(f, " %lld\n", (long long)free_);
		put_name(f, "loaderd_pipeline_slots", "", objs[j].labels, "state", "filling");
		fprintf(f, " %lld\n", (long long)(filling > 0 ? filling : 0));
	}
}

static void put_stages(FILE *f, const struct labelled *objs, size_t nobjs)
{
	family(f, "loaderd_pipeline_stage_seconds_total", "counter",
	       "Worker seconds spent in each stage of building batches (read, decode, transform, collate).");
	for (size_t j = 0; j < nobjs; j++) {
		json_t *st = json_object_get(json_object_get(objs[j].obj, "stats"), "stage_seconds_total");
		for (size_t s = 0; stages[s]; s++) {
			json_t *v = json_object_get(st, stages[s]);
			if (!json_is_number(v) || bad_counter(v))
				continue;
			put_name(f, "loaderd_pipeline_stage_seconds_total", "", objs[j].labels, "stage", stages[s]);
			put_value(f, v);
		}
	}
}

/* A blend's parts (status "source.parts"): samples read from each, and what
 * it takes of each per epoch; labels part (its index) and part_name. */
static void put_blend_parts(FILE *f, const struct labelled *objs, size_t nobjs)
{
	static const struct { const char *name, *type, *help, *key; } fams[] = {
		{ "loaderd_pipeline_blend_samples_total", "counter",
		  "Samples read from each part of a blend into batches.", "samples_read" },
		{ "loaderd_pipeline_blend_samples_per_epoch", "gauge",
		  "Samples one epoch of a blend takes from each part.", "samples_per_epoch" },
	};

	for (size_t m = 0; m < sizeof(fams) / sizeof(fams[0]); m++) {
		family(f, fams[m].name, fams[m].type, fams[m].help);
		for (size_t j = 0; j < nobjs; j++) {
			json_t *parts = json_object_get(json_object_get(objs[j].obj, "source"), "parts");
			json_t *part;
			size_t k;

			json_array_foreach(parts, k, part) {
				json_t *v = json_object_get(part, fams[m].key);
				const char *pname = json_string_value(json_object_get(part, "name"));
				char idx[24];
				bool first = false;

				if (!json_is_integer(v))
					continue;
				snprintf(idx, sizeof(idx), "%zu", k);
				fprintf(f, "%s{%s", fams[m].name, objs[j].labels);
				first = !*objs[j].labels;
				put_label(f, &first, "part", idx);
				put_label(f, &first, "part_name", pname ? pname : "");
				fputc('}', f);
				put_value(f, v);
			}
		}
	}
}

/* loaderd_client_wait_seconds: the client's per-bucket counts made
 * cumulative, as Prometheus histograms are; +Inf is the sum of every bucket
 * and _count the same, so the histogram is consistent even if the client's
 * own count disagreed. */
static void put_wait_histogram(FILE *f, const struct labelled *objs, size_t nobjs)
{
	static const char name[] = "loaderd_client_wait_seconds";

	family(f, name, "histogram", "Time the client waited in ldr_next() for a batch.");
	for (size_t j = 0; j < nobjs; j++) {
		json_t *h = json_object_get(json_object_get(objs[j].obj, "stats"), "wait_histogram");
		json_t *le = json_object_get(h, "le"), *counts = json_object_get(h, "counts");
		size_t n = json_array_size(le);
		long long cum = 0;
		char bound[32];

		if (!json_is_array(le) || json_array_size(counts) != n + 1)
			continue;
		for (size_t b = 0; b <= n; b++) {
			json_int_t c = json_integer_value(json_array_get(counts, b));
			cum += c > 0 ? (long long)c : 0; /* buckets only ever rise */
			if (b == n)
				snprintf(bound, sizeof(bound), "+Inf");
			else
				snprintf(bound, sizeof(bound), "%g", json_number_value(json_array_get(le, b)));
			put_name(f, name, "_bucket", objs[j].labels, "le", bound);
			fprintf(f, " %lld\n", cum);
		}
		put_name(f, name, "_sum", objs[j].labels, NULL, NULL);
		if (json_is_number(json_object_get(h, "sum_s")) && !bad_counter(json_object_get(h, "sum_s")))
			put_value(f, json_object_get(h, "sum_s"));
		else
			fputs(" 0\n", f);
		put_name(f, name, "_count", objs[j].labels, NULL, NULL);
		fprintf(f, " %lld\n", cum);
	}
}

static void put_daemon(FILE *f, json_t *status)
{
	const char *version = json_string_value(json_object_get(status, "version"));
	struct labelled self = { status, "" };
	char proto[16];
	bool first = true;
	static const char *const swept[][2] = {
		{ "clients", "clients_released_by_sweep" },
		{ "probes", "probes_released_by_sweep" },
		{ "nng_fds", "nng_fds_closed_by_sweep" },
	};

	family(f, "loaderd_build_info", "gauge", "Always 1; the labels say which loaderd runs.");
	snprintf(proto, sizeof(proto), "%lld", (long long)json_integer_value(json_object_get(status, "protocol")));
	fputs("loaderd_build_info{", f);
	put_label(f, &first, "version", version ? version : LOADERD_VERSION);
	put_label(f, &first, "protocol", proto);
	fputs("} 1\n", f);
	put_nums(f, daemon_metrics, sizeof(daemon_metrics) / sizeof(daemon_metrics[0]), &self, 1);
	family(f, "loaderd_clients", "gauge", "Clients connected (the daemon's own probes not counted).");
	fprintf(f, "loaderd_clients %zu\n", json_array_size(json_object_get(status, "clients")));
	family(f, "loaderd_sweep_released_total", "counter", "What the sweep of nng's lost close "
	       "events released (docs/reliability.md): clients, probes, nng_fds.");
	for (size_t i = 0; i < sizeof(swept) / sizeof(swept[0]); i++) {
		json_t *v = json_object_get(status, swept[i][1]);
		if (!json_is_integer(v) || bad_counter(v))
			continue;
		put_name(f, "loaderd_sweep_released_total", "", "", "what", swept[i][0]);
		put_value(f, v);
	}
}

char *metrics_text(json_t *status, size_t *len)
{
	json_t *pls = json_object_get(status, "pipelines"), *cls = json_object_get(status, "clients");
	size_t npl = 0, natt = 0, i, k;
	struct labelled *pl = calloc(json_array_size(pls) + 1, sizeof(*pl));
	struct labelled *att;
	json_t *o, *c, *a;
	char *buf = NULL;
	FILE *f;

	size_t atts_max = 1;
	json_array_foreach(cls, i, c)
		atts_max += json_array_size(json_object_get(c, "attachments"));
	att = calloc(atts_max, sizeof(*att));
	if (!pl || !att)
		goto out;
	json_array_foreach(pls, i, o) {
		/* a pipeline the status only names (another user's) has no data:
		 * as admin there is none, but say nothing rather than zeros */
		if (!json_object_get(o, "state"))
			continue;
		pl[npl].obj = o;
		if (!(pl[npl++].labels = pipeline_labels(o)))
			goto out;
	}
	json_array_foreach(cls, i, c)
		json_array_foreach(json_object_get(c, "attachments"), k, a) {
			att[natt].obj = a;
			if (!(att[natt++].labels = attachment_labels(c, a)))
				goto out;
		}
	if (!(f = open_memstream(&buf, len)))
		goto out;
	put_daemon(f, status);
	put_enum(f, "loaderd_pipeline_state", "1 for the state the pipeline is in "
	         "(starting, running, done, failed, draining, replaced), 0 for the others.", "state", pipeline_states, pl, npl,
	         "state");
	put_slots(f, pl, npl);
	put_nums(f, pipeline_metrics, sizeof(pipeline_metrics) / sizeof(pipeline_metrics[0]), pl, npl);
	put_stages(f, pl, npl);
	put_blend_parts(f, pl, npl);
	put_enum(f, "loaderd_pipeline_limited_by", "1 for what limits the pipeline's rate now "
	         "(consumers, workers, io, slots, idle, done, failed, starting), 0 for the others.",
	         "reason", limits, pl, npl, "stats.limited_by");
	put_nums(f, client_metrics, sizeof(client_metrics) / sizeof(client_metrics[0]), att, natt);
	put_wait_histogram(f, att, natt);
	if (fclose(f) != 0) {
		free(buf);
		buf = NULL;
	}
out:
	for (i = 0; pl && i < npl; i++)
		free(pl[i].labels);
	for (i = 0; att && i < natt; i++)
		free(att[i].labels);
	free(pl);
	free(att);
	return buf;
}
