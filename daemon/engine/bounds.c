/* SPDX-License-Identifier: MIT */
/* bounds - what one user may take of the daemon: memory, pipelines, descriptors
 *
 * --memory-limit bounds the daemon, not its users: one user's persisting
 * pipelines could fill it, and thousands of tiny ones take every descriptor
 * the daemon has (three or more each), after which nobody connects, root
 * included, and the listener cannot be replaced. So each uid that is no admin
 * (root, the daemon's own user, admin_group: they have only the daemon's
 * limits) has its own:
 *
 * - memory_limit_per_user: the bytes of the pipelines it owns (slab and
 *   decoded-image cache, as --memory-limit counts them) and of the dropped
 *   pipelines' slabs it still maps (holds.c), default half of --memory-limit;
 * - max_pipelines_per_user: the pipelines it owns, default 64;
 * - the daemon's last descriptors (RLIMIT_NOFILE / 16, at least 64) are the
 *   admins': a create or an attach of anyone else that would reach into them
 *   is refused, so an admin can always connect, look, drop and read, and the
 *   listener can be replaced. With the connections per uid
 *   (max_connections_per_uid) and the attachments per connection (16), this
 *   bounds the descriptors one user makes the daemon hold.
 *
 * Every refusal names the limit, its value and who has what. The descriptors
 * are counted in /proc/self/fd, at a create or an attach of a non-admin only.
 */
#include <dirent.h>
#include <sys/resource.h>

#include "engine-private.h"

#define FD_RESERVE_MIN 64        /* descriptors kept for admins, at least */
#define FD_RESERVE_SHARE 16      /* ... or this share of RLIMIT_NOFILE */
#define FDS_PER_CREATE 8         /* a slab's two, a source's files, slack */
#define FDS_PER_ATTACH 4         /* a ring, its wake-up, a hold, slack */
#define USERS_SHOWN 4            /* users named in a message */
#define NAMES_SHOWN 4            /* pipelines named per user */

void engine_set_user_bounds(struct engine *eng, uint64_t bytes, unsigned npipelines)
{
	eng->user_memory = bytes;
	eng->max_pipelines_user = npipelines;
}

static uint64_t user_memory_limit(const struct engine *eng)
{
	return eng->user_memory ? eng->user_memory : eng->memory_limit / 2;
}

static unsigned max_pipelines(const struct engine *eng)
{
	return eng->max_pipelines_user ? eng->max_pipelines_user : ENGINE_PIPELINES_PER_USER_DEFAULT;
}

static uint64_t pipeline_bytes(const struct pipeline *pl)
{
	return (pl->slab ? pl->slab->size : 0) + (pl->src ? source_memory_bytes(pl->src) : 0);
}

/* What @uid owns: its pipelines (not dropped), and the bytes of all it owns
 * that are not freed yet (a dropped one that a job still uses too). */
struct usage {
	uid_t uid;
	unsigned npipelines;
	uint64_t bytes;           /* its pipelines' */
	const char *name;         /* the user's name, NULL unknown */
	const char *names[NAMES_SHOWN];
	unsigned nnames;
};

static void usage_add(struct usage *u, const struct pipeline *pl)
{
	u->bytes += pipeline_bytes(pl);
	if (pl->owner_name[0])
		u->name = pl->owner_name;
	if (pl->dropped)
		return;
	u->npipelines++;
	if (u->nnames < NAMES_SHOWN)
		u->names[u->nnames++] = pl->spec->name;
}

static struct usage usage_of(struct engine *eng, uid_t uid)
{
	struct usage u = { .uid = uid };

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next)
		if (pl->owner == uid)
			usage_add(&u, pl);
	return u;
}

/* "ldr-bob (uid 1002)", or "uid 1002" */
static void fmt_who(char *buf, size_t len, const struct usage *u)
{
	if (u->name)
		snprintf(buf, len, "%s (uid %u)", u->name, (unsigned)u->uid);
	else
		snprintf(buf, len, "uid %u", (unsigned)u->uid);
}

/* "a, b, c" and ", ..." past NAMES_SHOWN */
static size_t fmt_names(char *buf, size_t len, const struct usage *u)
{
	size_t off = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < u->nnames && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", u->names[i]);
	if (u->npipelines > u->nnames && off < len)
		off += (size_t)snprintf(buf + off, len - off, ", ...");
	return off;
}

