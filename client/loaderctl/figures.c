/* SPDX-License-Identifier: MIT */
/* figures - the pipeline and client tables of status, pipelines, clients and top */

#include "loaderctl.h"

/* A duration in seconds: "45s", "3m05s", "2h03m"; not a number is "-". */
static void fmt_duration(char *buf, size_t n, const json_t *v)
{
	unsigned long long t;

	if (!json_is_number(v)) {
		snprintf(buf, n, "-");
		return;
	}
	t = json_number_value(v) > 0 ? (unsigned long long)json_number_value(v) : 0;
	if (t >= 3600)
		snprintf(buf, n, "%lluh%02llum", t / 3600, t / 60 % 60);
	else if (t >= 60)
		snprintf(buf, n, "%llum%02llus", t / 60, t % 60);
	else
		snprintf(buf, n, "%llus", t);
}

/* OWNER, BY, AGE, IDLE and EXPIRES of a pipeline (docs/spec.md, "Lifetime"). */
static void fmt_lifetime(const json_t *p, char *owner, char *by, char *age, char *idle, char *expires,
                         size_t n)
{
	const json_t *o = json_object_get(p, "owner");
	bool in_use = json_is_true(json_object_get(p, "in_use"));

	if (json_is_string(json_object_get(o, "user")))
		fmt_key(owner, n, o, "user");
	else
		fmt_key(owner, n, o, "uid");
	fmt_key(by, n, p, "created_by");
	fmt_duration(age, n, json_object_get(p, "age_s"));
	if (in_use)
		snprintf(idle, n, "-");
	else
		fmt_duration(idle, n, json_object_get(p, "idle_s"));
	if (json_is_true(json_object_get(p, "persist")))
		snprintf(expires, n, "never");
	else
		fmt_duration(expires, n, json_object_get(p, "expires_in_s"));
}

/* The slots its streams may fill, "(auto)" when the daemon sized them
 * (a spec without "prefetch", docs/spec.md). */
static void fmt_prefetch(char *buf, size_t n, const json_t *p)
{
	char v[64];

	fmt_key(v, sizeof(v), p, "prefetch");
	snprintf(buf, n, "%s%s", v, json_is_true(json_object_get(p, "prefetch_auto")) ? "(auto)" : "");
}

/*
 * The pipelines with their lifetime. @lifetime_only (in `status`, after the
 * figures table): only the name, its prefetch, batches produced and the
 * lifetime columns.
 */
int print_pipelines(const json_t *pipelines, bool lifetime_only)
{
	static const char *const head[] = { "PIPELINE", "STATE", "SLOTS", "PREFETCH", "CLIENTS",
		                             "PRODUCED", "OWNER", "BY", "AGE", "IDLE", "EXPIRES" };
	static const int lifetime_cols[] = { 0, 3, 5, 6, 7, 8, 9, 10 };
	const int ncols = lifetime_only ? 8 : 11;
	struct table t = { .ncols = ncols };
	int r = 0;

	if (!json_is_array(pipelines) || json_array_size(pipelines) == 0) {
		if (!lifetime_only)
			printf("no pipelines\n");
		return 0;
	}
	for (int row = -1; row < (int)json_array_size(pipelines) && r == 0; row++) {
		char name[CELL_MAX], state[64], slots[128], prefetch[80], clients[64], produced[64];
		char owner[64], by[64], age[64], idle[64], expires[64];
		const char *full[] = { name, state, slots, prefetch, clients, produced, owner, by, age, idle,
		                       expires };
		const char *const *src = row < 0 ? head : full;
		const char *cells[11];

		if (row >= 0) {
			const json_t *p = json_array_get(pipelines, (size_t)row);


			fmt_key(name, sizeof(name), p, "name");
			fmt_key(state, sizeof(state), p, "state");
			fmt_pair(slots, sizeof(slots), p, "slots_in_use", "slots_total");
			fmt_prefetch(prefetch, sizeof(prefetch), p);
			fmt_key(clients, sizeof(clients), p, "clients");
			fmt_key(produced, sizeof(produced), p, "batches_produced");
			fmt_lifetime(p, owner, by, age, idle, expires, sizeof(owner));
		}
		for (int c = 0; c < ncols; c++)
			cells[c] = src[lifetime_only ? lifetime_cols[c] : c];
		r = table_add(&t, cells);
	}
	if (r < 0) {
		table_free(&t);
		warnx("out of memory");
		return EXIT_FAILURE;
	}
	table_print(&t);
	table_free(&t);
	if (!lifetime_only)
		print_pipeline_notes(pipelines);
	return 0;
}

