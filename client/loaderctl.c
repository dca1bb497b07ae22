/* SPDX-License-Identifier: MIT */
/* loaderctl - the admin and test command of loaderd */

/*
 * loaderctl is a plain client of the daemon: it links only the public
 * libloader API (plus jansson to format the JSON the daemon answers with, and
 * zlib for the CRC-32 of `consume`). Anything it can do, a trainer can do with
 * the same API; that is the point.
 *
 * Exit status: 0 success, 1 the daemon refused or an I/O error happened,
 * 2 a usage error. `--json` makes every command print exactly one JSON object
 * on stdout.
 *
 * `consume` computes one CRC-32 chained over the bytes of every field of every
 * batch, in order: exactly the bytes `--dump` writes, so
 * zlib.crc32(open(dump, "rb").read()) equals the printed checksum.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <zlib.h>

#include "config.h"
#include "loader/loader.h"

#define PROG "loaderctl"
#define SPEC_MAX (16u << 20) /* largest spec file we read */

#define EXIT_USAGE 2

enum opt_id {
	OPT_SOCKET = 's',
	OPT_JSON = 'j',
	OPT_HELP = 'h',
	OPT_VERSION = 'V',
	OPT_VERBOSE = 'v',
	OPT_SPEC = 256,
	OPT_EXIST_OK,
	OPT_SCOPED,
	OPT_FORCE,
	OPT_MODE,
	OPT_RANK,
	OPT_WORLD_SIZE,
	OPT_START_EPOCH,
	OPT_START_BATCH,
	OPT_BATCHES,
	OPT_EPOCHS,
	OPT_DUMP,
	OPT_INFLIGHT,
	OPT_TIMEOUT,
	OPT_DELAY,
	OPT_DEVICE,
};

/* Every option of every command lands here; the commands check what applies. */
struct ctl {
	const char *socket;
	bool json;

	/* create */
	const char *spec;
	bool exist_ok;
	bool scoped;
	/* drop */
	bool force;
	/* consume */
	int mode;
	bool has_mode;
	bool has_rank, has_world;
	uint32_t rank, world_size;
	bool has_start_epoch, has_start_batch;
	uint64_t start_epoch, start_batch;
	bool has_batches, has_epochs;
	uint64_t batches, epochs;
	const char *dump;
	uint32_t inflight;
	int timeout_ms;
	unsigned delay_ms;
	bool verbose;
	enum ldr_device_kind device_kind;
	int device_index;
};

struct verb {
	const char *name;
	int min_args;
	int max_args;
	int (*fn)(struct ctl *ctl, int argc, char **argv);
	const char *help;
	const char *synopsis;          /* arguments and options, for --help */
	const struct option *options;  /* command options, beside the common ones */
};

/* ---------------------------------------------------------------- helpers */

static void warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warnx(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static _Noreturn void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry '" PROG " --help' for more information.\n", stderr);
	exit(EXIT_USAGE);
}

/* Strict unsigned decimal: no sign, no blanks, no trailing junk, no overflow. */
static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

static uint64_t arg_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
	uint64_t v;

	if (parse_u64(s, max, &v) < 0 || v < min)
		usage_error("invalid %s -- '%s'", what, s);
	return v;
}

