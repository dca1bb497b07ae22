/* SPDX-License-Identifier: MIT */
/* nngfix - every workaround for nng bugs in the daemon (Debian 12 has 1.5.2)
 *
 * Each is compiled only for the nng versions that need it (NNG_*_VERSION of
 * the nng.h built against, server-private.h):
 *
 * - NNGFIX_LISTENER_WEDGE, nng < 1.6.0: nng issue #1518, fixed in nng 1.6.0
 *   ("ipc listener stops accepting"): a peer that hangs up in the middle of
 *   the SP handshake stops the ipc listener from accepting. When the
 *   watchdog's probe fails, heal_listener() binds a new listener over the
 *   path; it cuts the connections the old one holds, and
 *   close_old_listeners() frees what nng 1.5.2 never frees of it (its fds)
 *   once its clients are gone.
 * - The reaper wedge, every version: nng_close() of a REQ socket can block
 *   nng's one reaper thread for good (nng issues #1543 and #1813: the fix of
 *   #1543, PR #1616, was backed out, and #1813 reports it again in 1.7.3), and
 *   a reply racing a killed client's close wedged it here too. No nng release
 *   is known to fix these, so for every version: the watchdog (probe_main)
 *   asks the daemon's own socket twice a second with a hand-framed SP
 *   handshake and Hello over a plain AF_UNIX socket (never an nng socket), its
 *   connections being the reaper's heartbeat; the dead-pid sweep
 *   (on_sweep_timer) releases clients whose process is gone; once no close
 *   has been reported for 30 s, close_orphans() closes the fds nng closed and
 *   left to the reaper. The bounded close lives in common/nngclose.c, shared
 *   with libloader.
 */
#include "server-private.h"

/* nng 1.5.2 never frees the connections queued on a wedged listener. */
static bool nng_leaks_memory;

bool server_nng_leaked(void)
{
	return nng_leaks_memory;
}

