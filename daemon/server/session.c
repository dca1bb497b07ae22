/* SPDX-License-Identifier: MIT */
/* session - client sessions: one per nng pipe (connection)
 *
 * nng's pipe events say when a connection appeared (with the peer's pid and
 * uid) and when it went away, which releases every lease it held at once.
 */
#include "server-private.h"

/* --- clients ------------------------------------------------------------ */

struct client *client_find(struct server *srv, uint32_t pipe)
{
	for (struct client *cl = srv->clients; cl; cl = cl->next)
		if (cl->pipe == pipe)
			return cl;
	return NULL;
}

/* The client as a principal: an admin is root, the daemon's own user, or a
 * member of the config's admin_group (its groups as its process had them when
 * it connected). */
void who_is(const struct server *srv, const struct client *cl, struct principal *p)
{
	p->creds = cl->creds;
	p->admin = cl->uid == 0 || cl->uid == geteuid() ||
	           (srv->admin_gid >= 0 && creds_in_group(&cl->creds, (gid_t)srv->admin_gid));
}

/* --- quotas ------------------------------------------------------------- */

/*
 * Connections are a quota per uid (max_connections_per_uid), inside the
 * global MAX_CLIENTS: one user's 512 connections would lock every other user
 * out. A connection over a quota is still accepted, so that its client learns
 * why: its session is marked refused, its Hello is answered with EUSERS and
 * the message below (ldr_connect() returns it, loaderd.Error carries it), and
 * the daemon closes it REFUSED_CLOSE_MS later if the client has not. The
 * close comes that late so that it never races the answer going out (nng
 * 1.5.2 can lose its reaper to a close racing a reply, nngfix.c). At most
 * REFUSED_OPEN_MAX refused connections wait so; more are closed at once,
 * unanswered. Root and the daemon's own uid (the watchdog's probes) have no
 * quota of their own, only MAX_CLIENTS.
 */
static unsigned uid_connections(const struct server *srv, uid_t uid)
{
	unsigned n = 0;

	for (const struct client *cl = srv->clients; cl; cl = cl->next)
		if (cl->uid == uid && !cl->refused)
			n++;
	return n;
}

/* One warning when a burst of refusals starts, one notice with the count when
 * it ends (sessions_tick): a flood never writes a line per connection. */
static void refusal_logged(struct server *srv, uid_t uid, int pid, unsigned held)
{
	uint64_t now = uv_now(srv->loop);
	struct refusal_burst *b = NULL;

	srv->refused_total++;
	for (unsigned i = 0; i < srv->nbursts; i++)
		if (srv->bursts[i].uid == uid)
			b = &srv->bursts[i];
	if (b) {
		b->count++;
		b->last_ms = now;
		return;
	}
	if (srv->nbursts < REFUSAL_UIDS)
		b = &srv->bursts[srv->nbursts++];
	else
		b = &srv->bursts[REFUSAL_UIDS - 1]; /* a ninth uid at once: counted as the eighth's */
	if (uid == (uid_t)-1)
		log_warn("refusing connections: %u clients connected (the most, %d); "
		         "refusals are counted until they stop", held, MAX_CLIENTS);
	else
		log_warn("refusing connections from uid %u (pid %d and others): it holds %u "
		         "(max_connections_per_uid %u); refusals are counted until they stop",
		         (unsigned)uid, pid, held, srv->max_conn_per_uid);
	*b = (struct refusal_burst){ .uid = uid, .count = 1, .first_ms = now, .last_ms = now };
}

/* The end of bursts; refused connections their client did not close. */
void sessions_tick(struct server *srv)
{
	uint64_t now = uv_now(srv->loop);
	struct client *cl, *next;

	for (unsigned i = 0; i < srv->nbursts;) {
		struct refusal_burst *b = &srv->bursts[i];
		if (now - b->last_ms < REFUSAL_BURST_MS) {
			i++;
			continue;
		}
		if (b->uid == (uid_t)-1)
			log_notice("refused %u connections in %.1f s (too many clients)", b->count,
			           (double)(b->last_ms - b->first_ms) / 1000.0);
		else
			log_notice("refused %u connections from uid %u in %.1f s (max_connections_per_uid %u)",
			           b->count, (unsigned)b->uid, (double)(b->last_ms - b->first_ms) / 1000.0,
			           srv->max_conn_per_uid);
		*b = srv->bursts[--srv->nbursts];
	}
	for (cl = srv->clients; cl; cl = cl->next)
		client_log_summary(srv, cl, false);
	for (cl = srv->clients; cl && srv->nrefused; cl = next) {
		next = cl->next;
		if (cl->refused && now - cl->since_ms >= REFUSED_CLOSE_MS) {
			nng_pipe p = NNG_PIPE_INITIALIZER;
			memcpy(&p, &cl->pipe, sizeof(cl->pipe));
			nng_pipe_close(p);
			/* its REM_POST, if nng still sends one, finds no session */
			client_free(srv, cl);
		}
	}
}

