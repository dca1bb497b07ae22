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

	if (cl)
		return cl;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) != 0)
		return NULL;
	nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid);
	nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &gid);
	if (srv->stopping || srv->nclients >= MAX_CLIENTS) {
		log_warn("refusing a connection from pid %d: %s", (int)pid,
		         srv->stopping ? "shutting down" : "too many clients");
		nng_pipe_close(p);
		return NULL;
	}
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->pipe = id;
	cl->id = ++srv->client_ctr;
	cl->pid = (int)pid;
	cl->uid = (uid_t)uid;
	creds_of_peer(&cl->creds, cl->pid, (uid_t)uid, (gid_t)gid);
	cl->since_ms = uv_now(srv->loop);
	cl->next = srv->clients;
	srv->clients = cl;
	srv->nclients++;
	log_debug("client %" PRIu64 " (pid %d, uid %u) connected", cl->id, cl->pid, (unsigned)cl->uid);
	return cl;
}

void client_remove_att(struct client *cl, unsigned i)
{
	cl->atts[i] = cl->atts[--cl->natts];
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
	while (cl->natts) {
		struct attachment *a = cl->atts[cl->natts - 1];
		leases += attachment_leases(a);
		client_remove_att(cl, cl->natts - 1);
		attachment_detach(a);
	}
	engine_client_gone(srv->engine, cl->id);
	log_msg(cl->pid == getpid() ? LOG_DEBUG : LOG_INFO,
	        "client %" PRIu64 " (pid %d) disconnected%s", cl->id, cl->pid,
	        leases ? ", its leases were released" : "");
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
		if (cl == self || cl->pid == getpid())
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
		json_array_append_new(arr, json_pack("{s:I, s:i, s:I, s:s, s:O, s:O, s:I, s:I, s:I, s:o}",
			"id", (json_int_t)cl->id,
			"pid", cl->pid,
			"uid", (json_int_t)cl->uid,
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