/* What does not fit a column: device slabs, a failed pipeline's reason. */
void print_pipeline_notes(const json_t *pipelines)
{
	size_t i;
	json_t *p;

	/* Device slabs of CUDA clients, one line each. */
	json_array_foreach(pipelines, i, p) {
		const json_t *devs = json_object_get(p, "devices"), *d;
		size_t k;

		json_array_foreach(devs, k, d) {
			char name[CELL_MAX], dev[64], mem[32], clients[32], copies[32], bytes[32] = "-";
			const json_t *e = json_object_get(d, "error");

			fmt_key(name, sizeof(name), p, "name");
			fmt_key(dev, sizeof(dev), d, "device");
			fmt_key(mem, sizeof(mem), d, "memory");
			fmt_key(clients, sizeof(clients), d, "clients");
			fmt_key(copies, sizeof(copies), d, "copies");
			if (json_is_number(json_object_get(d, "slab_bytes")))
				fmt_bytes(bytes, sizeof(bytes), json_number_value(json_object_get(d, "slab_bytes")));
			printf("%s: %s  %s slab %s  clients %s  copies %s%s%s\n", name, dev, mem, bytes, clients,
			       copies, json_is_string(e) ? "  error: " : "", json_is_string(e) ? json_string_value(e) : "");
		}
	}

	/* A failed pipeline's reason does not fit a column. */
	json_array_foreach(pipelines, i, p) {
		const json_t *e = json_object_get(p, "error");

		if (json_is_string(e) && *json_string_value(e)) {
			char name[CELL_MAX];

			fmt_key(name, sizeof(name), p, "name");
			printf("%s: error: %s\n", name, json_string_value(e));
		}
	}
}

/* ------------------------------------------------ figures: status and top */

/*
 * The pipeline and client tables that `status` prints once and `top` keeps
 * refreshing: what each pipeline produces and what limits it, and how long
 * each attachment's trainer waits for data (the "stats" objects of status,
 * docs/protocol.md). A daemon that sends no such figures gets "-" in their
 * columns. Rows are sorted by one key; ties keep the daemon's order.
 */

const char *const sort_names[SORT_KEYS] = { "wait", "rate", "name", "id" };

int sort_from_name(const char *s)
{
	for (int k = 0; k < SORT_KEYS; k++)
		if (!strcmp(s, sort_names[k]))
			return k;
	return -1;
}

/* The number at @key of @obj; NaN when it is missing, null or not a number. */
static double num_at(const json_t *obj, const char *key)
{
	const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;

	return json_is_number(v) ? json_number_value(v) : NAN;
}

/* @v * @scale with about three significant digits: "12345", "45.3", "2.50". */
static void fmt_num(char *buf, size_t n, double v, double scale)
{
	v *= scale;
	if (isnan(v))
		snprintf(buf, n, "-");
	else if (v >= 100 || v == 0)
		snprintf(buf, n, "%.0f", v);
	else if (v >= 10)
		snprintf(buf, n, "%.1f", v);
	else
		snprintf(buf, n, "%.2f", v);
}

/* A fraction as a whole percentage. */
static void fmt_pct(char *buf, size_t n, double v)
{
	if (isnan(v))
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%.0f", v * 100);
}

/* Seconds as "850us", "3.4ms", "120ms", "1.25s". */
static void fmt_secs(char *buf, size_t n, double v)
{
	if (isnan(v))
		snprintf(buf, n, "-");
	else if (v < 1e-3)
		snprintf(buf, n, "%.0fus", v * 1e6);
	else if (v < 1e-2)
		snprintf(buf, n, "%.1fms", v * 1e3);
	else if (v < 1)
		snprintf(buf, n, "%.0fms", v * 1e3);
	else
		snprintf(buf, n, "%.2fs", v);
}

/* "a/b/c" of three counts, "-" unless all three are there. */
static void fmt_triple(char *buf, size_t n, const json_t *o, const char *a, const char *b,
                       const char *c)
{
	double x = num_at(o, a), y = num_at(o, b), z = num_at(o, c);

	if (isnan(x) || isnan(y) || isnan(z))
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%.0f/%.0f/%.0f", x, y, z);
}

struct pipe_row {
	const json_t *p;
	const char *name;
	double rate, busy;   /* samples/s, workers busy; NaN: not known */
};

