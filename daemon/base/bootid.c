/* SPDX-License-Identifier: MIT */
/* bootid - the running kernel's boot id (bootid.h) */
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "bootid.h"

static char id[BOOT_ID_BYTES];          /* "" when unknown */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void read_id(void)
{
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	char b[BOOT_ID_BYTES] = { 0 };

	if (fd < 0)
		return;
	if (read(fd, b, 36) == 36 && b[0] != 0)
		memcpy(id, b, sizeof(b));
	close(fd);
}

const char *boot_id(void)
{
	pthread_once(&once, read_id);
	return id[0] ? id : NULL;
}
