/* SPDX-License-Identifier: MIT */
/* test-daemon - start and stop the real loaderd for a C integration test */
#pragma once

#include <assert.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* One daemon per test process, on a private socket under /tmp. */
static char dir[64], sock_path[128], fd_path[140];
static pid_t daemon_pid;

static void start_daemon(const char *exe, const char *tag)
{
	snprintf(dir, sizeof(dir), "/tmp/ldr-%s-XXXXXX", tag);
	assert(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/loaderd.sock", dir);
	snprintf(fd_path, sizeof(fd_path), "%s.fds", sock_path);
	daemon_pid = fork();
	assert(daemon_pid >= 0);
	if (daemon_pid == 0) {
		execl(exe, exe, "--socket", sock_path, "--workers", "2", "--log-level", "warning", (char *)NULL);
		_exit(127);
	}
	/* 30 s in time, not in turns: a sanitizer build on a loaded machine
	 * may take seconds to start */
	struct timespec now, end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += 30;
	do {
		if (access(fd_path, F_OK) == 0 && access(sock_path, F_OK) == 0)
			return;
		usleep(20000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec < end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec < end.tv_nsec));
	assert(!"daemon did not start within 30 s");
}

static __attribute__((unused)) void stop_daemon(void)
{
	int status;

	kill(daemon_pid, SIGTERM);
	assert(waitpid(daemon_pid, &status, 0) == daemon_pid);
	assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert(access(sock_path, F_OK) != 0);
	rmdir(dir);
}

/* The tokens 0, 1, 2 ... (uint16) in @dir/t.bin, so a batch names its place. */
static char token_file[128];

static __attribute__((unused)) void write_tokens_n(int ntok)
{
	FILE *f;
	uint16_t t;

	snprintf(token_file, sizeof(token_file), "%s/t.bin", dir);
	f = fopen(token_file, "wb");
	assert(f);
	for (int i = 0; i < ntok; i++) {
		t = (uint16_t)i;
		assert(fwrite(&t, sizeof(t), 1, f) == 1);
	}
	fclose(f);
}
