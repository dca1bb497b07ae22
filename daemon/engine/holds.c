/* SPDX-License-Identifier: MIT */
/* holds - slabs that clients still map after their pipeline was dropped
 *
 * A dropped pipeline frees its slab, but the pages of a memfd live as long as
 * any descriptor or mapping of it does, and every client that fetched the fd
 * (fdchan.c) has both. So the memory budget cannot forget a slab until its
 * clients let it go (docs/security.md, "Memory that clients hold").
 *
 * Each hand-out of a slab fd is a fresh open file description (a reopen of
 * the memfd through /proc/self/fd, as slab.c makes ro_fd), and the daemon puts
 * an OFD read lock on it, on one byte far past the end of the file that
 * belongs to that (pipeline, pid): a hold. A python pipeline's worker host
 * gets its read-write fd (pyworkers.c) the same way: a host that keeps the
 * slab after the drop (one that ignores the daemon's hang-up) holds it as a
 * client does. An OFD lock goes away only when
 * its description does, that is once the last descriptor and the last
 * mapping of it are gone, in every process (a dup, a fork, an fd passed on
 * with SCM_RIGHTS keep it): the kernel's own count of who still has the
 * pages. The daemon tests it with F_OFD_GETLK from its own descriptor, which
 * never locks. libloader unmaps and closes at ldr_detach, and a process that
 * exits loses them all, so the lock is gone exactly when the memory can be.
 *
 * A dropped pipeline whose slab still has a live hold keeps its bytes in
 * memory_used ("held after drop"): a descriptor of the file stays here (for
 * the test, and it keeps no page the clients do not), the rest is freed. The
 * holds are tested on a timer while any such slab is kept, and at once before
 * a create would be refused for memory and before an attach. The bytes count
 * against each uid that holds them: above max_held_after_drop that uid may not
 * attach until it lets go.
 *
 * The lock is the peer's own description, so the peer can lift it: a lock
 * gone while its process runs is checked in /proc/PID/maps and /proc/PID/fd,
 * and a process that still has the file keeps its hold, decided by /proc from
 * then on. So is a hold without a lock (Linux < 3.15, or the reopen failed);
 * where that /proc is not the daemon's to read, such a hold lasts while the
 * process exists.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "engine-private.h"

#define HOLD_LOCK_BASE (1ull << 62)  /* lock bytes: far past any slab's end */
#define HOLD_CHECK_MS 1000           /* how often kept slabs are tested */
#define HOLD_PIDS_SHOWN 4            /* pids named per uid in a message */

struct hold {
	struct hold *next;
	pid_t pid;
	uid_t uid;
	uint64_t lock_off;        /* 0: no lock, the pid's life decides */
};

struct held_slab {
	struct held_slab *next;
	int fd;                   /* the daemon's: tests the locks */
	uint64_t size;
	uint64_t dropped_ms;
	char name[LDR_NAME_MAX + 1];
	struct hold *holds;
};

/*
 * Whether @pid has a descriptor or a mapping of the file @st: 1 yes, 0 no (or
 * no such process), -1 cannot tell (its /proc is not ours to read).
 */
static int pid_has_file(pid_t pid, const struct stat *st)
{
	char path[64], line[512];
	bool found = false;
	DIR *dir;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	if (!(f = fopen(path, "re")))
		return errno == ENOENT ? 0 : -1;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned maj, min;
		unsigned long long ino;
		if (sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &min, &ino) == 3 &&
		    ino == (unsigned long long)st->st_ino && makedev(maj, min) == st->st_dev)
			found = true;
	}
	fclose(f);
	if (found)
		return 1;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(dir = opendir(path)))
		return errno == ENOENT ? 0 : -1;
	for (struct dirent *e; !found && (e = readdir(dir));) {
		struct stat fst;
		if (e->d_name[0] != '.' && fstatat(dirfd(dir), e->d_name, &fst, 0) == 0 &&
		    fst.st_ino == st->st_ino && fst.st_dev == st->st_dev)
			found = true;
	}
	closedir(dir);
	return found;
}