/*
 * nng may hand us a pipe's first message before its ADD_POST event, and its
 * ADD_POST after its REM_POST: the callbacks run on different threads. So a
 * session starts with whichever comes first, provided nng still knows the pipe
 * (a query of a removed pipe fails), and REM_POST ends it.
 */
struct client *client_get(struct server *srv, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	struct client *cl = client_find(srv, id);
	uint64_t pid = 0, uid = (uint64_t)-1, gid = (uint64_t)-1;
	unsigned admitted = srv->nclients - srv->nrefused, held = 0;
	bool refuse = false, global = false;

	if (cl)
		return cl;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) != 0)
		return NULL;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) != 0 ||
	    nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &gid) != 0) {
		/* no uid: no rule could be applied to it (and uid -1 means
		 * "every uid" to the refusal log) */
		log_warn("refusing a connection from pid %d: its uid and gid cannot be read "
		         "(SO_PEERCRED)", (int)pid);
		nng_pipe_close(p);
		return NULL;
	}
	if (srv->stopping) {
		log_warn("refusing a connection from pid %d: shutting down", (int)pid);
		nng_pipe_close(p);
		return NULL;
	}
	if (admitted >= MAX_CLIENTS) {
		refuse = global = true;
		held = admitted;
	} else if ((uid_t)uid != 0 && (uid_t)uid != geteuid()) {
		held = uid_connections(srv, (uid_t)uid);
		refuse = held >= srv->max_conn_per_uid;
	}
	if (refuse) {
		refusal_logged(srv, global ? (uid_t)-1 : (uid_t)uid, (int)pid, held);
		if (srv->nrefused >= REFUSED_OPEN_MAX) {
			/* enough are waiting for their answer: this one learns nothing */
			nng_pipe_close(p);
			return NULL;
		}
	}
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->pipe = id;
	cl->id = ++srv->client_ctr;
	cl->pid = (int)pid;
	cl->uid = (uid_t)uid;
	cl->refused = refuse;
	cl->refused_all = global;
	cl->listener = (uint32_t)nng_listener_id(nng_pipe_listener(p));
	creds_of_peer(&cl->creds, cl->pid, (uid_t)uid, (gid_t)gid);
	if (pid == 0 && !srv->warned_pidns) {
		/* SO_PEERCRED's pid is 0 for a peer outside the daemon's PID
		 * namespace and its descendants: a trainer pod beside a daemon
		 * pod without hostPID */
		srv->warned_pidns = true;
		log_warn("client %" PRIu64 " (uid %u) has no pid here: it runs in a PID namespace "
		         "this daemon cannot see into, so its groups, its job and the slabs it maps "
		         "cannot be read from /proc; run loaderd in the host's PID namespace "
		         "(Kubernetes: hostPID, docs/deploy.md)", cl->id, (unsigned)cl->uid);
	}
	cl->since_ms = uv_now(srv->loop);
	cl->next = srv->clients;
	srv->clients = cl;
	srv->nclients++;
	if (refuse)
		srv->nrefused++;
	log_event(LOG_DEBUG, "client.connect", "client=%" PRIu64 " pid=%d uid=%u%s", cl->id, cl->pid,
	          (unsigned)cl->uid, refuse ? " refused=true" : "");
	return cl;
}

/* The refusal a refused session's Hello gets (handle_hello). */
void client_refusal(const struct server *srv, const struct client *cl, char *buf, size_t len)
{
	if (cl->refused_all)
		snprintf(buf, len, "loaderd: too many connections (%d, the most it serves); "
		         "try again later", MAX_CLIENTS);
	else
		snprintf(buf, len, "loaderd: too many connections from uid %u "
		         "(max_connections_per_uid %u); close some", (unsigned)cl->uid,
		         srv->max_conn_per_uid);
}