/* Exactly @len bytes from @fd, or false. */
static bool recv_all(int fd, void *buf, size_t len)
{
	size_t n = 0;

	while (n < len) {
		ssize_t r = recv(fd, (char *)buf + n, len - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		n += (size_t)r;
	}
	return true;
}

/*
 * With @hello, also one request through the whole daemon: a Hello framed as
 * nng's ipc transport frames a REQ message (type 1, 64-bit big-endian length,
 * the 32-bit request id with its top bit set, the body), answered with the
 * same request id. A listener wedged by #1518 can still complete the
 * transport handshake while its pipe never reaches the socket.
 */
static int sp_probe(const char *path, int timeout_ms, bool hello, atomic_uint *added)
{
	static const uint8_t req_hdr[8] = { 0, 'S', 'P', 0, 0x00, 0x30, 0, 0 }; /* REQ0 */
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000 };
	uint8_t got[8];
	unsigned before = added ? atomic_load(added) : 0;
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -EIO;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -EIO;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		close(fd);
		return e == ECONNREFUSED || e == ENOENT ? -ECONNREFUSED : -EIO;
	}
	if (send(fd, req_hdr, sizeof(req_hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(req_hdr)) {
		close(fd);
		return -EIO;
	}
	/* a REP peer: 0 'S' 'P' 0, protocol 0x31 */
	if (!recv_all(fd, got, sizeof(got)) || memcmp(got, "\0SP\0", 4) || got[4] != 0x00 || got[5] != 0x31) {
		close(fd);
		return -EIO;
	}
	/* A wedged listener completes the transport handshake but never hands
	 * the connection to the socket: nng's ADD_POST (rpc.c) comes within
	 * moments on a healthy one, on nng's thread, whatever the loop does. So
	 * a wedge is known in PROBE_ADD_WAIT_MS, not PROBE_WAIT_MS. */
	for (int waited = 0; added && atomic_load(added) == before; waited += 5) {
		if (waited >= PROBE_ADD_WAIT_MS) {
			close(fd);
			return -EIO;
		}
		usleep(5000);
	}
	if (hello) {
		Loaderd__Request req = LOADERD__REQUEST__INIT;
		Loaderd__Hello h = LOADERD__HELLO__INIT;
		uint8_t msg[128], head[9];
		size_t len;
		uint64_t rlen;
		bool ok;

		h.protocol = LDR_PROTOCOL_VERSION;
		h.client_name = "loaderd-watchdog";
		req.body_case = LOADERD__REQUEST__BODY_HELLO;
		req.hello = &h;
		len = loaderd__request__pack(&req, msg + 13);
		msg[0] = 1;
		for (int i = 0; i < 8; i++)
			msg[1 + i] = (uint8_t)((uint64_t)(len + 4) >> (56 - 8 * i));
		memcpy(msg + 9, "\x80\x00\x00\x01", 4); /* request id 1, top bit set */
		ok = send(fd, msg, 13 + len, MSG_NOSIGNAL) == (ssize_t)(13 + len) && recv_all(fd, head, sizeof(head)) &&
		     head[0] == 1;
		rlen = 0;
		for (int i = 0; ok && i < 8; i++)
			rlen = rlen << 8 | head[1 + i];
		ok = ok && rlen >= 4 && rlen <= sizeof(msg) && recv_all(fd, msg, (size_t)rlen) &&
		     !memcmp(msg, "\x80\x00\x00\x01", 4);
		if (!ok) {
			close(fd);
			return -EIO;
		}
	}
	close(fd);
	return 0;
}

/*
 * socket_probe() - is a daemon listening on @path, and does its nng listener
 * answer? Asked with a complete SP handshake over a plain AF_UNIX socket: the
 * 8-byte header of a REQ peer out, a REP peer's back, within PROBE_WAIT_MS,
 * then a clean close.
 * Never a bare connect(): nng 1.5.2's ipc listener stops accepting after a
 * peer that hangs up in the middle of the handshake (nng issue #1518, fixed in
 * 1.6), so a bare probe would break the very daemon it finds. And never an nng
 * socket of our own: nng_close() of a REQ socket can block for good in 1.5.2,
 * and in the daemon it blocks nng's one reaper thread, after which no
 * connection is ever reaped (clients that went away stay listed, stop hangs).
 * Return: 0 answered; -ECONNREFUSED nobody listens; -EIO no handshake.
 */
int socket_probe(const char *path)
{
	return sp_probe(path, PROBE_WAIT_MS, false, NULL);
}

/*
 * Listen on @path: bind a fresh listener under a temporary name, then rename
 * it over the public path, so that clients never see the path missing.
 */
int listener_start(struct server *srv, nng_listener *out, char *err, size_t errlen)
{
	char tmp[128], url[160];
	nng_listener l;
	int rv;

	snprintf(tmp, sizeof(tmp), "%s.%u", srv->path, srv->heals);
	unlink(tmp);
	snprintf(url, sizeof(url), "ipc://%s", tmp);
	if ((rv = nng_listener_create(&l, srv->sock, url)) != 0 ||
	    (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, (int)srv->sock_mode)) != 0 ||
	    (rv = nng_listener_start(l, 0)) != 0) {
		return errfmt(-EADDRNOTAVAIL, err, errlen, "cannot listen on %s: %s", srv->path,
		              nng_strerror(rv));
	}
	/* mode and group before the path is public: nobody else ever sees it open */
	if (chmod(tmp, srv->sock_mode) < 0 ||
	    (srv->sock_gid >= 0 && chown(tmp, (uid_t)-1, (gid_t)srv->sock_gid) < 0)) {
		int e = errno;

		errfmt(-e, err, errlen, "cannot set the mode %04o%s of %s: %s", srv->sock_mode,
		       srv->sock_gid >= 0 ? " and group" : "", srv->path, strerror(e));
		nng_listener_close(l);
		unlink(tmp);
		return -e;
	}
	if (rename(tmp, srv->path) < 0) {
		int e = errno;

		errfmt(-e, err, errlen, "cannot move %s to %s: %s", tmp, srv->path, strerror(e));
		nng_listener_close(l);
		return -e;
	}
	*out = l;
	return 0;
}