/*
 * Is @h live on the file @fd (@st)? Its lock says so; a lock gone while its
 * process still runs is checked in /proc: the lock is the peer's own
 * description, which it can unlock, so a peer that lifted it but still has
 * the file keeps its hold (from then on its pid's /proc decides).
 */
static bool hold_live(int fd, const struct stat *st, struct hold *h)
{
	int r;

	if (h->lock_off) {
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
			.l_start = (off_t)h->lock_off, .l_len = 1 };
		if (fcntl(fd, F_OFD_GETLK, &fl) < 0 || fl.l_type != F_UNLCK)
			return true; /* held, or cannot tell: keep it */
		if (pid_has_file(h->pid, st) != 1)
			return false;
		log_warn("pid %d (uid %u) lifted its hold's lock but still has the slab: it holds it "
		         "while it has it", (int)h->pid, (unsigned)h->uid);
		h->lock_off = 0;
		return true;
	}
	/* no lock: the process's files, or, where they are not ours to read, its life */
	r = pid_has_file(h->pid, st);
	if (r >= 0)
		return r == 1;
	char path[32];
	snprintf(path, sizeof(path), "/proc/%d", (int)h->pid);
	return access(path, F_OK) == 0;
}

/* Drop the holds on @fd that ended; return how many are left. */
static unsigned holds_prune(struct hold **list, int fd)
{
	struct stat st;
	unsigned n = 0;

	if (!*list)
		return 0;
	if (fstat(fd, &st) < 0)
		return 1; /* cannot tell: keep them */
	for (struct hold **pp = list; *pp;) {
		struct hold *h = *pp;
		if (hold_live(fd, &st, h)) {
			n++;
			pp = &h->next;
		} else {
			*pp = h->next;
			free(h);
		}
	}
	return n;
}

static void holds_free(struct hold *h)
{
	while (h) {
		struct hold *n = h->next;
		free(h);
		h = n;
	}
}

void holds_forget(struct pipeline *pl)
{
	holds_free(pl->holds);
	pl->holds = NULL;
}

/* A fresh description of @src (one of the slab's fds), opened @flags, with
 * the lock of the hold of (@pid, @uid). */
static int hand_out(struct pipeline *pl, pid_t pid, uid_t uid, int src, int flags, int *out)
{
	struct engine *eng = pl->eng;
	struct slab *slab = pl->slab;
	struct hold *h;
	char path[64];
	int fd;

	holds_prune(&pl->holds, slab->fd);
	for (h = pl->holds; h; h = h->next)
		if (h->pid == pid && h->uid == uid)
			break;
	if (!h) {
		if (!(h = calloc(1, sizeof(*h))))
			return -ENOMEM;
		h->pid = pid;
		h->uid = uid;
		h->lock_off = HOLD_LOCK_BASE + ++eng->hold_ctr;
		h->next = pl->holds;
		pl->holds = h;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", src);
	fd = open(path, flags | O_CLOEXEC);
	if (fd >= 0 && h->lock_off) {
		struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET,
			.l_start = (off_t)h->lock_off, .l_len = 1 };
		if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
			log_warn("slab of %s: no OFD lock (%s): pid %d holds it while it runs",
			         pl->spec->name, strerror(errno), (int)pid);
			h->lock_off = 0;
		}
	}
	if (fd < 0) {
		/* the same description as everyone's: only the pid can tell */
		h->lock_off = 0;
		fd = dup(src);
		if (fd < 0)
			return -errno;
	}
	*out = fd;
	return 0;
}

int holds_hand_out(struct pipeline *pl, pid_t pid, uid_t uid, int *out)
{
	return hand_out(pl, pid, uid, pl->slab->ro_fd, O_RDONLY, out);
}

int holds_hand_out_rw(struct pipeline *pl, pid_t pid, uid_t uid, int *out)
{
	return hand_out(pl, pid, uid, pl->slab->fd, O_RDWR, out);
}

static void on_hold_timer(uv_timer_t *t);