struct client_row {
	const json_t *c, *a; /* the client, one of its attachments (NULL: none) */
	const char *name;
	json_int_t id;
	double rate, wait;   /* samples/s, wait fraction; NaN: not known */
};

/* Bigger first, the unknown last; 0 on a tie. */
static int cmp_desc(double x, double y)
{
	if (isnan(x) || isnan(y))
		return isnan(x) - isnan(y);
	return x > y ? -1 : x < y;
}

static int pipe_cmp(const struct pipe_row *x, const struct pipe_row *y, enum sort_key key)
{
	switch (key) {
	case SORT_WAIT:
		/* a pipeline's side of a stall: its workers are busy */
		return cmp_desc(x->busy, y->busy);
	case SORT_RATE:
		return cmp_desc(x->rate, y->rate);
	case SORT_NAME:
		return strcmp(x->name, y->name);
	default:
		return 0;
	}
}

static int client_cmp(const struct client_row *x, const struct client_row *y, enum sort_key key)
{
	int r = 0;

	if (key == SORT_WAIT)
		r = cmp_desc(x->wait, y->wait);
	else if (key == SORT_RATE)
		r = cmp_desc(x->rate, y->rate);
	else if (key == SORT_NAME)
		r = strcmp(x->name, y->name);
	return r ? r : (x->id > y->id) - (x->id < y->id);
}

/* Insertion sorts: a few rows, and stable, so that equal rows keep still. */
static void pipe_rows_sort(struct pipe_row *v, size_t n, enum sort_key key)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && pipe_cmp(&v[j], &v[j - 1], key) < 0; j--) {
			struct pipe_row t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
}

static void client_rows_sort(struct client_row *v, size_t n, enum sort_key key)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && client_cmp(&v[j], &v[j - 1], key) < 0; j--) {
			struct client_row t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
}

static const char *str_at(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "";
}

/* The attachments' mode on pipeline @name: one mode, "mixed", or "-". */
static const char *pipeline_mode(const json_t *clients, const char *name)
{
	const char *mode = NULL;
	const json_t *c, *a;
	size_t i, k;

	json_array_foreach(clients, i, c)
		json_array_foreach(json_object_get(c, "attachments"), k, a) {
			const char *m = str_at(a, "mode");

			if (strcmp(str_at(a, "pipeline"), name))
				continue;
			if (mode && strcmp(mode, m))
				return "mixed";
			mode = m;
		}
	return mode && *mode ? mode : "-";
}

/* " (per sample: decode 31ms, transform 8.2ms)": the stages that take time. */
static void fmt_stages(char *buf, size_t n, const json_t *stats)
{
	static const char *const stage[] = { "read", "decode", "transform", "collate" };
	const json_t *ss = json_object_get(stats, "sample_seconds");
	size_t len = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(stage) / sizeof(stage[0]) && len < n; i++) {
		double v = num_at(ss, stage[i]);
		char t[32];

		if (isnan(v) || v <= 0)
			continue;
		fmt_secs(t, sizeof(t), v);
		len += (size_t)snprintf(buf + len, n - len, "%s%s %s", len ? ", " : " (per sample: ",
		                        stage[i], t);
	}
	if (len && len < n)
		snprintf(buf + len, n - len, ")");
}

/* "image cache: 67% hits, 2000 images, 1.1 GiB of 8.0 GiB (3 refused)", a megatron
 * source's or a blend's index, or "". */
static void fmt_cache(char *buf, size_t n, const json_t *p)
{
	const json_t *c = json_object_get(p, "cache");
	double hits = num_at(c, "hits"), misses = num_at(c, "misses");
	double refused = num_at(c, "refused");
	char used[32], cap[32], more[48] = "";

	buf[0] = '\0';
	if (json_is_string(json_object_get(c, "index"))) {
		/* a megatron source: "megatron index: built in 0.41 s, 2 epochs, 5000 samples" */
		const char *how = json_string_value(json_object_get(c, "index"));
		double secs = num_at(c, "build_seconds");
		char t[32] = "";

		if (!isnan(secs))
			snprintf(t, sizeof(t), " in %.2f s", secs);
		if (!isnan(num_at(c, "parts"))) {
			/* a blend: "blend index: reused, 966723 samples; its parts' indexes: 0 built, 64 reused" */
			snprintf(buf, n, "blend index: %s%s, %.0f samples; its parts' indexes: %.0f built, "
			         "%.0f reused%s", how, t, num_at(c, "samples"), num_at(c, "parts_built"),
			         num_at(c, "parts_reused"),
			         json_is_string(json_object_get(c, "note")) ? " (not cached)" : "");
			return;
		}
		snprintf(buf, n, "megatron index: %s%s, %.0f epochs, %.0f samples%s", how, t,
		         num_at(c, "epochs"), num_at(c, "samples"),
		         json_is_string(json_object_get(c, "note")) ? " (not cached)" : "");
		return;
	}
	if (!json_is_object(c) || isnan(hits) || isnan(misses))
		return;
	fmt_bytes(used, sizeof(used), num_at(c, "bytes_used"));
	fmt_bytes(cap, sizeof(cap), num_at(c, "bytes"));
	if (refused > 0)
		snprintf(more, sizeof(more), " (%.0f refused: full)", refused);
	snprintf(buf, n, "image cache: %.0f%% hits, %.0f images, %s of %s%s",
	         hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0,
	         num_at(c, "entries"), used, cap, more);
}