/* --- descriptors -------------------------------------------------------- */

static uint64_t fds_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return UINT32_MAX;
	return rl.rlim_cur;
}

static uint64_t fds_reserve(uint64_t limit)
{
	uint64_t r = limit / FD_RESERVE_SHARE;

	return r < FD_RESERVE_MIN ? FD_RESERVE_MIN : r;
}

/* The daemon's open descriptors, or 0 when it cannot tell. */
static uint64_t fds_open(void)
{
	uint64_t n = 0;
	DIR *d = opendir("/proc/self/fd");

	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n ? n - 1 : 0; /* not the directory's own */
}

static int fds_check(const struct principal *who, const char *what, const char *name,
                     uint64_t need, char *err, size_t errlen)
{
	uint64_t limit, reserve, open;

	if (who->admin)
		return 0;
	limit = fds_limit();
	reserve = fds_reserve(limit);
	open = fds_open();
	if (open + need + reserve <= limit)
		return 0;
	return errfmt(-EMFILE, err, errlen, "%s '%s': loaderd has %" PRIu64 " of its %" PRIu64
	              " file descriptors open and keeps the last %" PRIu64 " for admins (root, "
	              "its own user, admin_group); try again once pipelines are dropped",
	              what, name, open, limit, reserve);
}

/* --- checks --------------------------------------------------------------- */

int bounds_may_create(struct engine *eng, const struct principal *who, const char *name,
                      char *err, size_t errlen)
{
	struct usage u;
	char w[96], names[LDR_NAME_MAX * NAMES_SHOWN + 32];

	if (who->admin)
		return 0;
	u = usage_of(eng, who->creds.uid);
	if (u.npipelines >= max_pipelines(eng)) {
		fmt_who(w, sizeof(w), &u);
		fmt_names(names, sizeof(names), &u);
		return errfmt(-EDQUOT, err, errlen, "pipelines per user: %s owns %u pipelines (%s), "
		              "the most max_pipelines_per_user allows (%u); pipeline '%s' not "
		              "created: drop some first (loaderctl drop NAME)", w, u.npipelines,
		              names, max_pipelines(eng), name);
	}
	return fds_check(who, "create", name, FDS_PER_CREATE, err, errlen);
}

int bounds_may_allocate(struct engine *eng, const struct principal *who, const char *name,
                        uint64_t need, char *err, size_t errlen)
{
	struct usage u;
	uint64_t held, has, limit = user_memory_limit(eng);
	char w[96], names[LDR_NAME_MAX * NAMES_SHOWN + 32], parts[LDR_NAME_MAX * NAMES_SHOWN + 160];
	size_t off = 0;

	if (who->admin)
		return 0;
	u = usage_of(eng, who->creds.uid);
	held = holds_bytes_of(eng, who->creds.uid);
	has = u.bytes + held;
	if (has <= limit && need <= limit - has)
		return 0;
	fmt_who(w, sizeof(w), &u);
	fmt_names(names, sizeof(names), &u);
	parts[0] = '\0';
	if (u.npipelines)
		off = (size_t)snprintf(parts, sizeof(parts), ": %" PRIu64 " bytes in pipelines %s",
		                       u.bytes, names);
	if (held && off < sizeof(parts))
		snprintf(parts + off, sizeof(parts) - off, "%s%" PRIu64 " bytes of dropped pipelines' "
		         "slabs it still maps", off ? ", " : ": ", held);
	return errfmt(-EDQUOT, err, errlen, "memory limit per user: pipeline '%s' needs %" PRIu64
	              " bytes; %s has %" PRIu64 " of its %" PRIu64 " bytes (memory_limit_per_user)"
	              "%s; drop some first", name, need, w, has, limit, parts);
}