/* An SP handshake with our own socket whose connection reaches the socket
 * within PROBE_ADD_WAIT_MS and whose Hello is answered within PROBE_WAIT_MS. */
static bool probe_once(struct server *srv)
{
	return sp_probe(srv->path, PROBE_WAIT_MS, true, &srv->self_pipes) == 0;
}

/*
 * The listener watchdog. nng 1.5.2 (Debian 12's) stops accepting on an ipc
 * listener after a peer hangs up in the middle of the SP handshake (nng issue
 * #1518, fixed in 1.6): a trainer killed while it connects would leave the
 * daemon deaf to every new client. So a thread checks every PROBE_EVERY_MS that
 * a handshake with our own socket completes; when one does not, the loop
 * starts a fresh listener and renames it over the path. Connected clients keep
 * their connections. Probes cost one connection and one Hello each.
 */
void *probe_main(void *arg)
{
	struct server *srv = arg;
	struct timespec deadline;

	pthread_mutex_lock(&srv->probe_lock);
	while (!srv->probe_stop) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += PROBE_EVERY_MS / 1000;
		deadline.tv_nsec += PROBE_EVERY_MS % 1000 * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
		while (!srv->probe_stop &&
		       pthread_cond_timedwait(&srv->probe_cond, &srv->probe_lock, &deadline) != ETIMEDOUT)
			;
		if (srv->probe_stop)
			break;
		pthread_mutex_unlock(&srv->probe_lock);
		bool ok = probe_once(srv);
		pthread_mutex_lock(&srv->probe_lock);
#if NNGFIX_LISTENER_WEDGE
		if (!ok && !srv->probe_stop) {
			struct event *ev = calloc(1, sizeof(*ev));
			if (ev) {
				ev->type = EV_HEAL;
				push_event(srv, ev);
			}
		}
#else
		(void)ok; /* its connection is what counts: the reaper's heartbeat */
#endif
	}
	pthread_mutex_unlock(&srv->probe_lock);
	return NULL;
}

#define STUCK_MAX 1024

/*
 * Our AF_UNIX sockets bound to <path>.<gen> (a listener's name before its
 * rename, which the connections it accepted carry too): their fds into @fds
 * (at most @max), how many there are in all into *@count; -1 where the
 * listening one is not found, else its fd.
 */
static int named_fds(struct server *srv, unsigned gen, int *fds, unsigned max, unsigned *count)
{
	char want[128];
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int listening = -1;

	*count = 0;
	snprintf(want, sizeof(want), "%s.%u", srv->path, gen);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		struct sockaddr_un sa;
		socklen_t len = sizeof(sa);
		int fd = atoi(e->d_name), acc = 0;
		socklen_t alen = sizeof(acc);
		if (fd <= 2 || fd == dirfd(d))
			continue;
		memset(&sa, 0, sizeof(sa));
		if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sun_family != AF_UNIX ||
		    strcmp(sa.sun_path, want) != 0)
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) == 0 && acc) {
			listening = fd;
			continue;
		}
		if (*count < max)
			fds[*count] = fd;
		++*count;
	}
	closedir(d);
	return listening;
}

#if NNGFIX_LISTENER_WEDGE
/* The fd of our current nng listener: the unix socket bound to its name. */
static int find_listen_fd(struct server *srv)
{
	unsigned n;

	return named_fds(srv, srv->heals, NULL, 0, &n);
}

/*
 * The connections a wedged listener took and will never hand to the socket:
 * those bound to its name whose peer is no client of ours on it (a client's
 * pid is the peer's of its connection; the watchdog's own are never kept).
 * A shutdown (never a close: nng owns the fd) tells each peer at once, and
 * libloader retries a Hello cut so on a fresh connection, which reaches the
 * new listener: a trainer that connected during a wedge waits for the heal,
 * not for its Hello timeout.
 */