static void hold_timer_arm(struct engine *eng)
{
	if (!eng->held || eng->shutdown) {
		if (eng->hold_timer)
			uv_timer_stop(eng->hold_timer);
		return;
	}
	if (!eng->hold_timer) {
		uv_timer_t *t = calloc(1, sizeof(*t));
		if (!t || uv_timer_init(eng->loop, t) < 0) {
			free(t);
			log_err("no timer for slabs held after a drop: tested at creates and attaches only");
			return;
		}
		t->data = eng;
		eng->hold_timer = t;
	}
	if (!uv_is_active((uv_handle_t *)eng->hold_timer))
		uv_timer_start(eng->hold_timer, on_hold_timer, HOLD_CHECK_MS, HOLD_CHECK_MS);
}

void holds_check(struct engine *eng)
{
	for (struct held_slab **pp = &eng->held; *pp;) {
		struct held_slab *hs = *pp;
		if (holds_prune(&hs->holds, hs->fd)) {
			pp = &hs->next;
			continue;
		}
		*pp = hs->next;
		eng->memory_used -= hs->size;
		eng->memory_held -= hs->size;
		log_event(LOG_INFO, "slab.release", "pipeline=%s bytes=%" PRIu64
		          " why=\"the dropped pipeline's slab is no longer mapped\"", hs->name, hs->size);
		close(hs->fd);
		free(hs);
	}
	hold_timer_arm(eng);
}

static void on_hold_timer(uv_timer_t *t)
{
	holds_check(t->data);
}

bool holds_retain(struct pipeline *pl)
{
	struct engine *eng = pl->eng;
	struct held_slab *hs;
	unsigned n;

	if (!pl->slab)
		return false;
	n = holds_prune(&pl->holds, pl->slab->fd);
	if (!n || eng->shutdown || !(hs = calloc(1, sizeof(*hs))))
		goto release;
	hs->fd = fcntl(pl->slab->fd, F_DUPFD_CLOEXEC, 0);
	if (hs->fd < 0) {
		free(hs);
		goto release;
	}
	hs->size = pl->slab->size;
	hs->dropped_ms = uv_now(eng->loop);
	snprintf(hs->name, sizeof(hs->name), "%s", pl->spec->name);
	hs->holds = pl->holds;
	pl->holds = NULL;
	hs->next = eng->held;
	eng->held = hs;
	eng->memory_held += hs->size;
	log_event(LOG_INFO, "slab.held", "pipeline=%s bytes=%" PRIu64 " processes=%u why=\"dropped, "
	          "still mapped: it stays in the budget until they let it go\"", hs->name, hs->size, n);
	hold_timer_arm(eng);
	return true;

release:
	holds_free(pl->holds);
	pl->holds = NULL;
	return false;
}

static void on_hold_timer_closed(uv_handle_t *h)
{
	free(h);
}

void holds_close(struct engine *eng)
{
	while (eng->held) {
		struct held_slab *hs = eng->held;
		eng->held = hs->next;
		holds_free(hs->holds);
		close(hs->fd);
		free(hs);
	}
	if (eng->hold_timer) {
		uv_close((uv_handle_t *)eng->hold_timer, on_hold_timer_closed);
		eng->hold_timer = NULL;
	}
}

/* --- per uid -------------------------------------------------------------- */

struct uid_held {
	uid_t uid;
	uint64_t bytes;
	unsigned npids;
	pid_t pids[HOLD_PIDS_SHOWN];
	json_t *pipelines;        /* status only */
};

/* Per uid: the bytes of every kept slab it holds (each in full: it alone
 * keeps it) and its first pids. Returns the count, at most @cap. */
static size_t held_by_uid(struct engine *eng, struct uid_held *u, size_t cap, bool with_names)
{
	size_t n = 0;

	for (struct held_slab *hs = eng->held; hs; hs = hs->next) {
		for (struct hold *h = hs->holds; h; h = h->next) {
			size_t i;
			bool seen = false;
			for (i = 0; i < n && u[i].uid != h->uid; i++)
				;
			if (i == n) {
				if (n == cap)
					continue;
				u[n++] = (struct uid_held){ .uid = h->uid,
					.pipelines = with_names ? json_array() : NULL };
			}
			for (struct hold *o = hs->holds; o != h; o = o->next)
				if (o->uid == h->uid)
					seen = true;
			if (!seen) {
				u[i].bytes += hs->size;
				if (u[i].pipelines)
					json_array_append_new(u[i].pipelines, json_string(hs->name));
			}
			bool pid_seen = false;
			for (unsigned k = 0; k < u[i].npids; k++)
				if (u[i].pids[k] == h->pid)
					pid_seen = true;
			if (!pid_seen && u[i].npids < HOLD_PIDS_SHOWN)
				u[i].pids[u[i].npids++] = h->pid;
		}
	}
	return n;
}