void client_remove_att(struct client *cl, unsigned i)
{
	cl->atts[i] = cl->atts[--cl->natts];
}

void client_log_summary(struct server *srv, struct client *cl, bool final)
{
	uint64_t span_ms = 0;
	uint64_t n = log_limit_due(&cl->malformed, uv_now(srv->loop), final, &span_ms);

	if (n)
		log_warn("client %" PRIu64 " (pid %d): %" PRIu64 " more malformed requests in %.1f s",
		         cl->id, cl->pid, n, (double)span_ms / 1000.0);
	if ((n = log_rate_due(&cl->events, uv_now(srv->loop), final, &span_ms)))
		log_event(LOG_NOTICE, "client.quiet", "client=%" PRIu64 " pid=%d events=%" PRIu64
		          " seconds=%.1f why=\"more than %d events in %d s: counted, not written\"",
		          cl->id, cl->pid, n, (double)span_ms / 1000.0, LOG_RATE_EVENTS,
		          LOG_RATE_WINDOW_MS / 1000);
}

bool client_event_pass(struct server *srv, struct client *cl)
{
	client_log_summary(srv, cl, false);
	return log_rate_pass(&cl->events, uv_now(srv->loop));
}

void client_free(struct server *srv, struct client *cl)
{
	struct client **pp;
	size_t leases = 0;

	for (pp = &srv->clients; *pp; pp = &(*pp)->next)
		if (*pp == cl) {
			*pp = cl->next;
			break;
		}
	srv->nclients--;
	if (cl->refused)
		srv->nrefused--;
	while (cl->natts) {
		struct attachment *a = cl->atts[cl->natts - 1];
		leases += attachment_leases(a);
		client_remove_att(cl, cl->natts - 1);
		attachment_detach(a);
	}
	engine_client_gone(srv->engine, cl->id);
	client_log_summary(srv, cl, true);
	/* the watchdog's probes, refused connections and those that never said
	 * Hello (a flood of them) go to the debug log only */
	char q[LOG_QUOTE_MAX];
	log_event(cl->pid == getpid() || cl->refused || !cl->hello ? LOG_DEBUG : LOG_INFO,
	          "client.disconnect", "client=%" PRIu64 " pid=%d uid=%u name=%s leases_released=%zu "
	          "connected_s=%" PRIu64, cl->id, cl->pid, (unsigned)cl->uid,
	          log_quote(q, cl->name[0] ? cl->name : "-"), leases,
	          (uv_now(srv->loop) - cl->since_ms) / 1000);
	free(cl);
}

struct attachment *client_att(struct client *cl, uint64_t id, unsigned *index)
{
	for (unsigned i = 0; i < cl->natts; i++)
		if (attachment_id(cl->atts[i]) == id) {
			if (index)
				*index = i;
			return cl->atts[i];
		}
	return NULL;
}

/* Every client but @self, the connection that asks. */
json_t *clients_json(struct server *srv, const struct client *self)
{
	json_t *arr = json_array();

	for (struct client *cl = srv->clients; cl; cl = cl->next) {
		/* the caller, and the watchdog's probes (our own pid) */
		if (cl == self || cl->pid == getpid() || cl->refused)
			continue;
		json_t *atts = json_array();
		json_t *last = NULL;
		json_int_t leases = 0, delivered = 0;

		for (unsigned i = 0; i < cl->natts; i++) {
			json_t *a = attachment_json(cl->atts[i]);
			leases += json_integer_value(json_object_get(a, "leases"));
			delivered += json_integer_value(json_object_get(a, "delivered"));
			last = a;
			json_array_append_new(atts, a);
		}
		json_array_append_new(arr, json_pack("{s:I, s:i, s:I, s:I, s:s, s:O, s:O, s:I, s:I, s:I, s:o}",
			"id", (json_int_t)cl->id,
			"pid", cl->pid,
			"uid", (json_int_t)cl->uid,
			"uid_connections", (json_int_t)uid_connections(srv, cl->uid),
			"name", cl->name,
			"pipeline", last ? json_object_get(last, "pipeline") : json_null(),
			"mode", last ? json_object_get(last, "mode") : json_null(),
			"leases", leases,
			"delivered", delivered,
			"connected_s", (json_int_t)((uv_now(srv->loop) - cl->since_ms) / 1000),
			"attachments", atts));
	}
	return arr;
}