static unsigned shutdown_stuck(struct server *srv, unsigned gen, uint32_t listener)
{
	int *fds = malloc(STUCK_MAX * sizeof(int));
	unsigned n = 0, done = 0;

	if (!fds)
		return 0;
	named_fds(srv, gen, fds, STUCK_MAX, &n);
	for (unsigned i = 0; i < n && i < STUCK_MAX; i++) {
		struct ucred uc;
		socklen_t len = sizeof(uc);
		bool client = false;

		if (getsockopt(fds[i], SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
			continue;
		for (struct client *cl = srv->clients; cl && !client; cl = cl->next)
			client = cl->listener == listener && cl->pid == uc.pid && uc.pid != getpid();
		if (!client && shutdown(fds[i], SHUT_RDWR) == 0)
			done++;
	}
	free(fds);
	return done;
}
static void on_drain_timer(uv_timer_t *t)
{
	struct server *srv = t->data;

	wedged_drain(&srv->wedged);
}

static void forget_old(struct server *srv, unsigned i)
{
	memmove(&srv->old[i], &srv->old[i + 1], (srv->nold - i - 1) * sizeof(srv->old[0]));
	srv->nold--;
}

/* Stop draining @fd: nng is about to close it, and the number may be reused. */
static void wedged_remove(struct wedged *w, int fd)
{
	struct wedged keep;

	wedged_init(&keep);
	for (unsigned i = 0; i < w->n; i++) {
		int f = w->fd[(w->head + i) % WEDGED_MAX];
		if (f != fd)
			wedged_add(&keep, f);
	}
	*w = keep;
}

/*
 * A replaced listener whose last client has been gone for 1 s is closed. nng
 * 1.5.2 never frees what a wedged one holds, though: a connection it took but
 * never handed to the socket keeps the listener's endpoint referenced, so
 * neither its listening socket nor those connections are ever closed, even by
 * nng_listener_close() (one fd each, a flood piled them up, two or more per
 * heal). So a second later, what still carries its name is ours to close:
 * nng shut those down in nng_listener_close() and will not touch them again.
 * A listener that was not wedged after all (a false alarm) was freed by nng
 * in that second; a number it freed that was reused since is bound to
 * another name or none, so it is left alone.
 */
static void close_old_listeners(struct server *srv)
{
	uint64_t now = uv_now(srv->loop);

	for (unsigned i = 0; i < srv->nold;) {
		struct old_listener *o = &srv->old[i];
		uint32_t id = (uint32_t)nng_listener_id(o->l);
		bool used = false;

		if (o->closed_ms) {
			unsigned n = 0, left;
			int *fds, lfd;
			if (now - o->closed_ms < 1000) {
				i++;
				continue;
			}
			fds = malloc(STUCK_MAX * sizeof(int));
			lfd = named_fds(srv, o->gen, fds, fds ? STUCK_MAX : 0, &n);
			left = n;
			if (lfd >= 0)
				close(lfd);
			for (unsigned k = 0; fds && k < n && k < STUCK_MAX; k++)
				close(fds[k]);
			if (left > STUCK_MAX) {
				/* more next time */
				o->closed_ms = now;
				free(fds);
				i++;
				continue;
			}
			free(fds);
			log_debug("replaced listener %u: closed %u connections and %s nng left open", id, n,
			          lfd >= 0 ? "its socket" : "no socket");
			forget_old(srv, i);
			continue;
		}
		for (struct client *cl = srv->clients; cl && !used; cl = cl->next)
			used = cl->listener == id;
		if (used || !o->idle_ms) {
			o->idle_ms = used ? 0 : now;
			i++;
			continue;
		}
		if (now - o->idle_ms < 1000) {
			i++;
			continue;
		}
		wedged_remove(&srv->wedged, o->fd);
		nng_listener_close(o->l);
		o->closed_ms = now;
		i++;
	}
}

void heal_listener(struct server *srv)
{
	char err[256] = "";
	nng_listener l;
	unsigned gen, cut;
	int old_fd;

	if (srv->stopping)
		return;
	old_fd = find_listen_fd(srv);
	gen = srv->heals++;
	nng_leaks_memory = true;
	if (listener_start(srv, &l, err, sizeof(err)) < 0) {
		log_err("listener on %s does not accept; replacing it failed: %s", srv->path, err);
		return;
	}
	/* The wedged one keeps its connected clients, so it stays open until
	 * they are gone (close_old_listeners); but nng polls its unaccepted
	 * backlog in a busy loop, so empty that backlog now and shortly after
	 * (new peers reach the new socket only). */
	if (srv->nold == WEDGED_MAX)
		forget_old(srv, 0); /* the oldest: wedged_add() forgets its fd too */
	srv->old[srv->nold++] = (struct old_listener){ .l = srv->listener, .fd = old_fd, .gen = gen };
	wedged_add(&srv->wedged, old_fd);
	cut = shutdown_stuck(srv, gen, (uint32_t)nng_listener_id(srv->listener));
	srv->listener = l;
	wedged_drain(&srv->wedged);
	uv_timer_start(&srv->drain_timer, on_drain_timer, 1000, 0);
	log_warn("listener on %s stopped accepting (a peer hung up during the handshake); replaced it"
	         "%s", srv->path, cut ? ", and told the connections it held to retry" : "");
}
#endif /* NNGFIX_LISTENER_WEDGE */

#define ORPHAN_AFTER_MS 30000

/* fds that some epoll set of ours watches (nng's and the loop's): /proc's
 * fdinfo of each eventpoll fd lists them as "tfd: N". */
static bool *watched_fds(unsigned *max)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	bool *w;
	int hi = 0;

	if (!d)
		return NULL;
	while ((e = readdir(d)))
		if (atoi(e->d_name) > hi)
			hi = atoi(e->d_name);
	w = calloc((size_t)hi + 1, 1);
	*max = (unsigned)hi + 1;
	rewinddir(d);
	while (w && (e = readdir(d))) {
		char path[300], link[64], line[256];
		ssize_t n;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = 0;
		if (strcmp(link, "anon_inode:[eventpoll]") != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", e->d_name);
		if (!(f = fopen(path, "re"))) {
			free(w);
			w = NULL; /* unsure: close nothing */
			break;
		}
		while (fgets(line, sizeof(line), f)) {
			int t;
			if (sscanf(line, "tfd: %d", &t) == 1 && t >= 0 && t <= hi)
				w[t] = true;
		}
		fclose(f);
	}
	closedir(d);
	return w;
}

/*
 * Once nng 1.5.2's reaper has wedged (below), a connection nng closes is
 * taken off its epoll set and shut down, and its fd waits for the reaper to
 * close it: never. A wedged daemon so kept one fd per connection closed
 * after the wedge, its watchdog's probes included (2 a second, idle or not),
 * until it ran out of them (tests/stress/churn.py, docs/reliability.md).
 * The wedge is taken as sure when nng has reported no connection closed for
 * ORPHAN_AFTER_MS: a live reaper reports one every PROBE_EVERY_MS, the
 * watchdog's probe. From then on an fd accepted by one of our listeners
 * (bound to its name) that no epoll set watches, in two sweeps a second
 * apart and still the same socket, is closed here. A live connection is always in nng's
 * epoll set; nng does not touch a closed one again but in the reaper.
 */
static void close_orphans(struct server *srv)
{
	uint64_t now = uv_now(srv->loop);
	struct orphan *seen = srv->orphans, *next;
	unsigned nseen = srv->norphans, nnext = 0, max = 0, closed = 0;
	int *fds;
	bool *w;

	srv->orphans = NULL;
	srv->norphans = 0;
	/* without the watchdog's probes an idle daemon reports no close either:
	 * no sign of a wedge then */
	if (!srv->prober_running || !srv->last_rem_ms || now - srv->last_rem_ms < ORPHAN_AFTER_MS) {
		free(seen);
		return;
	}
	fds = malloc(STUCK_MAX * sizeof(int));
	next = malloc(STUCK_MAX * sizeof(*next));
	w = watched_fds(&max);
	for (unsigned gen = 0; fds && next && w && gen <= srv->heals; gen++) {
		unsigned n = 0;

		named_fds(srv, gen, fds, STUCK_MAX, &n);
		for (unsigned k = 0; k < n && k < STUCK_MAX && nnext < STUCK_MAX; k++) {
			struct stat st;
			bool again = false;

			if ((unsigned)fds[k] < max && w[fds[k]])
				continue;
			if (fstat(fds[k], &st) < 0)
				continue;
			for (unsigned i = 0; i < nseen && !again; i++)
				again = seen[i].fd == fds[k] && seen[i].ino == (uint64_t)st.st_ino;
			if (again) {
				close(fds[k]);
				closed++;
			} else {
				next[nnext++] = (struct orphan){ .fd = fds[k], .ino = (uint64_t)st.st_ino };
			}
		}
	}
	free(fds);
	free(w);
	free(seen);
	srv->orphans = next;
	srv->norphans = nnext;
	if (closed) {
		if (!srv->orphans_closed)
			log_warn("nng's reaper is wedged: closing the fds of the connections it closed and "
			         "would never free (%u now; status nng_fds_closed_by_sweep counts them)", closed);
		srv->orphans_closed += closed;
	}
}

/*
 * Clients whose process is gone while nng still reports their connection
 * open. nng 1.5.2 can wedge its one reaper thread (a reply racing the close of
 * a killed client's connection), after which no connection is ever reported
 * closed: such a client would keep its leases, and hold a broadcast pipeline
 * back, for good. A client whose pid (SO_PEERCRED) has been gone in two
 * sweeps a second apart is released as if it had disconnected; a connection
 * nng does report closed in the meantime is released the normal way.
 */
void on_sweep_timer(uv_timer_t *t)
{
	struct server *srv = t->data;
	struct client *cl, *next;

	if (srv->stopping)
		return;
	sessions_tick(srv);
	pipes_sweep_lost(srv);
#if NNGFIX_LISTENER_WEDGE
	close_old_listeners(srv);
#endif
	close_orphans(srv);
	for (cl = srv->clients; cl; cl = next) {
		next = cl->next;
		/* The watchdog's own probes: kill() cannot tell that they are
		 * gone, but each closes its connection within a few seconds
		 * (sp_probe's timeouts). Once nng has wedged, their closes are
		 * not reported either, and without this their records piled up,
		 * two a second, each one more for every request's client lookup
		 * to walk past (tests/stress/churn.py, docs/reliability.md). */
		if (cl->pid == getpid()) {
			if (uv_now(srv->loop) - cl->since_ms >= PROBE_GONE_MS) {
				srv->probes_swept++;
				client_free(srv, cl);
			}
			continue;
		}
		if (cl->pid <= 0 || kill(cl->pid, 0) == 0 || errno != ESRCH) {
			cl->gone_seen = 0;
			continue;
		}
		if (++cl->gone_seen < 2)
			continue;
		/* once wedged, nng reports no close again: every client that
		 * leaves comes here, so one line, then a count every 10 s */
		srv->ghosts++;
		if (srv->ghosts == 1)
			log_warn("client %" PRIu64 " (pid %d) exited but its connection was never reported "
			         "closed (nng); releasing it, and the next ones without a line each",
			         cl->id, cl->pid);
		else
			srv->ghosts_unlogged++;
		client_free(srv, cl);
	}
	if (srv->ghosts_unlogged && uv_now(srv->loop) - srv->ghosts_logged_ms >= GHOST_LOG_MS) {
		log_warn("released %" PRIu64 " more clients whose connections nng never reported closed "
		         "(%" PRIu64 " since the start)", srv->ghosts_unlogged, srv->ghosts);
		srv->ghosts_unlogged = 0;
		srv->ghosts_logged_ms = uv_now(srv->loop);
	}
}
