/* SPDX-License-Identifier: MIT */
/* top - `loaderctl top`: the figures of status, refreshed live */

#include "loaderctl.h"
#include "term.h"

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

int cmd_top(struct ctl *ctl, int argc, char **argv)
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
