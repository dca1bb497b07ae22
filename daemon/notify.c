/* SPDX-License-Identifier: MIT */
/* notify - the systemd notification protocol (sd_notify), without libsystemd
 *
 * The protocol is one datagram per message to the AF_UNIX socket named by
 * $NOTIFY_SOCKET (a path, or an abstract name when it starts with '@'). Writing
 * it ourselves keeps libsystemd out of the daemon and out of its containers.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "notify.h"

static struct sockaddr_un addr;
static socklen_t addr_len;
static int fd = -1;
static uint64_t watchdog_usec;

int notify_init(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	const char *wd = getenv("WATCHDOG_USEC"), *wd_pid = getenv("WATCHDOG_PID");
	size_t len;

	if (wd && (!wd_pid || atol(wd_pid) == (long)getpid()))
		watchdog_usec = strtoull(wd, NULL, 10);
	if (!path || !*path)
		return 0;
	len = strlen(path);
	if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
		log_warn("NOTIFY_SOCKET is not a usable address: %s", path);
		return 0;
	}
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	memcpy(addr.sun_path, path, len);
	if (path[0] == '@')
		addr.sun_path[0] = '\0';
	addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		log_warn("cannot open a socket for systemd notifications: %s", strerror(errno));
		return 0;
	}
	return 1;
}

void notify_send(const char *state)
{
	if (fd < 0)
		return;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr, addr_len) < 0)
		log_debug("systemd notification failed: %s", strerror(errno));
}

void notify_reloading(void)
{
	struct timespec ts;
	char msg[64];

	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
	         (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
	notify_send(msg);
}

uint64_t notify_watchdog_usec(void)
{
	return watchdog_usec;
}
