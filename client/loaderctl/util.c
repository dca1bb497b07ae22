/* SPDX-License-Identifier: MIT */
/* util - loaderctl's helpers: messages, numbers, the connection, JSON replies */

#include "loaderctl.h"

/* Strict unsigned decimal: no sign, no blanks, no trailing junk, no overflow. */
int parse_u64(const char *s, uint64_t max, uint64_t *out)
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

uint64_t arg_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
	uint64_t v;

	if (parse_u64(s, max, &v) < 0 || v < min)
		usage_error("invalid %s -- '%s'", what, s);
	return v;
}

/* @x rounded to 1/@scale, for JSON that people read too (x >= 0). */
double round_to(double x, double scale)
{
	double v = x * scale + 0.5;

	return v < 9e18 ? (double)(long long)v / scale : x;
}

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The daemon's message when it gave one, else the error's name. */
int fail(struct ldr_client *client, const char *verb, int err)
{
	const char *msg = client ? ldr_client_error(client) : NULL;

	if (!msg || !*msg)
		msg = ldr_strerror(err);
	warnx("%s: %s", verb, msg);
	return EXIT_FAILURE;
}

int connect_daemon(struct ctl *ctl, const char *verb, struct ldr_client **out)
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
int print_json(json_t *v)
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
json_t *parse_reply(const char *verb, char *text)
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

void fmt_bytes(char *buf, size_t n, double b)
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

void fmt_key(char *buf, size_t n, const json_t *obj, const char *key)
{
	fmt_value(buf, n, json_is_object(obj) ? json_object_get(obj, key) : NULL);
}

/* "used/total" from two keys, "-" when both are missing. */
void fmt_pair(char *buf, size_t n, const json_t *obj, const char *a, const char *b)
{
	char x[64], y[64];

	fmt_key(x, sizeof(x), obj, a);
	fmt_key(y, sizeof(y), obj, b);
	if (!strcmp(x, "-") && !strcmp(y, "-"))
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%s/%s", x, y);
}
