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
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>

#include "config.h"
#include "loader/loader.h"
#include "term.h"

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
	OPT_AUGMENT_SEED,
	OPT_OWNER,
	OPT_JOB,
	OPT_INTERVAL = 'd',
	OPT_ITERATIONS = 'n',
	OPT_SORT = 257 + 64,
};

/* Every option of every command lands here; the commands check what applies. */
struct ctl {
	const char *socket;
	bool json;

	/* create */
	const char *spec;
	bool exist_ok;
	bool scoped;
	bool has_owner;           /* --owner: exist_ok may join this uid's */
	uint32_t owner;
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
	bool has_augment_seed;
	uint64_t augment_seed;
	const char *job;
	/* top */
	double interval;
	uint64_t iterations;
	int sort;
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
		/* over a quota the daemon's own sentence says which and what to do;
		 * another user's daemon (EPERM) or a bad LOADERD_DAEMON_USER
		 * (EINVAL), libloader's whose and why */
		const char *msg = r == -EUSERS || r == -EPERM || r == -EINVAL ? ldr_client_error(NULL) : NULL;
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

#define TABLE_COLS 16
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

/* Lines of text for stdout or for a screen: table rows, the header. */
struct lines {
	char *buf;
	size_t len, cap;
	unsigned cols;    /* cut each line to this many columns; 0: never */
	unsigned max;     /* lines kept; 0: all */
	unsigned n;       /* lines added, kept or not */
	bool screen;      /* erase the rest of each line; no newline after row max */
	bool oom;
};

static void lines_put(struct lines *l, const char *s, size_t n)
{
	if (l->oom)
		return;
	if (l->cap - l->len < n + 1) {
		size_t cap = l->cap ? l->cap : 4096;
		char *p;

		while (cap - l->len < n + 1)
			cap *= 2;
		p = realloc(l->buf, cap);
		if (!p) {
			l->oom = true;
			return;
		}
		l->buf = p;
		l->cap = cap;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
	l->buf[l->len] = '\0';
}

/* Bytes of the well-formed UTF-8 character at @s (1 for ASCII), 0 if none. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 :
	           s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;

	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

/*
 * One line. Control characters (C0, DEL, C1) and bytes that are not UTF-8
 * become '?': client names are anyone's bytes, and an escape sequence in one
 * must not reach the terminal. Cut at @l->cols characters.
 */
static void lines_add(struct lines *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lines_add(struct lines *l, const char *fmt, ...)
{
	char line[8192], out[8192];
	unsigned cols = 0;
	size_t o = 0;
	va_list ap;

	l->n++;
	if (l->max && l->n > l->max)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (const unsigned char *p = (const unsigned char *)line; *p && !(l->cols && cols == l->cols);
	     cols++) {
		size_t n = utf8_len(p);

		if (n == 0 || *p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] < 0xa0)) {
			out[o++] = '?';
			p += n ? n : 1;
		} else {
			memcpy(out + o, p, n);
			o += n;
			p += n;
		}
	}
	lines_put(l, out, o);
	if (l->screen)
		lines_put(l, "\x1b[K", 3);
	if (!l->screen || l->n != l->max)
		lines_put(l, "\n", 1);
}

/* Write @l to stdout and free it. */
static int lines_print(struct lines *l)
{
	int r = 0;

	if (l->oom) {
		warnx("out of memory");
		r = EXIT_FAILURE;
	} else if (l->len && (fwrite(l->buf, 1, l->len, stdout) != l->len || fflush(stdout) == EOF)) {
		r = EXIT_FAILURE;
	}
	free(l->buf);
	*l = (struct lines){ 0 };
	return r;
}

static void table_lines(const struct table *t, struct lines *l)
{
	size_t w[TABLE_COLS] = { 0 };
	char line[TABLE_COLS * (CELL_MAX + 2)];

	for (size_t r = 0; r < t->nrows; r++)
		for (int c = 0; c < t->ncols; c++) {
			size_t len = strlen(t->cells[r][c]);
			if (len > w[c])
				w[c] = len;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		size_t len = 0;

		for (int c = 0; c < t->ncols; c++)
			len += (size_t)snprintf(line + len, sizeof(line) - len, "%-*s%s",
			                        c + 1 == t->ncols ? 0 : (int)w[c], t->cells[r][c],
			                        c + 1 == t->ncols ? "" : "  ");
		lines_add(l, "%s", line);
	}
}

static void table_print(const struct table *t)
{
	struct lines l = { 0 };

	table_lines(t, &l);
	lines_print(&l);
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

static void print_pipeline_notes(const json_t *pipelines);

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
static int print_pipelines(const json_t *pipelines, bool lifetime_only)
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
static void print_pipeline_notes(const json_t *pipelines)
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

enum sort_key { SORT_WAIT, SORT_RATE, SORT_NAME, SORT_ID, SORT_KEYS };

static const char *const sort_names[SORT_KEYS] = { "wait", "rate", "name", "id" };

static int sort_from_name(const char *s)
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

/* "image cache: 67% hits, 2000 images, 1.1 GiB of 8.0 GiB (3 refused)", or "". */
static void fmt_cache(char *buf, size_t n, const json_t *p)
{
	const json_t *c = json_object_get(p, "cache");
	double hits = num_at(c, "hits"), misses = num_at(c, "misses");
	double refused = num_at(c, "refused");
	char used[32], cap[32], more[48] = "";

	buf[0] = '\0';
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
static int figures_pipelines(struct lines *l, const json_t *pipelines, const json_t *clients,
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
			char stages[256], cache[160], seeds[512];

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
		}
	}
	table_free(&t);
	free(rows);
	return r;
}

/* The clients table: one row per attachment (a client with none: one row). */
static int figures_clients(struct lines *l, const json_t *clients, enum sort_key key)
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
static void fmt_daemon_line(char *buf, size_t n, const json_t *st)
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

static int print_clients(const json_t *clients)
{
	struct lines l = { 0 };

	if (figures_clients(&l, clients, SORT_ID) < 0)
		l.oom = true;
	return lines_print(&l);
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

	{
		const json_t *pipelines = json_object_get(st, "pipelines");
		const json_t *clients = json_object_get(st, "clients");
		struct lines l = { 0 };
		char line[512], socket[CELL_MAX];

		fmt_daemon_line(line, sizeof(line), st);
		fmt_key(socket, sizeof(socket), st, "socket");
		printf("%s  socket %s\n", line, socket);
		print_cuda_lines(st);
		printf("\n");
		if (figures_pipelines(&l, pipelines, clients, SORT_ID) < 0)
			l.oom = true;
		r = lines_print(&l);
		if (!r) {
			print_pipeline_notes(pipelines);
			if (json_array_size(pipelines))
				printf("\n");
			r = print_pipelines(pipelines, true);
		}
		if (!r) {
			printf("\n");
			r = print_clients(clients);
		}
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
	r = print_pipelines(json_object_get(v, "pipelines"), false);
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

/*
 * `top`: the figures of `status`, redrawn every --interval seconds on the
 * alternate screen until `q`, over one connection (status requests are
 * cheap; a new connection per frame would show up in the daemon's churn).
 * The daemon going away is shown on the screen and retried each frame, so
 * that top survives a restart. Without a terminal it prints --iterations
 * frames (default 1) one after the other, as `top -b` does.
 */
struct top {
	struct ctl *ctl;
	int sort;             /* enum sort_key */
	/* what the frames show; the main thread's */
	json_t *st;           /* the last status; NULL when the last request failed */
	char error[512];      /* why there is none */
	double waited;        /* seconds the request in flight has taken, when long */
	/* the status requests: the fetch thread's (without a terminal: the caller's) */
	struct ldr_client *client;
	json_t *got;
	char got_error[512];
	/* the fetch thread; the flags under the lock */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool want, busy, ready, stop;
	double since;         /* when the request in flight began */
	int done[2];          /* the thread writes a byte once got is ready */
	bool left_behind;     /* stuck in a request when top quit */
};

/* Keep why there is no status (@what: NULL when libloader's message says it). */
static void top_fail(struct top *t, const char *what, int err)
{
	const char *msg = t->client ? ldr_client_error(t->client) : ldr_client_error(NULL);

	if (!what && msg && *msg)
		snprintf(t->got_error, sizeof(t->got_error), "%s", msg);
	else
		snprintf(t->got_error, sizeof(t->got_error), "%s: %s",
		         what ? what : "cannot connect to loaderd", msg && *msg ? msg : ldr_strerror(err));
	json_decref(t->got);
	t->got = NULL;
	ldr_close(t->client);
	t->client = NULL;
}

/*
 * top redials by itself, once a frame: libloader's own reconnection would
 * hold a status call (and the keys) for as long as the daemon is away, and
 * write its line on stderr, over the screen.
 */
static void top_no_reconnect(struct top *t)
{
	ldr_client_set_reconnect(t->client, 0);
}

static void top_fetch(struct top *t)
{
	json_error_t jerr;
	char *text = NULL;
	json_t *v;
	int r;

	if (!t->client) {
		r = ldr_connect(&t->client, t->ctl->socket, PROG);
		if (r < 0) {
			t->client = NULL;
			top_fail(t, NULL, r);
			return;
		}
		top_no_reconnect(t);
	}
	r = ldr_status_json(t->client, &text);
	if (r < 0) {
		top_fail(t, "status", r);
		return;
	}
	v = json_loads(text, 0, &jerr);
	ldr_free(text);
	if (!json_is_object(v)) {
		json_decref(v);
		top_fail(t, "status", -EPROTO);
		snprintf(t->got_error, sizeof(t->got_error), "status: the daemon sent malformed JSON");
		return;
	}
	json_decref(t->got);
	t->got = v;
	t->got_error[0] = '\0';
}

/* What the last request got becomes what the frames show. */
static void top_take(struct top *t)
{
	json_decref(t->st);
	t->st = t->got;
	t->got = NULL;
	memcpy(t->error, t->got_error, sizeof(t->error));
}

/*
 * The fetch thread of an interactive top: a stopped daemon (SIGSTOP, a
 * debugger) answers nothing for up to libloader's call timeout, and the keys
 * must work meanwhile. One request at a time, when the main thread asks.
 */
static void *top_thread(void *arg)
{
	struct top *t = arg;

	pthread_mutex_lock(&t->lock);
	for (;;) {
		while (!t->want && !t->stop)
			pthread_cond_wait(&t->cond, &t->lock);
		if (t->stop)
			break;
		t->want = false;
		t->busy = true;
		t->since = now_s();
		pthread_mutex_unlock(&t->lock);
		top_fetch(t);
		pthread_mutex_lock(&t->lock);
		t->busy = false;
		t->ready = true;
		if (write(t->done[1], "", 1) < 0) {
			/* full: the main thread has a byte to read already */
		}
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

/*
 * Ask for a status unless a request is in flight or its answer not taken
 * yet (the thread writes got only between the two); false then.
 */
static bool top_ask(struct top *t)
{
	bool asked;

	pthread_mutex_lock(&t->lock);
	asked = !t->busy && !t->ready;
	if (asked) {
		t->want = true;
		pthread_cond_signal(&t->cond);
	}
	pthread_mutex_unlock(&t->lock);
	return asked;
}

/* Take a status the thread got, if any; true when there was one. */
static bool top_collect(struct top *t)
{
	char buf[64];
	bool got;

	while (read(t->done[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&t->lock);
	got = t->ready;
	if (got)
		top_take(t);
	t->ready = false;
	t->waited = t->busy && now_s() - t->since >= t->ctl->interval ? now_s() - t->since : 0;
	pthread_mutex_unlock(&t->lock);
	return got;
}


/* One frame: the daemon, the sort key and keys, the pipelines, the clients. */
static void top_frame(const struct top *t, struct lines *l)
{
	const json_t *pipelines = json_object_get(t->st, "pipelines");
	const json_t *clients = json_object_get(t->st, "clients");
	char line[512] = "loaderd -", clock[16];
	time_t now = time(NULL);
	struct tm tm;

	strftime(clock, sizeof(clock), "%H:%M:%S", localtime_r(&now, &tm));
	if (t->st)
		fmt_daemon_line(line, sizeof(line), t->st);
	lines_add(l, "%s  %s", line, clock);
	lines_add(l, "sort: %s  (keys: w wait, r rate, n name, i id, s next; q quit)  every %gs",
	          sort_names[t->sort], t->ctl->interval);
	if (t->error[0])
		lines_add(l, "%s; retrying every %gs", t->error, t->ctl->interval);
	if (t->waited > 0)
		lines_add(l, "no answer from loaderd for %.0fs%s", t->waited,
		          t->st ? "; the figures below are from before" : "");
	if (!t->st)
		return;
	lines_add(l, "%s", "");
	if (figures_pipelines(l, pipelines, clients, t->sort) < 0)
		l->oom = true;
	lines_add(l, "%s", "");
	if (figures_clients(l, clients, t->sort) < 0)
		l->oom = true;
}

static void sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* No terminal: --iterations frames (default 1), a blank line between them. */
static int top_batch(struct top *t)
{
	uint64_t n = t->ctl->iterations ? t->ctl->iterations : 1;

	for (uint64_t i = 0; i < n; i++) {
		struct lines l = { 0 };

		if (i) {
			sleep_s(t->ctl->interval);
			putchar('\n');
		}
		top_fetch(t);
		top_take(t);
		if (!t->st) {
			warnx("top: %s", t->error);
			return EXIT_FAILURE;
		}
		top_frame(t, &l);
		if (lines_print(&l))
			return EXIT_FAILURE;
	}
	return 0;
}

static int top_draw(const struct top *t, struct term *term)
{
	struct lines l = { .cols = term->cols, .max = term->rows, .screen = true };
	int r;

	lines_put(&l, "\x1b[H", 3);
	top_frame(t, &l);
	lines_put(&l, "\x1b[J", 3);
	r = l.oom ? -ENOMEM : term_write(term, l.buf, l.len);
	free(l.buf);
	return r;
}

/* A key pressed in `top`; false: quit. */
static bool top_key(struct top *t, char c)
{
	switch (c) {
	case 'q':
	case 'Q':
	case 3: /* Ctrl-C */
		return false;
	case 'w':
		t->sort = SORT_WAIT;
		break;
	case 'r':
		t->sort = SORT_RATE;
		break;
	case 'n':
		t->sort = SORT_NAME;
		break;
	case 'i':
		t->sort = SORT_ID;
		break;
	case 's':
	case '>':
		t->sort = (t->sort + 1) % SORT_KEYS;
		break;
	case '<':
		t->sort = (t->sort + SORT_KEYS - 1) % SORT_KEYS;
		break;
	}
	return true;
}

static int top_run(struct top *t, struct term *term)
{
	uint64_t frames = 0;
	bool quit = false;
	int r = 0;

	while (!quit && (!t->ctl->iterations || frames < t->ctl->iterations)) {
		double next = now_s() + t->ctl->interval;
		/* the answer redraws; a request still in flight: say how long */
		bool redraw = !top_ask(t);

		frames++;
		while (!quit) {
			bool done = false;
			char keys[64];
			double left;
			int n, sig;

			if (redraw) {
				top_collect(t);
				r = top_draw(t, term);
				if (r < 0)
					return r;
				redraw = false;
			}
			left = next - now_s();
			if (left <= 0)
				break;
			n = term_keys(term, (int)(left * 1000) + 1, t->done[0], &done, keys, sizeof(keys));
			sig = term_signalled();
			if (done || (sig & TERM_RESIZED))
				redraw = true;
			if (sig & TERM_RESIZED)
				term_size(term);
			if (n < 0 || (sig & TERM_QUIT)) /* the terminal hung up, or a signal */
				quit = true;
			for (int i = 0; i < n && !quit; i++) {
				quit = !top_key(t, keys[i]);
				redraw = true;
			}
		}
	}
	return 0;
}

/*
 * Start the fetch thread, run, stop it. A thread stuck in a request to a
 * daemon that does not answer is left behind: the process exits at once.
 * Return: 0, 1 for an error it reported, or a negative errno of the terminal.
 */
static int top_interactive(struct top *t, struct term *term)
{
	bool stuck;
	int r;

	if (pipe2(t->done, O_CLOEXEC | O_NONBLOCK) < 0) {
		r = errno;
		term_leave(term); /* the message must reach the main screen */
		warnx("top: cannot make a pipe: %s", strerror(r));
		return EXIT_FAILURE;
	}
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	r = pthread_create(&t->thread, NULL, top_thread, t);
	if (r) {
		term_leave(term);
		warnx("top: cannot start a thread: %s", strerror(r));
		return EXIT_FAILURE;
	}
	r = top_run(t, term);
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	stuck = t->busy;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	if (stuck) {
		pthread_detach(t->thread);
		t->left_behind = true; /* client and got stay the thread's */
	} else {
		pthread_join(t->thread, NULL);
	}
	return r;
}

static int cmd_top(struct ctl *ctl, int argc, char **argv)
{
	/* static: a fetch thread left behind may use it until the process ends */
	static struct top t;
	struct term term;
	int r;

	if (ctl->json)
		usage_error("top: --json does not apply; use `" PROG " --json status`");
	t.ctl = ctl;
	t.sort = ctl->sort;
	/* a daemon that is not there is an error before the screen changes */
	r = connect_daemon(ctl, "top", &t.client);
	if (r)
		return r;
	top_no_reconnect(&t);
	r = term_enter(&term);
	if (r == -ENOTTY) {
		r = top_batch(&t);
	} else if (r < 0) {
		term_leave(&term);
		warnx("top: cannot set up the terminal: %s", strerror(-r));
		r = EXIT_FAILURE;
	} else {
		r = top_interactive(&t, &term);
		term_leave(&term);
		if (r < 0) {
			warnx("top: writing to the terminal: %s", strerror(-r));
			r = EXIT_FAILURE;
		}
	}
	json_decref(t.st);
	if (!t.left_behind) {
		json_decref(t.got);
		ldr_close(t.client);
	}
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
	r = ctl->has_owner ? ldr_create_pipeline_of(client, text, ctl->owner, name, sizeof(name))
	                   : ldr_create_pipeline(client, text, ctl->exist_ok, name, sizeof(name));
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
	if (ctl->has_augment_seed && ctl->mode == LDR_MODE_DYNAMIC)
		usage_error("consume: --augment-seed applies to broadcast and partition clients");
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
	opts.has_augment_seed = ctl->has_augment_seed;
	opts.augment_seed = ctl->augment_seed;
	opts.job = ctl->job;

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
	{ "owner", required_argument, NULL, OPT_OWNER },
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
	{ "augment-seed", required_argument, NULL, OPT_AUGMENT_SEED },
	{ "job", required_argument, NULL, OPT_JOB },
	{ NULL, 0, NULL, 0 },
};

static const struct option top_options[] = {
	COMMON_OPTIONS,
	{ "interval", required_argument, NULL, OPT_INTERVAL },
	{ "iterations", required_argument, NULL, OPT_ITERATIONS },
	{ "sort", required_argument, NULL, OPT_SORT },
	{ NULL, 0, NULL, 0 },
};

static const struct verb verbs[] = {
	{ "status", 0, 0, cmd_status, "daemon, pipelines and clients", "", no_options },
	{ "pipelines", 0, 0, cmd_pipelines, "list the pipelines", "", no_options },
	{ "clients", 0, 0, cmd_clients, "list the connected clients", "", no_options },
	{ "create", 0, 0, cmd_create, "create a pipeline from a JSON spec (docs/spec.md)",
	  "--spec FILE [--exist-ok] [--owner USER] [--scoped]", create_options },
	{ "drop", 1, 1, cmd_drop, "drop a pipeline", "NAME [--force]", drop_options },
	{ "consume", 1, 1, cmd_consume,
	  "read batches, report throughput and a CRC-32 of their bytes",
	  "NAME [--mode M] [--rank R --world-size W] [--start-epoch E --start-batch B]\n"
	  "          [--batches N | --epochs E] [--dump FILE] [--inflight K] [--timeout MS]\n"
	  "          [--delay MS] [--device cpu|cuda:N] [--augment-seed S] [--job NAME]\n"
	  "          [--verbose]",
	  consume_options },
	{ "set", 2, 3, cmd_set, "change a setting of the running daemon now (admins only)",
	  "workers N | prefetch PIPELINE N | log-level LEVEL | memory-limit SIZE", no_options },
	{ "reload", 0, 0, cmd_reload,
	  "re-read the daemon's config file and apply it, as SIGHUP does (admins only)", "",
	  no_options },
	{ "top", 0, 0, cmd_top, "the figures of status, refreshed live; q quits",
	  "[-d SECS] [-n ITER] [--sort wait|rate|name|id]", top_options },
	{ "help", 0, 0, cmd_help, "show this help", "", no_options },
};

/* getopt's short options of a command: the common -s, -j, -h and its own. */
static const char *short_options(const struct verb *verb)
{
	if (verb->options == consume_options)
		return "s:jhv";
	if (verb->options == top_options)
		return "s:jhd:n:";
	return "s:jh";
}

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
	        "  --exist-ok          succeed when an identical pipeline of yours (or the\n"
	        "                      config's) exists (a persistent create makes it persistent)\n"
	        "  --owner USER        --exist-ok that may also join USER's identical pipeline\n"
	        "                      (a user name or uid; docs/security.md)\n"
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
	        "  --inflight K        batches asked for or waiting, 1..%d (default: the daemon's\n"
	        "                      choice, 4..16 by the batch bytes)\n"
	        "  --timeout MS        fail when no batch arrives within MS ms (default: wait)\n"
	        "  --delay MS          hold each batch MS ms before releasing it, as a\n"
	        "                      trainer's step would (default 0)\n"
	        "  --device D          where batches are delivered: cpu (default, host memory)\n"
	        "                      or cuda:N (GPU N; a daemon that cannot serve it says why;\n"
	        "                      the checksum and --dump read each batch's host copy)\n"
	        "  --augment-seed S    broadcast, partition: draw the random transforms from seed S\n"
	        "                      (0..2^63-1) instead of the spec's seed: the batches a solo\n"
	        "                      run of the spec with \"seed\": S gives; the samples and\n"
	        "                      their order stay the spec's (docs/spec.md, \"Augment seeds\")\n"
	        "  --job NAME          the job this consumer is part of (default: torchrun's\n"
	        "                      $TORCHELASTIC_RUN_ID, else this process): a stream no\n"
	        "                      client reads starts again for another job (docs/spec.md, \"Jobs\")\n"
	        "  -v, --verbose       one line per batch: epoch, batch index, rows, bytes\n"
	        "\n"
	        "top options:\n"
	        "  -d, --interval SECS seconds between refreshes, 0.1 to 3600 (default 1)\n"
	        "  -n, --iterations N  stop after N refreshes (default: run until q)\n"
	        "  --sort KEY          the rows' order: wait (default: the clients that wait\n"
	        "                      longest for data and the busiest pipelines first),\n"
	        "                      rate (samples/s), name, or id (the daemon's order)\n"
	        "  keys: w, r, n, i choose the sort key, s or > the next one, < the one\n"
	        "  before; q or Ctrl-C quits. Without a terminal top prints N frames\n"
	        "  (default 1), one after the other.\n"
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
	        "and the config's pipelines' prefetch (docs/config.md).\n"
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
	case OPT_OWNER: {
		struct passwd *pw = getpwnam(arg);

		if (pw)
			ctl->owner = (uint32_t)pw->pw_uid;
		else if (*arg >= '0' && *arg <= '9')
			ctl->owner = (uint32_t)arg_u64("owner", arg, 0, UINT32_MAX - 1);
		else
			usage_error("invalid owner -- '%s' (a user name or uid)", arg);
		ctl->has_owner = ctl->exist_ok = true;
		break;
	}
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
	case OPT_AUGMENT_SEED:
		ctl->augment_seed = arg_u64("augment seed (0..2^63-1)", arg, 0, INT64_MAX);
		ctl->has_augment_seed = true;
		break;
	case OPT_JOB:
		ctl->job = arg;
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
	case OPT_INTERVAL: {
		char *end;
		double v;

		errno = 0;
		v = strtod(arg, &end);
		if (!*arg || *end || errno || !(v >= 0.1 && v <= 3600))
			usage_error("invalid interval -- '%s' (seconds, 0.1 to 3600)", arg);
		ctl->interval = v;
		break;
	}
	case OPT_ITERATIONS:
		ctl->iterations = arg_u64("iteration count", arg, 1, UINT64_MAX);
		break;
	case OPT_SORT:
		ctl->sort = sort_from_name(arg);
		if (ctl->sort < 0)
			usage_error("invalid sort key -- '%s' (wait, rate, name or id)", arg);
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
	struct ctl ctl = { .mode = LDR_MODE_BROADCAST, .timeout_ms = -1, .interval = 1 };
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
	while ((c = getopt_long(argc, argv, short_options(verb), verb->options, NULL)) != -1)
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