/* A blend's parts: "blend, samples read/per epoch: web 50/50, code 30/30",
 * parts past the buffer as "and 3 more"; else "". */
static void fmt_blend(char *buf, size_t n, const json_t *p)
{
	const json_t *parts = json_object_get(json_object_get(p, "source"), "parts"), *part;
	size_t i, at, np = json_array_size(parts);

	buf[0] = '\0';
	if (!np)
		return;
	at = (size_t)snprintf(buf, n, "blend, samples read/per epoch:");
	json_array_foreach(parts, i, part) {
		char item[96];
		int k = snprintf(item, sizeof(item), "%s %s %.0f/%.0f", i ? "," : "",
		                 str_at(part, "name"), num_at(part, "samples_read"),
		                 num_at(part, "samples_per_epoch"));

		if (k < 0 || at + (size_t)k + 24 >= n) {
			snprintf(buf + at, n - at, ", and %zu more", np - i);
			return;
		}
		memcpy(buf + at, item, (size_t)k + 1);
		at += (size_t)k;
	}
}

/* "augment seeds 7 (2 clients), 11 (1 client); 1500 images decoded" when
 * its broadcast clients read more than one seed (docs/spec.md), else "". */
static void fmt_seeds(char *buf, size_t n, const json_t *p)
{
	const json_t *groups = json_object_get(p, "seed_groups"), *g;
	size_t i, at;

	buf[0] = '\0';
	if (json_array_size(groups) < 2)
		return;
	at = (size_t)snprintf(buf, n, "augment seeds ");
	json_array_foreach(groups, i, g) {
		long long seed = (long long)json_integer_value(json_object_get(g, "seed"));
		double k = num_at(g, "clients");
		if (at < n)
			at += (size_t)snprintf(buf + at, n - at, "%s%lld (%.0f client%s)", i ? ", " : "",
			                       seed, k, k == 1 ? "" : "s");
	}
	if (at < n)
		snprintf(buf + at, n - at, "; %.0f images decoded", num_at(p, "decoded"));
}

/*
 * The pipelines table, then one line per pipeline that says what limits it.
 * @clients gives each pipeline's mode.
 */
int figures_pipelines(struct lines *l, const json_t *pipelines, const json_t *clients,
                      enum sort_key key)
{
	static const char *const head[] = { "PIPELINE", "STATE", "MODE", "CLIENTS", "SAMPLES/S",
		                             "MB/S", "BUSY%", "JOBS", "SLOTS R/L/F", "ERR/SKIP",
		                             "LIMITED BY" };
	size_t n = json_array_size(pipelines), i;
	struct table t = { .ncols = 11 };
	struct pipe_row *rows;
	json_t *p;
	int r;

	if (n == 0) {
		lines_add(l, "no pipelines");
		return 0;
	}
	rows = calloc(n, sizeof(*rows));
	if (!rows)
		return -ENOMEM;
	json_array_foreach(pipelines, i, p) {
		const json_t *stats = json_object_get(p, "stats");

		rows[i] = (struct pipe_row){ .p = p, .name = str_at(p, "name"),
			                     .rate = num_at(stats, "samples_per_s"),
			                     .busy = num_at(stats, "workers_busy") };
	}
	pipe_rows_sort(rows, n, key);