/* @x rounded to 1/@scale, for JSON that people read too (x >= 0). */
static double round_to(double x, double scale)
{
	double v = x * scale + 0.5;

	return v < 9e18 ? (double)(long long)v / scale : x;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The daemon's message when it gave one, else the error's name. */
static int fail(struct ldr_client *client, const char *verb, int err)
{
	const char *msg = client ? ldr_client_error(client) : NULL;

	if (!msg || !*msg)
		msg = ldr_strerror(err);
	warnx("%s: %s", verb, msg);
	return EXIT_FAILURE;
}

static int connect_daemon(struct ctl *ctl, const char *verb, struct ldr_client **out)
{
	char path[4096];
	int r;

	r = ldr_connect(out, ctl->socket, PROG);
	if (r < 0) {
		if (ldr_socket_path(path, sizeof(path), ctl->socket) < 0)
			snprintf(path, sizeof(path), "%s", ctl->socket ? ctl->socket : "?");
		/* over a quota the daemon's own sentence says which and what to do */
		const char *msg = r == -EUSERS ? ldr_client_error(NULL) : NULL;
		warnx("%s: cannot connect to loaderd at %s: %s", verb, path,
		      msg && *msg ? msg : ldr_strerror(r));
		return EXIT_FAILURE;
	}
	return 0;
}

/* Print @v compactly on one line. Takes the reference. */
static int print_json(json_t *v)
{
	char *s;
	int r = 0;

	if (!v) {
		warnx("out of memory");
		return EXIT_FAILURE;
	}
	s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
	json_decref(v);
	if (!s) {
		warnx("out of memory");
		return EXIT_FAILURE;
	}
	if (puts(s) == EOF || fflush(stdout) == EOF)
		r = EXIT_FAILURE;
	free(s);
	return r;
}

/* Parse the JSON text the library returned (and free it). */
static json_t *parse_reply(const char *verb, char *text)
{
	json_error_t err;
	json_t *v = json_loads(text, 0, &err);

	ldr_free(text);
	if (!v || !json_is_object(v)) {
		warnx("%s: the daemon sent malformed JSON: %s", verb, v ? "not an object" : err.text);
		json_decref(v);
		return NULL;
	}
	return v;
}

static void fmt_bytes(char *buf, size_t n, double b)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	unsigned u = 0;

	while (b >= 1024.0 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		b /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%.0f B", b);
	else
		snprintf(buf, n, "%.1f %s", b, unit[u]);
}

/* A JSON value as table text; missing or null is "-". */
static void fmt_value(char *buf, size_t n, const json_t *v)
{
	char *s;

	if (!v || json_is_null(v)) {
		snprintf(buf, n, "-");
	} else if (json_is_string(v)) {
		snprintf(buf, n, "%s", json_string_value(v));
	} else if (json_is_integer(v)) {
		snprintf(buf, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
	} else if (json_is_real(v)) {
		snprintf(buf, n, "%g", json_real_value(v));
	} else if (json_is_boolean(v)) {
		snprintf(buf, n, "%s", json_is_true(v) ? "yes" : "no");
	} else {
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		snprintf(buf, n, "%s", s ? s : "-");
		free(s);
	}
}

static void fmt_key(char *buf, size_t n, const json_t *obj, const char *key)
{
	fmt_value(buf, n, json_is_object(obj) ? json_object_get(obj, key) : NULL);
}

/* "used/total" from two keys, "-" when both are missing. */
static void fmt_pair(char *buf, size_t n, const json_t *obj, const char *a, const char *b)
{
	char x[64], y[64];

	fmt_key(x, sizeof(x), obj, a);
	fmt_key(y, sizeof(y), obj, b);
	if (!strcmp(x, "-") && !strcmp(y, "-"))
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%s/%s", x, y);
}

/* --------------------------------------------------------- aligned tables */

#define TABLE_COLS 10
#define CELL_MAX 256

struct table {
	int ncols;
	size_t nrows;
	size_t cap;
	char (*cells)[TABLE_COLS][CELL_MAX];
};

static int table_add(struct table *t, const char *const *row)
{
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		void *p = realloc(t->cells, cap * sizeof(*t->cells));

		if (!p)
			return -ENOMEM;
		t->cells = p;
		t->cap = cap;
	}
	for (int c = 0; c < t->ncols; c++)
		snprintf(t->cells[t->nrows][c], CELL_MAX, "%s", row[c] ? row[c] : "-");
	t->nrows++;
	return 0;
}

static void table_print(const struct table *t)
{
	size_t w[TABLE_COLS] = { 0 };

	for (size_t r = 0; r < t->nrows; r++)
		for (int c = 0; c < t->ncols; c++) {
			size_t l = strlen(t->cells[r][c]);
			if (l > w[c])
				w[c] = l;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (int c = 0; c < t->ncols; c++) {
			if (c + 1 == t->ncols)
				printf("%s\n", t->cells[r][c]);
			else
				printf("%-*s  ", (int)w[c], t->cells[r][c]);
		}
	}
}

static void table_free(struct table *t)
{
	free(t->cells);
	t->cells = NULL;
	t->nrows = t->cap = 0;
}

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

static int print_pipelines(const json_t *pipelines)
{
	static const char *const head[] = { "PIPELINE", "STATE", "SLOTS", "CLIENTS", "PRODUCED",
		                             "OWNER", "BY", "AGE", "IDLE", "EXPIRES" };
	struct table t = { .ncols = 10 };
	size_t i;
	json_t *p;
	int r = 0;

	if (!json_is_array(pipelines) || json_array_size(pipelines) == 0) {
		printf("no pipelines\n");
		return 0;
	}
	r = table_add(&t, head);
	json_array_foreach(pipelines, i, p) {
		char name[CELL_MAX], state[64], slots[128], clients[64], produced[64];
		char owner[64], by[64], age[64], idle[64], expires[64];
		const char *row[] = { name, state, slots, clients, produced, owner, by, age, idle, expires };

		if (r < 0)
			break;
		fmt_key(name, sizeof(name), p, "name");
		fmt_key(state, sizeof(state), p, "state");
		fmt_pair(slots, sizeof(slots), p, "slots_in_use", "slots_total");
		fmt_key(clients, sizeof(clients), p, "clients");
		fmt_key(produced, sizeof(produced), p, "batches_produced");
		fmt_lifetime(p, owner, by, age, idle, expires, sizeof(owner));
		r = table_add(&t, row);
	}
	if (r < 0) {
		table_free(&t);
		warnx("out of memory");
		return EXIT_FAILURE;
	}
	table_print(&t);
	table_free(&t);

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
	return 0;
}

static int print_clients(const json_t *clients)
{
	static const char *const head[] = { "ID", "PID", "NAME", "PIPELINE", "MODE",
		                             "LEASES", "DELIVERED" };
	struct table t = { .ncols = 7 };
	size_t i;
	json_t *c;
	int r = 0;

	if (!json_is_array(clients) || json_array_size(clients) == 0) {
		printf("no clients\n");
		return 0;
	}
	r = table_add(&t, head);
	json_array_foreach(clients, i, c) {
		char id[64], pid[64], name[CELL_MAX], pipeline[CELL_MAX], mode[64], leases[64],
			delivered[64];
		const char *row[] = { id, pid, name, pipeline, mode, leases, delivered };

		if (r < 0)
			break;
		fmt_key(id, sizeof(id), c, "id");
		fmt_key(pid, sizeof(pid), c, "pid");
		fmt_key(name, sizeof(name), c, "name");
		fmt_key(pipeline, sizeof(pipeline), c, "pipeline");
		fmt_key(mode, sizeof(mode), c, "mode");
		fmt_key(leases, sizeof(leases), c, "leases");
		fmt_key(delivered, sizeof(delivered), c, "delivered");
		r = table_add(&t, row);
	}
	if (r < 0) {
		table_free(&t);
		warnx("out of memory");
		return EXIT_FAILURE;
	}
	table_print(&t);
	table_free(&t);
	return 0;
}

static void print_daemon_line(const json_t *st)
{
	char version[64], pid[64], socket[CELL_MAX], workers[64], up[64], mem[96];
	const json_t *v;

	fmt_key(version, sizeof(version), st, "version");
	fmt_key(pid, sizeof(pid), st, "pid");
	fmt_key(socket, sizeof(socket), st, "socket");
	fmt_key(workers, sizeof(workers), st, "workers");

	v = json_object_get(st, "uptime_s");
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

	{
		const json_t *used = json_object_get(st, "memory_used");
		const json_t *lim = json_object_get(st, "memory_limit");
		char a[32] = "-", b[32] = "-";

		if (json_is_number(used))
			fmt_bytes(a, sizeof(a), json_number_value(used));
		if (json_is_number(lim))
			fmt_bytes(b, sizeof(b), json_number_value(lim));
		snprintf(mem, sizeof(mem), "%s / %s", a, b);
	}

	printf("loaderd %s  pid %s  up %s  workers %s  memory %s  socket %s\n", version, pid, up,
	       workers, mem, socket);
}

/* "cuda: ..." once a client asked for a GPU: the driver or why there is none, each copy engine. */
static void print_cuda_lines(const json_t *st)
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

/* ---------------------------------------------------------------- commands */

/* Connect, run @call, parse its JSON reply; 0 or the exit status. */
static int json_request(struct ctl *ctl, const char *verb, json_t **out,
                      int (*call)(struct ldr_client *, void *, char **), void *arg)
{
	struct ldr_client *client = NULL;
	char *text = NULL;
	int r;

	if ((r = connect_daemon(ctl, verb, &client)))
		return r;
	r = call(client, arg, &text);
	if (r < 0) {
		r = fail(client, verb, r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	*out = parse_reply(verb, text);
	return *out ? 0 : EXIT_FAILURE;
}

static int call_status(struct ldr_client *client, void *arg, char **text)
{
	(void)arg;
	return ldr_status_json(client, text);
}

static int get_status(struct ctl *ctl, const char *verb, json_t **out)
{
	return json_request(ctl, verb, out, call_status, NULL);
}

static int cmd_status(struct ctl *ctl, int argc, char **argv)
{
	json_t *st;
	int r;

	r = get_status(ctl, "status", &st);
	if (r)
		return r;
	if (ctl->json)
		return print_json(st);

	print_daemon_line(st);
	print_cuda_lines(st);
	printf("\n");
	r = print_pipelines(json_object_get(st, "pipelines"));
	if (!r) {
		printf("\n");
		r = print_clients(json_object_get(st, "clients"));
	}
	json_decref(st);
	return r;
}

static int cmd_pipelines(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	char *text = NULL;
	json_t *v;
	int r;

	r = connect_daemon(ctl, "pipelines", &client);
	if (r)
		return r;
	r = ldr_pipelines_json(client, &text);
	if (r < 0) {
		r = fail(client, "pipelines", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	v = parse_reply("pipelines", text);
	if (!v)
		return EXIT_FAILURE;
	if (!json_is_array(json_object_get(v, "pipelines")))
		json_object_set_new(v, "pipelines", json_array());
	if (ctl->json)
		return print_json(v);
	r = print_pipelines(json_object_get(v, "pipelines"));
	json_decref(v);
	return r;
}

static int cmd_clients(struct ctl *ctl, int argc, char **argv)
{
	json_t *st, *clients;
	int r;

	r = get_status(ctl, "clients", &st);
	if (r)
		return r;
	clients = json_object_get(st, "clients");
	if (ctl->json) {
		json_t *o = json_pack("{so}", "clients",
		                      json_is_array(clients) ? json_incref(clients) : json_array());

		json_decref(st);
		return print_json(o);
	}
	r = print_clients(clients);
	json_decref(st);
	return r;
}

/* Read all of @path ("-" = stdin) into a NUL-terminated buffer. */
static int read_spec(const char *path, char **out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t len = 0, cap = 0;
	char *buf = NULL;
	int err = 0;

	if (!f)
		return -errno;
	for (;;) {
		size_t n;

		if (cap - len < 4096 + 1) {
			size_t ncap = cap ? cap * 2 : 8192;
			char *p;

			if (ncap > SPEC_MAX + 1) {
				err = -EFBIG;
				break;
			}
			p = realloc(buf, ncap);
			if (!p) {
				err = -ENOMEM;
				break;
			}
			buf = p;
			cap = ncap;
		}
		n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
		if (n == 0) {
			if (ferror(f))
				err = -EIO;
			break;
		}
	}
	if (f != stdin)
		fclose(f);
	if (err) {
		free(buf);
		return err;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

static int cmd_create(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	char name[LDR_NAME_MAX + 1] = "";
	const char *shown = strcmp(ctl->spec, "-") ? ctl->spec : "<stdin>";
	json_error_t jerr;
	json_t *spec;
	char *text = NULL;
	int r;

	r = read_spec(ctl->spec, &text);
	if (r < 0) {
		warnx("create: cannot read %s: %s", shown, strerror(-r));
		return EXIT_FAILURE;
	}
	/* Catch a syntax error here, where we can still say where it is. */
	spec = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!spec) {
		warnx("create: %s: line %d column %d: %s", shown, jerr.line, jerr.column, jerr.text);
		free(text);
		return EXIT_FAILURE;
	}
	/* An admin create has no job to scope the pipeline to: it persists
	 * unless --scoped, or the spec says how long it lives itself. */
	if (!ctl->scoped && json_is_object(spec) && !json_object_get(spec, "persist") &&
	    !json_object_get(spec, "ttl")) {
		char *with = NULL;
		if (json_object_set_new(spec, "persist", json_true()) == 0)
			with = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
		if (!with) {
			warnx("create: out of memory");
			json_decref(spec);
			free(text);
			return EXIT_FAILURE;
		}
		free(text);
		text = with;
	}
	json_decref(spec);

	r = connect_daemon(ctl, "create", &client);
	if (r) {
		free(text);
		return r;
	}
	r = ldr_create_pipeline(client, text, ctl->exist_ok, name, sizeof(name));
	free(text);
	if (r < 0) {
		r = fail(client, "create", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);

	if (ctl->json)
		return print_json(json_pack("{sssb}", "name", name, "created", r == 1));
	if (r == 1)
		printf("created pipeline %s\n", name);
	else
		printf("pipeline %s exists\n", name);
	return 0;
}

static int cmd_drop(struct ctl *ctl, int argc, char **argv)
{
	struct ldr_client *client = NULL;
	const char *name = argv[0];
	int r;

	r = connect_daemon(ctl, "drop", &client);
	if (r)
		return r;
	r = ldr_drop_pipeline(client, name, ctl->force);
	if (r < 0) {
		r = fail(client, "drop", r);
		ldr_close(client);
		return r;
	}
	ldr_close(client);
	if (ctl->json)
		return print_json(json_pack("{sssb}", "name", name, "dropped", 1));
	printf("dropped pipeline %s\n", name);
	return 0;
}

struct consume_result {
	uint64_t batches, samples, bytes;
	uint64_t first_epoch, first_batch;
	uLong crc;
	double seconds;
	bool eof;
};

static int consume_loop(struct ctl *ctl, struct ldr_client *client, struct ldr_attachment *att,
                        FILE *dump, FILE *vout, uint64_t limit, struct consume_result *res)
{
	double t0 = now_s();
	int r = 0;

	res->crc = crc32(0L, Z_NULL, 0);
	while (limit == 0 || res->batches < limit) {
		struct ldr_batch *b = NULL;
		uint64_t nbytes = 0;
		int nf;

		r = ldr_next(att, ctl->timeout_ms, &b);
		if (r == LDR_EOF) {
			res->eof = true;
			r = 0;
			break;
		}
		if (r == -ETIMEDOUT) {
			/* --timeout ran out, or the daemon detached a stopped client:
			 * the library's message says which */
			const char *msg = ldr_client_error(client);
			warnx("consume: %s (after %" PRIu64 " batches)",
			      msg && *msg ? msg : ldr_strerror(r), res->batches);
			goto out;
		}
		if (r < 0) {
			fail(client, "consume", r);
			goto out;
		}

		nf = ldr_batch_nfields(b);
		for (int i = 0; i < nf; i++) {
			struct ldr_field f;

			/* a CUDA batch's fields are device pointers: read the host copy */
			r = ldr_batch_field_host(b, i, &f);
			if (r < 0) {
				warnx("consume: field %d of batch %" PRIu64 ": %s", i,
				      ldr_batch_index(b), ldr_strerror(r));
				ldr_release(b);
				goto out;
			}
			if (f.nbytes && !f.data) {
				warnx("consume: field %s has no data", f.name ? f.name : "?");
				ldr_release(b);
				r = -EPROTO;
				goto out;
			}
			res->crc = crc32_z(res->crc, f.data, f.nbytes);
			if (dump && f.nbytes && fwrite(f.data, 1, f.nbytes, dump) != f.nbytes) {
				warnx("consume: writing %s: %s", ctl->dump, strerror(errno));
				ldr_release(b);
				r = -EIO;
				goto out;
			}
			nbytes += f.nbytes;
		}
		if (res->batches == 0) {
			res->first_epoch = ldr_batch_epoch(b);
			res->first_batch = ldr_batch_index(b);
		}
		if (vout)
			fprintf(vout, "epoch %" PRIu64 " batch %" PRIu64 " rows %" PRIu32
			              " bytes %" PRIu64 "\n",
			        ldr_batch_epoch(b), ldr_batch_index(b), ldr_batch_rows(b), nbytes);
		res->batches++;
		res->samples += ldr_batch_rows(b);
		res->bytes += nbytes;
		if (ctl->delay_ms) {
			/* a trainer's step: the batch is held meanwhile */
			struct timespec ts = { .tv_sec = ctl->delay_ms / 1000,
			                       .tv_nsec = (long)(ctl->delay_ms % 1000) * 1000000L };
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		}
		ldr_release(b);
	}
out:
	res->seconds = now_s() - t0;
	return r;
}

static int cmd_consume(struct ctl *ctl, int argc, char **argv)
{
	const char *pipeline = argv[0];
	struct ldr_attach_opts opts = LDR_ATTACH_OPTS_INIT;
	struct consume_result res = { 0 };
	struct ldr_client *client = NULL;
	struct ldr_attachment *att = NULL;
	FILE *dump = NULL, *out = stdout, *vout = NULL;
	uint64_t limit = 0;
	int r, ret = EXIT_FAILURE;

	/* Options that do not apply are usage errors, not silently ignored. */
	if (ctl->has_batches && ctl->has_epochs)
		usage_error("consume: --batches and --epochs exclude each other");
	if ((ctl->has_rank || ctl->has_world) && ctl->mode != LDR_MODE_PARTITION)
		usage_error("consume: --rank and --world-size need --mode partition");
	if ((ctl->has_start_epoch || ctl->has_start_batch) && ctl->mode != LDR_MODE_PARTITION)
		usage_error("consume: --start-epoch and --start-batch need --mode partition");
	if (ctl->has_rank != ctl->has_world)
		usage_error("consume: --rank and --world-size go together");
	if (ctl->has_rank && ctl->rank >= ctl->world_size)
		usage_error("consume: rank %" PRIu32 " is not below world size %" PRIu32,
		            ctl->rank, ctl->world_size);

	opts.mode = ctl->mode;
	opts.rank = ctl->has_rank ? ctl->rank : 0;
	opts.world_size = ctl->has_world ? ctl->world_size : 1;
	opts.has_start = ctl->has_start_epoch || ctl->has_start_batch;
	opts.start_epoch = ctl->start_epoch;
	opts.start_batch = ctl->start_batch;
	opts.inflight = ctl->inflight;
	opts.device_kind = ctl->device_kind;
	opts.device_index = ctl->device_index;

	if (ctl->dump) {
		if (!strcmp(ctl->dump, "-")) {
			dump = stdout;
			out = stderr; /* the report must not mix with the bytes */
		} else {
			dump = fopen(ctl->dump, "wb");
			if (!dump) {
				warnx("consume: cannot open %s: %s", ctl->dump, strerror(errno));
				return EXIT_FAILURE;
			}
		}
		setvbuf(dump, NULL, _IOFBF, 1 << 20);
	}
	if (ctl->verbose)
		vout = (ctl->json || dump == stdout) ? stderr : stdout;

	r = connect_daemon(ctl, "consume", &client);
	if (r)
		goto out;
	r = ldr_attach(client, pipeline, &opts, &att);
	if (r < 0) {
		fail(client, "consume", r);
		goto out;
	}

	if (ctl->has_batches) {
		limit = ctl->batches;
	} else if (ctl->has_epochs) {
		uint64_t bpe = ldr_attachment_batches_per_epoch(att);

		if (bpe == 0) {
			warnx("consume: pipeline %s has no batches per epoch", pipeline);
			goto out;
		}
		if (ctl->epochs > UINT64_MAX / bpe) {
			warnx("consume: --epochs %" PRIu64 " is too many", ctl->epochs);
			goto out;
		}
		limit = ctl->epochs * bpe;
	}

	r = consume_loop(ctl, client, att, dump, vout, limit, &res);
	if (r < 0)
		goto out; /* already reported */
	if (dump && dump != stdout) {
		r = fclose(dump);
		dump = NULL;
		if (r == EOF) {
			warnx("consume: writing %s: %s", ctl->dump, strerror(errno));
			goto out;
		}
	} else if (dump && fflush(dump) == EOF) {
		warnx("consume: writing to stdout: %s", strerror(errno));
		goto out;
	}

	{
		double secs = res.seconds > 0 ? res.seconds : 1e-9;
		double sps = (double)res.samples / secs;
		double gbps = (double)res.bytes / secs / 1e9;
		char crc[9];

		snprintf(crc, sizeof(crc), "%08lx", (unsigned long)(res.crc & 0xffffffffUL));
		if (ctl->json) {
			json_t *o = json_pack("{ss ss sI sI sI sf ss sf sf so so sb}",
			                      "pipeline", pipeline,
			                      "mode", ldr_mode_name(ctl->mode),
			                      "batches", (json_int_t)res.batches,
			                      "samples", (json_int_t)res.samples,
			                      "bytes", (json_int_t)res.bytes,
			                      "seconds", round_to(res.seconds, 1e6),
			                      "checksum", crc,
			                      "samples_per_s", round_to(sps, 10),
			                      "gb_per_s", round_to(gbps, 1e6),
			                      "first_epoch", res.batches ? json_integer((json_int_t)res.first_epoch) : json_null(),
			                      "first_batch", res.batches ? json_integer((json_int_t)res.first_batch) : json_null(),
			                      "eof", res.eof);
			char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER |
			                                    JSON_REAL_PRECISION(15))
			            : NULL;

			json_decref(o);
			if (!s) {
				warnx("out of memory");
				goto out;
			}
			fprintf(out, "%s\n", s);
			free(s);
		} else {
			fprintf(out,
			        "batches %" PRIu64 "  samples %" PRIu64 "  bytes %" PRIu64
			        "  seconds %.3f  checksum %s  (%.0f samples/s, %.2f GB/s)\n",
			        res.batches, res.samples, res.bytes, res.seconds, crc, sps, gbps);
		}
		if (fflush(out) == EOF)
			goto out;
	}
	ret = EXIT_SUCCESS;
out:
	if (att) {
		r = ldr_detach(att);
		if (r < 0 && ret == EXIT_SUCCESS)
			ret = fail(client, "consume", r);
	}
	ldr_close(client);
	if (dump && dump != stdout)
		fclose(dump);
	return ret;
}

/* --------------------------------------------------------- set, reload */

/* `set` keys as loaderctl spells them, the daemon's key, and the arguments. */
static const struct set_key {
	const char *name;
	const char *key;
	bool pipeline;                 /* takes PIPELINE before the value */
} set_keys[] = {
	{ "workers", "workers", false },
	{ "prefetch", "prefetch", true },
	{ "log-level", "log_level", false },
	{ "memory-limit", "memory_limit", false },
};

static const struct set_key *set_key_find(const char *name)
{
	for (size_t i = 0; i < sizeof(set_keys) / sizeof(set_keys[0]); i++) {
		const char *a = set_keys[i].name, *b = name;
		/* log-level and log_level alike */
		while (*a && (*a == *b || (*a == '-' && *b == '_')))
			a++, b++;
		if (!*a && !*b)
			return &set_keys[i];
	}
	return NULL;
}

struct set_args {
	const char *key, *pipeline, *value;
};

static int call_set(struct ldr_client *client, void *arg, char **text)
{
	struct set_args *a = arg;
	return ldr_set(client, a->key, a->pipeline, a->value, text);
}

/* A JSON value as people read it: 8, "debug" as debug, null as none. */
static void fmt_setting(char *buf, size_t n, json_t *v)
{
	char *s;

	if (json_is_string(v))
		snprintf(buf, n, "%s", json_string_value(v));
	else if (json_is_null(v) || !v)
		snprintf(buf, n, "(default)");
	else if ((s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT))) {
		snprintf(buf, n, "%s", s);
		free(s);
	} else
		snprintf(buf, n, "?");
}

/* "  workers: 2 -> 4" and its note. */
static void print_change(const char *indent, json_t *c)
{
	char old[256], new[256];
	const char *pl = json_string_value(json_object_get(c, "pipeline"));
	const char *note = json_string_value(json_object_get(c, "note"));

	fmt_setting(old, sizeof(old), json_object_get(c, "old"));
	fmt_setting(new, sizeof(new), json_object_get(c, "new"));
	printf("%s%s%s%s: %s -> %s\n", indent, json_string_value(json_object_get(c, "key")),
	       pl ? " of " : "", pl ? pl : "", old, new);
	if (note)
		printf("%s  (%s)\n", indent, note);
}

static int cmd_set(struct ctl *ctl, int argc, char **argv)
{
	const struct set_key *k = set_key_find(argv[0]);
	struct set_args a;
	json_t *rep;
	int r;

	if (!k)
		usage_error("set: unknown setting -- '%s' (workers, prefetch, log-level, memory-limit)",
		            argv[0]);
	if (argc != (k->pipeline ? 3 : 2))
		usage_error("set %s: %s", k->name, k->pipeline ? "usage: set prefetch PIPELINE N"
		            : argc < 2 ? "missing the value" : "one value only");
	a = (struct set_args){ k->key, k->pipeline ? argv[1] : NULL, argv[argc - 1] };
	if ((r = json_request(ctl, "set", &rep, call_set, &a)))
		return r;
	if (ctl->json)
		return print_json(rep);
	print_change("", rep);
	json_decref(rep);
	return 0;
}

static int call_reload(struct ldr_client *client, void *arg, char **text)
{
	(void)arg;
	return ldr_reload(client, text);
}

/* "created a, b" for a non-empty list of names (or of {"name"} objects). */
static void print_names(const char *what, json_t *list)
{
	size_t i;
	json_t *v;

	if (!json_array_size(list))
		return;
	printf("  %s:", what);
	json_array_foreach(list, i, v) {
		const char *name = json_is_string(v) ? json_string_value(v)
		                                     : json_string_value(json_object_get(v, "name"));
		json_t *clients = json_object_get(v, "clients");
		const char *changed = json_string_value(json_object_get(v, "changed"));
		printf("%s %s", i ? "," : "", name ? name : "?");
		if (json_integer_value(clients))
			printf(" (%" JSON_INTEGER_FORMAT " client%s finish%s the epoch)",
			       json_integer_value(clients), json_integer_value(clients) == 1 ? "" : "s",
			       json_integer_value(clients) == 1 ? "es" : "");
		else if (json_is_integer(clients))
			printf(" (no client: dropped)");
		if (changed)
			printf(" (%s)", changed);
	}
	printf("\n");
}

static int cmd_reload(struct ctl *ctl, int argc, char **argv)
{
	json_t *rep, *v, *pls, *failed;
	size_t i;
	int r;

	if ((r = json_request(ctl, "reload", &rep, call_reload, NULL)))
		return r;
	pls = json_object_get(rep, "pipelines");
	failed = json_object_get(pls, "failed");
	r = json_array_size(failed) ? EXIT_FAILURE : 0;
	if (ctl->json) {
		int p = print_json(rep);
		return p ? p : r;
	}
	printf("reloaded %s\n", json_string_value(json_object_get(rep, "file")));
	if (!json_array_size(json_object_get(rep, "changed")))
		printf("  no setting changed\n");
	json_array_foreach(json_object_get(rep, "changed"), i, v)
		print_change("  ", v);
	if (json_array_size(json_object_get(rep, "restart_needed")))
		printf("needs a restart (the file differs from what loaderd runs with):\n");
	json_array_foreach(json_object_get(rep, "restart_needed"), i, v) {
		char run[512], file[512];
		fmt_setting(run, sizeof(run), json_object_get(v, "running"));
		fmt_setting(file, sizeof(file), json_object_get(v, "file"));
		printf("  %s: %s (running), %s (file)\n", json_string_value(json_object_get(v, "key")),
		       run, file);
	}
	printf("pipelines:\n");
	print_names("created", json_object_get(pls, "created"));
	print_names("replaced for new attachments", json_object_get(pls, "replaced"));
	print_names("draining", json_object_get(pls, "draining"));
	print_names("unchanged", json_object_get(pls, "unchanged"));
	json_array_foreach(failed, i, v)
		warnx("reload: pipeline %s: %s", json_string_value(json_object_get(v, "name")),
		      json_string_value(json_object_get(v, "error")));
	json_decref(rep);
	return r;
}

static int cmd_help(struct ctl *ctl, int argc, char **argv);

/* ------------------------------------------------------------- the table */

#define COMMON_OPTIONS                                              \
	{ "socket", required_argument, NULL, OPT_SOCKET },          \
	{ "json", no_argument, NULL, OPT_JSON },                    \
	{ "help", no_argument, NULL, OPT_HELP }

static const struct option no_options[] = {
	COMMON_OPTIONS,
	{ NULL, 0, NULL, 0 },
};

static const struct option create_options[] = {
	COMMON_OPTIONS,
	{ "spec", required_argument, NULL, OPT_SPEC },
	{ "exist-ok", no_argument, NULL, OPT_EXIST_OK },
	{ "scoped", no_argument, NULL, OPT_SCOPED },
	{ NULL, 0, NULL, 0 },
};

static const struct option drop_options[] = {
	COMMON_OPTIONS,
	{ "force", no_argument, NULL, OPT_FORCE },
	{ NULL, 0, NULL, 0 },
};

static const struct option consume_options[] = {
	COMMON_OPTIONS,
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "world-size", required_argument, NULL, OPT_WORLD_SIZE },
	{ "start-epoch", required_argument, NULL, OPT_START_EPOCH },
	{ "start-batch", required_argument, NULL, OPT_START_BATCH },
	{ "batches", required_argument, NULL, OPT_BATCHES },
	{ "epochs", required_argument, NULL, OPT_EPOCHS },
	{ "dump", required_argument, NULL, OPT_DUMP },
	{ "inflight", required_argument, NULL, OPT_INFLIGHT },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "delay", required_argument, NULL, OPT_DELAY },
	{ "verbose", no_argument, NULL, OPT_VERBOSE },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ NULL, 0, NULL, 0 },
};

static const struct verb verbs[] = {
	{ "status", 0, 0, cmd_status, "daemon, pipelines and clients", "", no_options },
	{ "pipelines", 0, 0, cmd_pipelines, "list the pipelines", "", no_options },
	{ "clients", 0, 0, cmd_clients, "list the connected clients", "", no_options },
	{ "create", 0, 0, cmd_create, "create a pipeline from a JSON spec (docs/spec.md)",
	  "--spec FILE [--exist-ok] [--scoped]", create_options },
	{ "drop", 1, 1, cmd_drop, "drop a pipeline", "NAME [--force]", drop_options },
	{ "consume", 1, 1, cmd_consume,
	  "read batches, report throughput and a CRC-32 of their bytes",
	  "NAME [--mode M] [--rank R --world-size W] [--start-epoch E --start-batch B]\n"
	  "          [--batches N | --epochs E] [--dump FILE] [--inflight K] [--timeout MS]\n"
	  "          [--delay MS] [--device cpu|cuda:N] [--verbose]",
	  consume_options },
	{ "set", 2, 3, cmd_set, "change a setting of the running daemon now (admins only)",
	  "workers N | prefetch PIPELINE N | log-level LEVEL | memory-limit SIZE", no_options },
	{ "reload", 0, 0, cmd_reload,
	  "re-read the daemon's config file and apply it, as SIGHUP does (admins only)", "",
	  no_options },
	{ "help", 0, 0, cmd_help, "show this help", "", no_options },
};

static void print_help(FILE *f)
{
	fprintf(f,
	        "Usage: " PROG " [OPTIONS] COMMAND [ARGS...]\n"
	        "\n"
	        "Administer and test a running loaderd.\n"
	        "\n"
	        "Options (also accepted after the command):\n"
	        "  -s, --socket PATH   daemon socket; default $LOADERD_SOCKET, else\n"
	        "                      $RUNTIME_DIRECTORY/loaderd.sock, else\n"
	        "                      $XDG_RUNTIME_DIR/loaderd.sock, else /run/loaderd/loaderd.sock\n"
	        "  -j, --json          print one JSON object per command\n"
	        "  -h, --help          show this help\n"
	        "  -V, --version       show the versions of loaderctl and the libraries it runs on\n"
	        "\n"
	        "Commands:\n");
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		fprintf(f, "  %s%s%s\n      %s\n", verbs[i].name, *verbs[i].synopsis ? " " : "",
		        verbs[i].synopsis, verbs[i].help);
	fprintf(f,
	        "\n"
	        "create options:\n"
	        "  --spec FILE         the pipeline spec; '-' reads standard input\n"
	        "  --exist-ok          succeed when an identical pipeline exists (a persistent\n"
	        "                      create makes it persistent)\n"
	        "  --scoped            send the spec as it is: without \"persist\" or \"ttl\" of its\n"
	        "                      own the pipeline is dropped once unused for the daemon's\n"
	        "                      linger (5 s by default), and loaderctl leaves at once\n"
	        "                      (default: add \"persist\": true when the spec has neither,\n"
	        "                      so the pipeline stays until `drop`)\n"
	        "\n"
	        "drop options:\n"
	        "  --force             drop even while clients are attached\n"
	        "\n"
	        "consume options:\n"
	        "  --mode M            broadcast (default), partition or dynamic\n"
	        "  --rank R            partition: this consumer's rank (with --world-size)\n"
	        "  --world-size W      partition: number of ranks\n"
	        "  --start-epoch E     partition: resume at epoch E (default 0)\n"
	        "  --start-batch B     partition: resume at batch index B (default 0)\n"
	        "  --batches N         stop after N batches\n"
	        "  --epochs E          stop after E epochs of this consumer's share\n"
	        "                      (without --batches/--epochs: read until the pipeline ends)\n"
	        "  --dump FILE         write every field of every batch, in order, as raw C-order\n"
	        "                      bytes ('-' = stdout; the report then goes to stderr)\n"
	        "  --inflight K        batches asked for or waiting, 1..%d (default: the library's, 4)\n"
	        "  --timeout MS        fail when no batch arrives within MS ms (default: wait)\n"
	        "  --delay MS          hold each batch MS ms before releasing it, as a\n"
	        "                      trainer's step would (default 0)\n"
	        "  --device D          where batches are delivered: cpu (default, host memory)\n"
	        "                      or cuda:N (GPU N; a daemon that cannot serve it says why;\n"
	        "                      the checksum and --dump read each batch's host copy)\n"
	        "  -v, --verbose       one line per batch: epoch, batch index, rows, bytes\n"
	        "\n"
	        "The checksum is zlib's CRC-32 of exactly the bytes --dump writes.\n"
	        "\n"
	        "set and reload (root, loaderd's user and the config's admin_group only):\n"
	        "  set workers N       worker threads, 1..1024; a shrink lets running tasks finish\n"
	        "  set prefetch PIPELINE N\n"
	        "                      slots of PIPELINE its streams may fill, 1..its slots\n"
	        "                      (slots_total: the slab cannot grow live)\n"
	        "  set log-level LEVEL error, warning, notice, info or debug\n"
	        "  set memory-limit SIZE\n"
	        "                      bytes or 512M, 4G, for creates from now on; slabs made stay\n"
	        "  reload              prints what changed (old -> new), the keys that need a\n"
	        "                      restart and what became of the config's pipelines;\n"
	        "                      an invalid file changes nothing and says why\n"
	        "                      (exit 1, also when a pipeline could not be created)\n"
	        "A set lasts until the next reload or restart, which apply the file's values\n"
	        "(docs/config.md).\n"
	        "\n"
	        "Exit status: 0 success, 1 failure (the daemon refused: its message says why),\n"
	        "2 usage error.\n", LDR_INFLIGHT_MAX);
}

static int cmd_help(struct ctl *ctl, int argc, char **argv)
{
	print_help(stdout);
	return 0;
}

static void print_version(void)
{
	printf(PROG " %s\n", LOADERD_VERSION);
	printf("libloader %s\n", ldr_version());
	printf("nng %s\n", ldr_nng_version());
	printf("protobuf-c %s\n", ldr_protobuf_c_version());
	printf("jansson %s\n", jansson_version_str());
	printf("zlib %s\n", zlibVersion());
}

/* Parse one option into @ctl; usage errors exit. */
static void handle_option(struct ctl *ctl, int id, const char *arg)
{
	switch (id) {
	case OPT_SOCKET:
		if (!*arg)
			usage_error("invalid socket path -- ''");
		ctl->socket = arg;
		break;
	case OPT_JSON:
		ctl->json = true;
		break;
	case OPT_HELP:
		print_help(stdout);
		exit(EXIT_SUCCESS);
	case OPT_VERSION:
		print_version();
		exit(EXIT_SUCCESS);
	case OPT_VERBOSE:
		ctl->verbose = true;
		break;
	case OPT_SPEC:
		if (!*arg)
			usage_error("invalid spec file -- ''");
		ctl->spec = arg;
		break;
	case OPT_EXIST_OK:
		ctl->exist_ok = true;
		break;
	case OPT_SCOPED:
		ctl->scoped = true;
		break;
	case OPT_FORCE:
		ctl->force = true;
		break;
	case OPT_MODE: {
		int m = ldr_mode_from_name(arg);

		if (m < 0)
			usage_error("invalid mode -- '%s' (broadcast, partition or dynamic)", arg);
		ctl->mode = m;
		ctl->has_mode = true;
		break;
	}
	case OPT_RANK:
		ctl->rank = (uint32_t)arg_u64("rank", arg, 0, UINT32_MAX - 1);
		ctl->has_rank = true;
		break;
	case OPT_WORLD_SIZE:
		ctl->world_size = (uint32_t)arg_u64("world size", arg, 1, UINT32_MAX);
		ctl->has_world = true;
		break;
	case OPT_START_EPOCH:
		ctl->start_epoch = arg_u64("start epoch", arg, 0, UINT64_MAX);
		ctl->has_start_epoch = true;
		break;
	case OPT_START_BATCH:
		ctl->start_batch = arg_u64("start batch", arg, 0, UINT64_MAX);
		ctl->has_start_batch = true;
		break;
	case OPT_BATCHES:
		ctl->batches = arg_u64("batch count", arg, 1, UINT64_MAX);
		ctl->has_batches = true;
		break;
	case OPT_EPOCHS:
		ctl->epochs = arg_u64("epoch count", arg, 1, UINT64_MAX);
		ctl->has_epochs = true;
		break;
	case OPT_DUMP:
		if (!*arg)
			usage_error("invalid dump file -- ''");
		ctl->dump = arg;
		break;
	case OPT_INFLIGHT:
		ctl->inflight = (uint32_t)arg_u64("inflight count", arg, 1, LDR_INFLIGHT_MAX);
		break;
	case OPT_TIMEOUT:
		ctl->timeout_ms = (int)arg_u64("timeout", arg, 0, INT_MAX);
		break;
	case OPT_DELAY:
		ctl->delay_ms = (unsigned)arg_u64("delay", arg, 0, 3600000);
		break;
	case OPT_DEVICE: {
		uint64_t v;

		if (!strcmp(arg, "cpu") || !strcmp(arg, "host")) {
			ctl->device_kind = LDR_DEVICE_HOST;
			ctl->device_index = 0;
		} else if (!strcmp(arg, "cuda")) {
			ctl->device_kind = LDR_DEVICE_CUDA;
			ctl->device_index = 0;
		} else if (!strncmp(arg, "cuda:", 5) && parse_u64(arg + 5, INT_MAX, &v) == 0) {
			ctl->device_kind = LDR_DEVICE_CUDA;
			ctl->device_index = (int)v;
		} else {
			usage_error("invalid device -- '%s' (cpu, cuda or cuda:N)", arg);
		}
		break;
	}
	default:
		/* getopt already said what was wrong */
		fputs("Try '" PROG " --help' for more information.\n", stderr);
		exit(EXIT_USAGE);
	}
}

int main(int argc, char **argv)
{
	static const struct option global_options[] = {
		COMMON_OPTIONS,
		{ "version", no_argument, NULL, OPT_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct ctl ctl = { .mode = LDR_MODE_BROADCAST, .timeout_ms = -1 };
	const struct verb *verb = NULL;
	int c, nargs;

	argv[0] = (char *)PROG; /* getopt's messages say "loaderctl: ..." */

	/* '+': stop at the command, whose own options follow it. */
	while ((c = getopt_long(argc, argv, "+s:jhV", global_options, NULL)) != -1)
		handle_option(&ctl, c, optarg);
	if (optind >= argc)
		usage_error("missing command");

	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		if (!strcmp(argv[optind], verbs[i].name))
			verb = &verbs[i];
	if (!verb)
		usage_error("unknown command -- '%s'", argv[optind]);

	/* Parse the command's options; argv[0] of the sub-vector is the command. */
	argc -= optind;
	argv += optind;
	argv[0] = (char *)PROG;
	optind = 0;
	while ((c = getopt_long(argc, argv, verb->options == consume_options ? "s:jhv" : "s:jh",
	                        verb->options, NULL)) != -1)
		handle_option(&ctl, c, optarg);

	nargs = argc - optind;
	if (nargs < verb->min_args)
		usage_error("%s: missing %s", verb->name,
		            verb->max_args == 1 ? "argument NAME" : verb->fn == cmd_set ?
		            "arguments (set workers N, set prefetch PIPELINE N, set log-level LEVEL)" :
		            "arguments");
	if (nargs > verb->max_args)
		usage_error("%s: unexpected argument -- '%s'", verb->name, argv[optind + verb->max_args]);
	if (verb->fn == cmd_create && !ctl.spec)
		usage_error("create: missing --spec FILE");

	return verb->fn(&ctl, nargs, argv + optind);
}
