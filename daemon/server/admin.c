/* SPDX-License-Identifier: MIT */
/* admin - the admin requests: Set (tune one setting live) and Reload
 *
 * Both are for admins only (docs/security.md): a setting is the daemon's,
 * for every user at once. Each change is logged with who made it and the
 * value before and after, and the reply says the same as JSON, so that a
 * script sees exactly what took effect. A reload itself is the daemon's
 * (reload.c, the same as SIGHUP): the server only checks who asks and hands
 * the request on.
 */

#include "base/config-change.h"
#include "server-private.h"
#include "base/size.h"
#include "engine/workers.h"

/* "ldr-alice (uid 1001), pid 4242": who asked, for the log. */
static void who_text(const struct client *cl, char *buf, size_t len)
{
	char user[128];

	snprintf(buf, len, "%s, pid %d", creds_user_name(cl->uid, user, sizeof(user)), cl->pid);
}

/* Is @cl an admin? Else answer EPERM naming the rule and return false. */
static bool admin_or_reply(struct server *srv, struct sctx *c, const struct client *cl,
                           const char *what)
{
	struct principal who;
	char user[128], group[160], msg[512];
	char buf[128];

	who_is(srv, cl, &who);
	if (who.admin)
		return true;
	if (srv->admin_gid < 0)
		snprintf(group, sizeof(group), "no admin_group is configured");
	else if (creds_group_name((gid_t)srv->admin_gid, buf, sizeof(buf)))
		snprintf(group, sizeof(group), "the admin_group is %s", buf);
	else
		snprintf(group, sizeof(group), "the admin_group is gid %d", srv->admin_gid);
	snprintf(msg, sizeof(msg), "only root, loaderd's own user and members of the config's "
	         "admin_group may %s (%s); %s is none of them (docs/security.md)",
	         strcmp(what, "reload") == 0 ? "reload the config" : "change settings", group,
	         creds_user_name(cl->uid, user, sizeof(user)));
	reply_error(srv, c, EPERM, msg);
	return false;
}

/* The asker's logfmt fields of a settings.set line. */
static const char *who_fields(char *buf, size_t len, const struct client *cl)
{
	char q[LOG_QUOTE_MAX], user[128];

	snprintf(buf, len, "client=%" PRIu64 " pid=%d uid=%u user=%s", cl->id, cl->pid,
	         (unsigned)cl->uid, log_quote(q, creds_user_name(cl->uid, user, sizeof(user))));
	return buf;
}

/* The reply and the log line of a change (config_change()). */
static void changed(struct server *srv, struct sctx *c, const struct client *cl, const char *key,
                    const char *pipeline, json_t *old, json_t *new, const char *note)
{
	char who[LOG_QUOTE_MAX + 96];

	reply_json(srv, c, config_change("settings.set", key, pipeline, old, new, note,
	                                 who_fields(who, sizeof(who), cl)));
}

/* Strict decimal in @min..@max. */
static int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

