/* SPDX-License-Identifier: MIT */
/* sockpath - claim a socket path: replace a stale socket, refuse another user's
 *
 * The daemon listens on three sockets: the nng endpoint (server/endpoint.c),
 * the fd channel (server/fdchan.c), the Python workers' (engine/pyworkers.c),
 * and maybe /metrics on a unix socket (server/metrics.c). Each claims its path
 * the same way, so the claim lives below all of them.
 */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "log.h"
#include "sockpath.h"

/* "ldr-bob (uid 1002)", or "uid 1002" without a name. */
static void fmt_user(char *buf, size_t len, uid_t uid)
{
	struct passwd pw, *res = NULL;
	char pwbuf[1024];

	if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &res) == 0 && res)
		snprintf(buf, len, "%s (uid %u)", res->pw_name, (unsigned)uid);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
}

/* Why users other than this process's may write the directory of @path:
 * "" when none may. */
static void dir_writers(char *buf, size_t len, const char *path)
{
	char dir[108];
	const char *slash = strrchr(path, '/');
	struct stat st;

	buf[0] = '\0';
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	if (stat(dir, &st) < 0)
		return;
	if (st.st_mode & S_IWOTH)
		snprintf(buf, len, "the socket directory %s is writable by others (mode %04o)", dir,
		         (unsigned)(st.st_mode & 07777));
	else if ((st.st_mode & S_IWGRP) && st.st_gid != getegid())
		snprintf(buf, len, "the socket directory %s is writable by its group, gid %u "
		         "(mode %04o)", dir, (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777));
	else if (st.st_uid != geteuid() && st.st_uid != 0) {
		char who[96];
		fmt_user(who, sizeof(who), st.st_uid);
		snprintf(buf, len, "the socket directory %s belongs to %s", dir, who);
	}
}

int sock_dir_check(const char *path, char *why, size_t len)
{
	dir_writers(why, len, path);
	return why[0] ? -EPERM : 0;
}

/*
 * A path owned by another user is never ours to replace or to take for a
 * daemon of ours: another user made it, which they could only do in a
 * directory they may write (a sticky /tmp-like one), and it would hand them
 * our clients (their credentials, their fds).
 */
static int foreign_owner(const char *path, const struct stat *st, char *err, size_t errlen)
{
	char who[96], me[96], why[256];

	if (st->st_uid == geteuid())
		return 0;
	fmt_user(who, sizeof(who), st->st_uid);
	fmt_user(me, sizeof(me), geteuid());
	dir_writers(why, sizeof(why), path);
	if (why[0])
		return errfmt(-EPERM, err, errlen, "%s is owned by %s, not by loaderd's user %s: %s; "
		              "use a directory only loaderd's user can write, e.g. /run/loaderd",
		              path, who, me, why);
	return errfmt(-EPERM, err, errlen, "%s is owned by %s, not by loaderd's user %s: "
	              "remove it, or use another socket path", path, who, me);
}

/* Every socket's stale-path claim; why here and not in nngfix.c: sockpath.h. */
int sock_claim_path(const char *path, int (*probe)(const char *path), char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return errfmt(-ENAMETOOLONG, err, errlen,
		              "socket path too long (most %zu bytes): %s", sizeof(sa.sun_path) - 1, path);
	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		return errfmt(r, err, errlen, "cannot use socket path %s: %s", path, strerror(-r));
	}
	if ((r = foreign_owner(path, &st, err, errlen)) < 0)
		return r;
	if (!S_ISSOCK(st.st_mode))
		return errfmt(-EEXIST, err, errlen, "%s exists and is not a socket", path);
	if (probe) {
		r = probe(path);
	} else {
		strcpy(sa.sun_path, path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			r = -errno;
			return errfmt(r, err, errlen, "cannot check %s: socket: %s", path, strerror(-r));
		}
		r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : -errno;
		close(fd);
	}
	if (r == 0)
		return errfmt(-EADDRINUSE, err, errlen,
		              "another loaderd is already listening on %s", path);
	if (r != -ECONNREFUSED)
		return errfmt(r, err, errlen, "cannot check %s: %s", path, strerror(-r));
	if (unlink(path) < 0 && errno != ENOENT) {
		r = -errno; /* read before errfmt(), which may set errno */
		return errfmt(r, err, errlen, "cannot remove stale socket %s: %s", path, strerror(-r));
	}
	log_notice("replaced stale socket %s", path);
	return 0;
}