	r = table_add(&t, head);
	for (i = 0; i < n && r == 0; i++) {
		const json_t *stats = json_object_get(rows[i].p, "stats");
		char state[64], clients_n[32], rate[32], mbs[32], busy[32], jobs[32], slots[96],
			errs[160], limited[64];
		const char *row[] = { rows[i].name, state, pipeline_mode(clients, rows[i].name),
			              clients_n, rate, mbs, busy, jobs, slots, errs, limited };

		fmt_key(state, sizeof(state), rows[i].p, "state");
		fmt_key(clients_n, sizeof(clients_n), rows[i].p, "clients");
		fmt_num(rate, sizeof(rate), num_at(stats, "samples_per_s"), 1);
		fmt_num(mbs, sizeof(mbs), num_at(stats, "bytes_per_s"), 1e-6);
		fmt_pct(busy, sizeof(busy), num_at(stats, "workers_busy"));
		fmt_key(jobs, sizeof(jobs), stats, "jobs");
		fmt_triple(slots, sizeof(slots), stats, "slots_ready", "slots_leased", "slots_free");
		fmt_pair(errs, sizeof(errs), stats, "errors_total", "skipped_total");
		fmt_key(limited, sizeof(limited), stats, "limited_by");
		r = table_add(&t, row);
	}
	if (r == 0) {
		table_lines(&t, l);
		for (i = 0; i < n; i++) {
			const json_t *stats = json_object_get(rows[i].p, "stats");
			const char *why = json_string_value(json_object_get(stats, "limited_why"));
			char stages[256], cache[160], seeds[512], blend[512];

			fmt_stages(stages, sizeof(stages), stats);
			if (why && *why)
				lines_add(l, "%s: %s%s", rows[i].name, why, stages);
			else if (*stages)
				lines_add(l, "%s:%s", rows[i].name, stages);
			fmt_cache(cache, sizeof(cache), rows[i].p);
			if (*cache)
				lines_add(l, "%s: %s", rows[i].name, cache);
			fmt_seeds(seeds, sizeof(seeds), rows[i].p);
			if (*seeds)
				lines_add(l, "%s: %s", rows[i].name, seeds);
			fmt_blend(blend, sizeof(blend), rows[i].p);
			if (*blend)
				lines_add(l, "%s: %s", rows[i].name, blend);
		}
	}
	table_free(&t);
	free(rows);
	return r;
}

/* The clients table: one row per attachment (a client with none: one row). */
int figures_clients(struct lines *l, const json_t *clients, enum sort_key key)
{
	static const char *const head[] = { "ID", "PID", "NAME", "PIPELINE", "MODE", "BATCH/S",
		                             "SAMPLES/S", "WAIT%", "P50", "P99", "LAG", "LEASES",
		                             "DELIVERED", "STARVING" };
	struct table t = { .ncols = 14 };
	struct client_row *rows = NULL;
	size_t n = 0, cap = 0, i, k;
	const json_t *c, *a;
	int r = 0;

	if (json_array_size(clients) == 0) {
		lines_add(l, "no clients");
		return 0;
	}
	json_array_foreach(clients, i, c) {
		const json_t *atts = json_object_get(c, "attachments");
		size_t na = json_array_size(atts);

		for (k = 0; k < (na ? na : 1); k++) {
			const json_t *stats;

			if (n == cap) {
				void *p = realloc(rows, (cap = cap ? cap * 2 : 16) * sizeof(*rows));

				if (!p) {
					free(rows);
					return -ENOMEM;
				}
				rows = p;
			}
			a = na ? json_array_get(atts, k) : NULL;
			stats = json_object_get(a, "stats");
			rows[n++] = (struct client_row){ .c = c, .a = a, .name = str_at(c, "name"),
				                         .id = json_integer_value(json_object_get(c, "id")),
				                         .rate = num_at(stats, "samples_per_s"),
				                         .wait = num_at(stats, "wait_fraction") };
		}
	}
	client_rows_sort(rows, n, key);

	r = table_add(&t, head);
	for (i = 0; i < n && r == 0; i++) {
		/* leases, delivered, pipeline and mode: of the attachment when there is one */
		const json_t *cl = rows[i].c, *at = rows[i].a ? rows[i].a : cl;
		const json_t *stats = json_object_get(rows[i].a, "stats");
		char id[32], pid[32], pipeline[CELL_MAX], mode[32], bps[32], sps[32], wait[32],
			p50[32], p99[32], lag[32], leases[32], delivered[32], starving[32];
		const char *row[] = { id, pid, rows[i].name, pipeline, mode, bps, sps, wait,
			              p50, p99, lag, leases, delivered, starving };

		fmt_key(id, sizeof(id), cl, "id");
		fmt_key(pid, sizeof(pid), cl, "pid");
		fmt_key(pipeline, sizeof(pipeline), at, "pipeline");
		fmt_key(mode, sizeof(mode), at, "mode");
		fmt_num(bps, sizeof(bps), num_at(stats, "batches_per_s"), 1);
		fmt_num(sps, sizeof(sps), num_at(stats, "samples_per_s"), 1);
		fmt_pct(wait, sizeof(wait), num_at(stats, "wait_fraction"));
		fmt_secs(p50, sizeof(p50), num_at(stats, "wait_p50_s"));
		fmt_secs(p99, sizeof(p99), num_at(stats, "wait_p99_s"));
		fmt_key(lag, sizeof(lag), stats, "lag_batches");
		fmt_key(leases, sizeof(leases), at, "leases");
		fmt_key(delivered, sizeof(delivered), at, "delivered");
		fmt_key(starving, sizeof(starving), stats, "starving");
		r = table_add(&t, row);
	}
	if (r == 0)
		table_lines(&t, l);
	table_free(&t);
	free(rows);
	return r;
}

