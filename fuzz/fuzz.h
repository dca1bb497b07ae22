/* SPDX-License-Identifier: MIT */
/* fuzz - what the libFuzzer targets share: input as a C string or a file */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Every target is a plain libFuzzer entry point; -Wmissing-prototypes wants these. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The input as a NUL-terminated string (a parser of text sees no length),
 * or NULL when out of memory. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (s) {
		memcpy(s, data, size);
		s[size] = '\0';
	}
	return s;
}

/* A memfd holding the input, or -1. */
static inline int fuzz_memfd(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
	size_t done = 0;

	if (fd < 0)
		return -1;
	while (done < size) {
		ssize_t n = write(fd, data + done, size - done);
		if (n <= 0) {
			close(fd);
			return -1;
		}
		done += (size_t)n;
	}
	return fd;
}

static char fuzz_dir_path[64], fuzz_file_path[128];

/* At exit: the one file a target writes, and its directory. */
static inline void fuzz_dir_remove(void)
{
	if (fuzz_file_path[0])
		unlink(fuzz_file_path);
	rmdir(fuzz_dir_path);
}

/*
 * A private directory for the process (under /dev/shm when there is one, so
 * rewriting a file per input costs no disk), made once and removed at exit
 * with the one file a target writes there (not after a crash: the file is
 * then the input, also in the crash artifact).
 */
static inline const char *fuzz_dir(void)
{
	char *dir = fuzz_dir_path;

	if (!dir[0]) {
		snprintf(dir, sizeof(fuzz_dir_path), "%s/loaderd-fuzz-XXXXXX",
			 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
		if (!mkdtemp(dir)) {
			perror("fuzz: mkdtemp");
			abort();
		}
		atexit(fuzz_dir_remove);
	}
	return dir;
}

/* Replace the file @name of fuzz_dir() by the input; its path in @path. */
static inline void fuzz_file(const char *name, const uint8_t *data, size_t size, char *path,
			     size_t pathlen)
{
	FILE *f;

	snprintf(path, pathlen, "%s/%s", fuzz_dir(), name);
	snprintf(fuzz_file_path, sizeof(fuzz_file_path), "%s", path);
	f = fopen(path, "wb");
	if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
		perror(path);
		abort();
	}
}
