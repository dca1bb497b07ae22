/* SPDX-License-Identifier: MIT */
/* libloader: whose daemon: the peer's uid of every connection, checked
 * before a byte goes to it.
 *
 * A socket path can be taken by whoever may write its directory while the
 * daemon is away (a path in /tmp, a restart): a trainer that followed such a
 * squatter would read its batches as its own. So each connection's peer uid,
 * from the kernel (SO_PEERCRED, which nng gives as NNG_OPT_IPC_PEER_UID), must
 * be root's, the client's own, or loaderd's service user's
 * ($LOADERD_DAEMON_USER, else the user "loaderd" that the systemd unit runs
 * as), and a reconnection must find the uid of the daemon it first talked to.
 * A connection that fails the check is closed in nng's NNG_PIPE_EV_ADD_PRE,
 * before the socket may send on it; the call waiting for it gets the reason
 * (docs/security.md, "Whose pipeline, whose daemon").
 */
#include <pwd.h>

#include "libloader-private.h"

const char *uid_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char tmp[4096];

	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
		snprintf(buf, len, "%s (uid %u)", pw.pw_name, (unsigned)uid);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
	return buf;
}

int daemon_user_init(struct ldr_client *c)
{
	const char *v = getenv("LOADERD_DAEMON_USER");
	const char *name = v && *v ? v : "loaderd";
	struct passwd pw, *res = NULL;
	char tmp[4096], *end;
	unsigned long n;

	c->has_service_uid = false;
	errno = 0;
	n = strtoul(name, &end, 10);
	if (*name >= '0' && *name <= '9' && !*end && !errno && n < (uid_t)-1) {
		c->service_uid = (uid_t)n;
		c->has_service_uid = true;
		return 0;
	}
	if (getpwnam_r(name, &pw, tmp, sizeof(tmp), &res) == 0 && res) {
		c->service_uid = pw.pw_uid;
		c->has_service_uid = true;
		return 0;
	}
	if (name == v)
		return set_err(-EINVAL, "LOADERD_DAEMON_USER='%s' is neither a user of this machine nor a uid", v);
	return 0; /* no user "loaderd": root and the client's own uid only */
}

/*
 * May a daemon of @uid serve this client? Sets c->refused (why not) and
 * returns false, else records the uid. Called with c->lock held.
 */
static bool daemon_accept(struct ldr_client *c, uid_t uid)
{
	char who[96], first[96], self[96], svc[160] = "";

	if (c->has_daemon_uid) {
		if (uid == c->daemon_uid)
			return true;
		snprintf(c->refused, sizeof(c->refused), "the daemon at %s now runs as %s, not as %s as "
		         "when this client connected: refusing to follow it (another user's process may "
		         "have taken the socket path; docs/security.md)", c->path,
		         uid_name(uid, who, sizeof(who)), uid_name(c->daemon_uid, first, sizeof(first)));
		return false;
	}
	if (uid == 0 || uid == geteuid() || (c->has_service_uid && uid == c->service_uid)) {
		c->has_daemon_uid = true;
		c->daemon_uid = uid;
		return true;
	}
	if (c->has_service_uid)
		snprintf(svc, sizeof(svc), " nor loaderd's service user %s",
		         uid_name(c->service_uid, first, sizeof(first)));
	snprintf(c->refused, sizeof(c->refused), "the daemon at %s runs as %s, which is neither root, "
	         "you (%s)%s: refusing to talk to it (another user's process may have taken the socket "
	         "path; set LOADERD_DAEMON_USER for a service user of another name; docs/security.md)",
	         c->path, uid_name(uid, who, sizeof(who)), uid_name(geteuid(), self, sizeof(self)), svc);
	return false;
}

/* NNG_PIPE_EV_ADD_PRE: the connection's peer, before anything is sent on it. */
static void on_pipe_add(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct ldr_client *c = arg;
	uint64_t uid;
	bool ok;

	(void)ev;
	pthread_mutex_lock(&c->lock);
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) != 0) {
		snprintf(c->refused, sizeof(c->refused), "cannot read the uid of the daemon at %s "
		         "(SO_PEERCRED): refusing to talk to it", c->path);
		ok = false;
	} else {
		ok = daemon_accept(c, (uid_t)uid);
	}
	if (ok) {
		c->refused[0] = '\0';
	} else {
		/* the Hello waiting for a connection hears it at once */
		for (struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
			nng_aio_cancel(sc->aio);
	}
	pthread_mutex_unlock(&c->lock);
	if (!ok)
		nng_pipe_close(p);
}

int daemon_watch(struct ldr_client *c)
{
	return nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_PRE, on_pipe_add, c);
}

int daemon_refused(struct ldr_client *c, int r)
{
	pthread_mutex_lock(&c->lock);
	if (c->refused[0])
		r = set_err(-EPERM, "%s", c->refused);
	pthread_mutex_unlock(&c->lock);
	return r;
}