/* "loaderd 0.1.0  pid 42  up 1h02m03s  workers 4  memory 1.2 GiB / 11.8 GiB" */
void fmt_daemon_line(char *buf, size_t n, const json_t *st)
{
	char version[64], pid[64], workers[64], up[64], a[32] = "-", b[32] = "-";
	const json_t *v = json_object_get(st, "uptime_s");

	fmt_key(version, sizeof(version), st, "version");
	fmt_key(pid, sizeof(pid), st, "pid");
	fmt_key(workers, sizeof(workers), st, "workers");
	if (json_is_number(v)) {
		double s = json_number_value(v);
		unsigned long long t = s > 0 ? (unsigned long long)s : 0;

		if (t >= 3600)
			snprintf(up, sizeof(up), "%lluh%02llum%02llus", t / 3600, t / 60 % 60, t % 60);
		else if (t >= 60)
			snprintf(up, sizeof(up), "%llum%02llus", t / 60, t % 60);
		else if (json_is_integer(v))
			snprintf(up, sizeof(up), "%llus", t);
		else
			snprintf(up, sizeof(up), "%.1fs", s);
	} else {
		snprintf(up, sizeof(up), "-");
	}
	if (json_is_number(json_object_get(st, "memory_used")))
		fmt_bytes(a, sizeof(a), num_at(st, "memory_used"));
	if (json_is_number(json_object_get(st, "memory_limit")))
		fmt_bytes(b, sizeof(b), num_at(st, "memory_limit"));
	snprintf(buf, n, "loaderd %s  pid %s  up %s  workers %s  memory %s / %s", version, pid, up,
	         workers, a, b);
}

int print_clients(const json_t *clients)
{
	struct lines l = { 0 };

	if (figures_clients(&l, clients, SORT_ID) < 0)
		l.oom = true;
	return lines_print(&l);
}

/* "cuda: ..." once a client asked for a GPU: the driver or why there is none, each copy engine. */
void print_cuda_lines(const json_t *st)
{
	const json_t *cuda = json_object_get(st, "cuda"), *e, *devs, *d;
	const char *key;

	if (!json_is_object(cuda))
		return;
	e = json_object_get(cuda, "error");
	if (json_is_string(e)) {
		printf("cuda: unavailable: %s\n", json_string_value(e));
		return;
	}
	printf("cuda: driver %s\n", json_string_value(json_object_get(cuda, "driver")) ?: "?");
	devs = json_object_get(cuda, "devices");
	json_object_foreach((json_t *)devs, key, d) {
		char name[CELL_MAX], copies[32], bytes[32] = "-", rate[32] = "-";
		const json_t *b = json_object_get(d, "bytes"), *busy = json_object_get(d, "busy_s");

		fmt_key(name, sizeof(name), d, "name");
		fmt_key(copies, sizeof(copies), d, "copies");
		if (json_is_number(b))
			fmt_bytes(bytes, sizeof(bytes), json_number_value(b));
		if (json_is_number(b) && json_is_number(busy) && json_number_value(busy) > 0)
			snprintf(rate, sizeof(rate), "%.2f GB/s", json_number_value(b) / json_number_value(busy) / 1e9);
		printf("  %s  %s  copies %s (%s, %s while copying)\n", key, name, copies, bytes, rate);
	}
}
