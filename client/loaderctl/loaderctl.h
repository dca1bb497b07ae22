/* SPDX-License-Identifier: MIT */
/* loaderctl.h - what the files of loaderctl share (not installed)
 *
 * layer: client/loaderctl -> include common
 *
 * loaderctl is a plain client of the daemon: its files may include the
 * public API (include/loader/loader.h) and one another, nothing of
 * client/libloader, common/ or daemon/ (anything it does, a trainer can do
 * with the same API); the one exception is common/'s mmidx.h, the parser
 * of Megatron .idx files that `inspect` runs locally, as the daemon does.
 * One file per command group (status.c, top.c,
 * pipelines.c, consume.c, admin.c), the tables they print (figures.c,
 * table.c), helpers (util.c); the terminal of `top` on its own (term.c);
 * loaderctl.c holds main(), the options and the table of commands.
 */
#ifndef LOADERD_LOADERCTL_H
#define LOADERD_LOADERCTL_H

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

#include "loader/loader.h"

#define PROG "loaderctl"

#define EXIT_USAGE 2

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
	bool has_start_position;
	uint64_t start_position;
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
	/* inspect */
	uint64_t seq_len;         /* 0: not given */
};

static inline void warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void warnx(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static inline _Noreturn void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline _Noreturn void usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry '" PROG " --help' for more information.\n", stderr);
	exit(EXIT_USAGE);
}

/* util.c */
int parse_u64(const char *s, uint64_t max, uint64_t *out);
uint64_t arg_u64(const char *what, const char *s, uint64_t min, uint64_t max);
double round_to(double x, double scale);
double now_s(void);
int fail(struct ldr_client *client, const char *verb, int err);
int connect_daemon(struct ctl *ctl, const char *verb, struct ldr_client **out);
int print_json(json_t *v);
json_t *parse_reply(const char *verb, char *text);
void fmt_bytes(char *buf, size_t n, double b);
void fmt_key(char *buf, size_t n, const json_t *obj, const char *key);
void fmt_pair(char *buf, size_t n, const json_t *obj, const char *a, const char *b);

/* table.c */
#define TABLE_COLS 16
#define CELL_MAX 256

struct table {
	int ncols;
	size_t nrows;
	size_t cap;
	char (*cells)[TABLE_COLS][CELL_MAX];
};

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

int table_add(struct table *t, const char *const *row);
void lines_put(struct lines *l, const char *s, size_t n);
void lines_add(struct lines *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int lines_print(struct lines *l);
void table_lines(const struct table *t, struct lines *l);
void table_print(const struct table *t);
void table_free(struct table *t);

/* figures.c: rows sorted by one key, ties in the daemon's order */
enum sort_key { SORT_WAIT, SORT_RATE, SORT_NAME, SORT_ID, SORT_KEYS };

extern const char *const sort_names[SORT_KEYS];

int print_pipelines(const json_t *pipelines, bool lifetime_only);
void print_pipeline_notes(const json_t *pipelines);
int sort_from_name(const char *s);
int figures_pipelines(struct lines *l, const json_t *pipelines, const json_t *clients,
                      enum sort_key key);
int figures_clients(struct lines *l, const json_t *clients, enum sort_key key);
void fmt_daemon_line(char *buf, size_t n, const json_t *st);
int print_clients(const json_t *clients);
void print_cuda_lines(const json_t *st);

/* the commands: status.c */
int json_request(struct ctl *ctl, const char *verb, json_t **out,
               int (*call)(struct ldr_client *, void *, char **), void *arg);
int cmd_status(struct ctl *ctl, int argc, char **argv);
int cmd_pipelines(struct ctl *ctl, int argc, char **argv);
int cmd_clients(struct ctl *ctl, int argc, char **argv);

/* top.c */
int cmd_top(struct ctl *ctl, int argc, char **argv);

/* pipelines.c */
int cmd_create(struct ctl *ctl, int argc, char **argv);
int cmd_drop(struct ctl *ctl, int argc, char **argv);
int cmd_credentials(struct ctl *ctl, int argc, char **argv);

/* consume.c */
int cmd_consume(struct ctl *ctl, int argc, char **argv);

/* inspect.c */
int cmd_inspect(struct ctl *ctl, int argc, char **argv);

/* admin.c */
int cmd_set(struct ctl *ctl, int argc, char **argv);
int cmd_reload(struct ctl *ctl, int argc, char **argv);

#endif