int bounds_may_order(struct engine *eng, uid_t uid, bool admin, uint64_t need, char *err,
                     size_t errlen)
{
	struct usage u = usage_of(eng, uid);
	uint64_t orders = 0, has, limit = admin ? eng->memory_limit : user_memory_limit(eng);
	char w[96];

	for (const struct attachment *a = eng->atts; a; a = a->all_next)
		if (a->uid == uid && a->stream && a->stream->client_order)
			orders += order_bytes(a->stream);
	has = (admin ? 0 : u.bytes + holds_bytes_of(eng, uid)) + orders;
	if (has <= limit && need <= limit - has)
		return 0;
	fmt_who(w, sizeof(w), &u);
	return errfmt(-EDQUOT, err, errlen, "order: %" PRIu64 " more bytes of sampler order would pass "
	              "the %s of %s (%" PRIu64 " bytes; it has %" PRIu64 ", %" PRIu64 " of them "
	              "orders): the daemon keeps an epoch's order until its batches are read; use a "
	              "sampler with fewer samples per epoch, or raise the limit",
	              need, admin ? "memory_limit" : "memory_limit_per_user", w, limit, has, orders);
}

int bounds_may_attach(struct engine *eng, const struct principal *who, const char *name,
                      char *err, size_t errlen)
{
	(void)eng;
	return fds_check(who, "attach", name, FDS_PER_ATTACH, err, errlen);
}

/* --- every user --------------------------------------------------------- */

/* The usage of each owner, at most @cap of them, most bytes first. */
static size_t usage_all(struct engine *eng, struct usage *u, size_t cap)
{
	size_t n = 0;

	for (struct pipeline *pl = eng->pipelines; pl; pl = pl->next) {
		size_t i;
		for (i = 0; i < n && u[i].uid != pl->owner; i++)
			;
		if (i == n) {
			if (n == cap)
				continue;
			u[n++] = (struct usage){ .uid = pl->owner };
		}
		usage_add(&u[i], pl);
	}
	for (size_t i = 1; i < n; i++)
		for (size_t k = i; k > 0 && u[k].bytes > u[k - 1].bytes; k--) {
			struct usage t = u[k];
			u[k] = u[k - 1];
			u[k - 1] = t;
		}
	return n;
}

void bounds_explain_users(struct engine *eng, char *buf, size_t len)
{
	struct usage u[64];
	size_t n = usage_all(eng, u, 64), off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && i < USERS_SHOWN && off < len; i++) {
		char w[96], names[LDR_NAME_MAX * NAMES_SHOWN + 32];
		if (!u[i].npipelines)
			continue;
		fmt_who(w, sizeof(w), &u[i]);
		fmt_names(names, sizeof(names), &u[i]);
		off += (size_t)snprintf(buf + off, len - off, "; %s holds %" PRIu64 " bytes in "
		                        "pipelines %s", w, u[i].bytes, names);
	}
	if (n > USERS_SHOWN && off < len)
		snprintf(buf + off, len - off, "; and %zu more users", n - USERS_SHOWN);
}

void engine_bounds_status(struct engine *eng, json_t *status, const struct principal *who)
{
	struct usage u[256];
	uid_t held[64];
	size_t n = usage_all(eng, u, 256), nheld = holds_uids(eng, held, 64);
	json_t *users = json_array();
	uint64_t limit = fds_limit();

	/* those who hold dropped slabs and own nothing, and the asker itself */
	for (size_t k = 0; k <= nheld && n < 256; k++) {
		uid_t uid = k < nheld ? held[k] : who->creds.uid;
		size_t i;
		for (i = 0; i < n && u[i].uid != uid; i++)
			;
		if (i == n)
			u[n++] = (struct usage){ .uid = uid };
	}
	for (size_t i = 0; i < n; i++) {
		if (!who->admin && u[i].uid != who->creds.uid)
			continue;
		json_array_append_new(users, json_pack("{s:I, s:s?, s:i, s:I, s:I}",
			"uid", (json_int_t)u[i].uid, "user", u[i].name,
			"pipelines", (int)u[i].npipelines, "memory_bytes", (json_int_t)u[i].bytes,
			"held_after_drop_bytes", (json_int_t)holds_bytes_of(eng, u[i].uid)));
	}
	json_object_set_new(status, "memory_limit_per_user", json_integer((json_int_t)user_memory_limit(eng)));
	json_object_set_new(status, "max_pipelines_per_user", json_integer(max_pipelines(eng)));
	json_object_set_new(status, "users", users);
	json_object_set_new(status, "fds", json_pack("{s:I, s:I, s:I}",
		"open", (json_int_t)fds_open(), "limit", (json_int_t)limit,
		"reserved_for_admins", (json_int_t)fds_reserve(limit)));
}