/* "uid 1001 (pid 4242)", "uid 1001 (pids 4242, 4243, ...)" */
static void fmt_uid_pids(char *buf, size_t len, const struct uid_held *u, bool more)
{
	size_t off = (size_t)snprintf(buf, len, "uid %u (pid%s", (unsigned)u->uid,
	                              u->npids > 1 ? "s" : "");
	for (unsigned k = 0; k < u->npids && off < len; k++)
		off += (size_t)snprintf(buf + off, len - off, "%s %d", k ? "," : "", (int)u->pids[k]);
	if (off < len)
		snprintf(buf + off, len - off, "%s)", more ? ", ..." : "");
}

void holds_explain(struct engine *eng, char *buf, size_t len)
{
	struct uid_held u[8];
	size_t n, off;

	buf[0] = '\0';
	if (!eng->memory_held)
		return;
	n = held_by_uid(eng, u, 8, false);
	off = (size_t)snprintf(buf, len, "; %" PRIu64 " bytes are held by slabs of dropped pipelines "
	                       "still mapped by ", eng->memory_held);
	for (size_t i = 0; i < n && off < len; i++) {
		char one[128];
		fmt_uid_pids(one, sizeof(one), &u[i], false);
		off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", one);
	}
}

uint64_t holds_bytes_of(struct engine *eng, uid_t uid)
{
	struct uid_held u[64];
	size_t n = held_by_uid(eng, u, 64, false);

	for (size_t i = 0; i < n; i++)
		if (u[i].uid == uid)
			return u[i].bytes;
	return 0;
}

size_t holds_uids(struct engine *eng, uid_t *out, size_t cap)
{
	struct uid_held u[64];
	size_t n = held_by_uid(eng, u, 64, false);

	for (size_t i = 0; i < n && i < cap; i++)
		out[i] = u[i].uid;
	return n < cap ? n : cap;
}

uint64_t holds_max_held(const struct engine *eng)
{
	return eng->max_held ? eng->max_held : eng->memory_limit / 4;
}

int holds_may_attach(struct engine *eng, uid_t uid, char *err, size_t errlen)
{
	struct uid_held u[64];
	size_t n;

	if (!eng->held)
		return 0;
	holds_check(eng);
	n = held_by_uid(eng, u, 64, false);
	for (size_t i = 0; i < n; i++) {
		char who[128];
		if (u[i].uid != uid || u[i].bytes <= holds_max_held(eng))
			continue;
		fmt_uid_pids(who, sizeof(who), &u[i], false);
		return errfmt(-ENOSPC, err, errlen,
		              "attach: %s holds %" PRIu64 " bytes of slabs of dropped pipelines still "
		              "mapped, above max_held_after_drop of %" PRIu64 " bytes: detach from them "
		              "(ldr_detach) or end those processes first", who, u[i].bytes,
		              holds_max_held(eng));
	}
	return 0;
}

void engine_set_max_held(struct engine *eng, uint64_t bytes)
{
	eng->max_held = bytes;
}

json_t *engine_holds_json(struct engine *eng)
{
	struct uid_held u[64];
	json_t *arr = json_array();
	size_t n;

	holds_check(eng);
	n = held_by_uid(eng, u, 64, true);
	for (size_t i = 0; i < n; i++) {
		json_t *pids = json_array();
		for (unsigned k = 0; k < u[i].npids; k++)
			json_array_append_new(pids, json_integer(u[i].pids[k]));
		json_array_append_new(arr, json_pack("{s:I, s:I, s:o, s:o}",
			"uid", (json_int_t)u[i].uid, "bytes", (json_int_t)u[i].bytes,
			"pids", pids, "pipelines", u[i].pipelines));
	}
	return arr;
}

uint64_t engine_memory_held(const struct engine *eng)
{
	return eng->memory_held;
}