static void set_workers(struct server *srv, struct sctx *c, const struct client *cl, const char *value)
{
	unsigned old = engine_workers(srv->engine);
	char err[256], msg[320];
	uint64_t n;
	int r;

	if (parse_uint(value, 1, WORKERS_MAX, &n) < 0) {
		snprintf(msg, sizeof(msg), "workers: '%s' is not a thread count in 1..%d", value,
		         WORKERS_MAX);
		reply_error(srv, c, EINVAL, msg);
		return;
	}
	if ((r = engine_set_workers(srv->engine, (unsigned)n, err, sizeof(err))) < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	changed(srv, c, cl, "workers", NULL, json_integer(old), json_integer((json_int_t)n),
	        n < old ? "threads that leave finish their task first" : NULL);
}

static void set_log_level(struct server *srv, struct sctx *c, const struct client *cl, const char *value)
{
	int lvl = log_level_from_name(value);
	char msg[256], who[LOG_QUOTE_MAX + 96];

	if (lvl < 0) {
		snprintf(msg, sizeof(msg), "log_level: '%s' is none of error, warning, notice, info, "
		         "debug", value);
		reply_error(srv, c, EINVAL, msg);
		return;
	}
	reply_json(srv, c, config_change_log_level(lvl, "settings.set",
	                                           who_fields(who, sizeof(who), cl)));
}

static void set_memory_limit(struct server *srv, struct sctx *c, const struct client *cl,
                             const char *value)
{
	uint64_t old = engine_memory_limit(srv->engine), used = engine_memory_used(srv->engine), n = 0;
	char msg[320];

	if (value && size_parse(value, &n) == -ERANGE) {
		snprintf(msg, sizeof(msg), "memory_limit: '%.64s' is above the largest size, %" PRId64
		         " bytes", value, (int64_t)SIZE_PARSE_MAX);
		reply_error(srv, c, ERANGE, msg);
		return;
	}
	if (!value || size_parse(value, &n) < 0 || !n) {
		snprintf(msg, sizeof(msg), "memory_limit: '%s' is not a size (bytes, or like 512M, "
		         "4G)", value ? value : "");
		reply_error(srv, c, EINVAL, msg);
		return;
	}
	engine_set_memory_limit(srv->engine, n);
	changed(srv, c, cl, "memory_limit", NULL, json_integer((json_int_t)old),
	        json_integer((json_int_t)n), memory_limit_note(msg, sizeof(msg), n, used));
}

static void set_prefetch(struct server *srv, struct sctx *c, const struct client *cl,
                         const char *pipeline, const char *value)
{
	char err[512];
	uint32_t old = 0;
	uint64_t n;
	int r;

	if (!pipeline || !*pipeline) {
		reply_error(srv, c, EINVAL, "prefetch: which pipeline? (Set.pipeline is empty)");
		return;
	}
	if (parse_uint(value, 1, UINT32_MAX, &n) < 0) {
		snprintf(err, sizeof(err), "prefetch: '%s' is not a slot count (1 or more)", value);
		reply_error(srv, c, EINVAL, err);
		return;
	}
	if ((r = engine_set_prefetch(srv->engine, pipeline, (uint32_t)n, &old, err, sizeof(err))) < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	changed(srv, c, cl, "prefetch", pipeline, json_integer(old), json_integer((json_int_t)n), NULL);
}

void handle_set(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Set *m)
{
	const char *key = m->key ? m->key : "";
	char msg[256];

	if (!admin_or_reply(srv, c, cl, "set"))
		return;
	if (strcmp(key, "workers") == 0)
		set_workers(srv, c, cl, m->value);
	else if (strcmp(key, "log_level") == 0)
		set_log_level(srv, c, cl, m->value);
	else if (strcmp(key, "memory_limit") == 0)
		set_memory_limit(srv, c, cl, m->value);
	else if (strcmp(key, "prefetch") == 0)
		set_prefetch(srv, c, cl, m->pipeline, m->value);
	else {
		snprintf(msg, sizeof(msg), "unknown setting '%.64s' (workers, log_level, "
		         "memory_limit, prefetch; the rest change with a reload)", key);
		reply_error(srv, c, EINVAL, msg);
	}
}

/* A reload whose files are opened off the loop (config_reload()). */
struct reload_ctx {
	struct server *srv;
	struct sctx *c;
	uint64_t client_id;
	bool parked;              /* handle_reload() returned: the answer comes later */
	bool answered;            /* the answer came before it returned */
};

static void reload_answer(void *ctx, int r, json_t *report, const char *err)
{
	struct reload_ctx *x = ctx;
	struct client *cl;

	for (cl = x->srv->clients; cl && cl->id != x->client_id; cl = cl->next)
		;
	if (!cl) {
		/* gone meanwhile: the reply goes nowhere (the context is free again) */
		json_decref(report);
		reply_error(x->srv, x->c, ECONNRESET, "client gone");
	} else if (r < 0) {
		reply_error(x->srv, x->c, -r, err);
	} else {
		reply_json(x->srv, x->c, report);
	}
	if (reply_unpark(x->parked, &x->answered))
		free(x);
}

void handle_reload(struct server *srv, struct sctx *c, struct client *cl)
{
	struct reload_ctx *x;
	char who[256];

	if (!admin_or_reply(srv, c, cl, "reload"))
		return;
	if (!(x = calloc(1, sizeof(*x)))) {
		reply_error(srv, c, ENOMEM, "out of memory");
		return;
	}
	*x = (struct reload_ctx){ .srv = srv, .c = c, .client_id = cl->id };
	who_text(cl, who, sizeof(who));
	srv->reload(srv->reload_data, who, reload_answer, x);
	if (reply_park(c, &x->parked, x->answered))
		free(x);
}
