/* SPDX-License-Identifier: MIT */
/* inspect - `loaderctl inspect PREFIX|FILE`: a Megatron .bin/.idx pair, read and checked here
 *
 * No daemon: the files are read with this process's permissions and
 * checked by the parser the daemon's megatron source uses (common/mmidx.h),
 * so what it reports wrong is what a create would.
 */
#include "loaderctl.h"
#include "mmidx.h"

struct fd_ctx {
	int fd;
	const char *path;
};

static int fd_read(void *ctx, void *buf, size_t len, uint64_t off, char *err, size_t errlen)
{
	struct fd_ctx *f = ctx;
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(f->fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(err, errlen, "%s: %s at offset %llu", f->path,
				 n < 0 ? strerror(errno) : "truncated",
				 (unsigned long long)(off + got));
			return n < 0 ? -errno : -EIO;
		}
		got += (size_t)n;
	}
	return 0;
}

static int open_size(const char *path, int *fd, uint64_t *size, char *err, size_t errlen)
{
	off_t end;

	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	end = lseek(*fd, 0, SEEK_END);
	if (end < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	*size = (uint64_t)end;
	return 0;
}

static void print_text(const char *prefix, const struct mmidx *m, uint64_t seq_len,
		       uint64_t samples)
{
	printf("%s: a valid Megatron indexed dataset\n", prefix);
	printf("  dtype       %s (code %d)\n", mmidx_code_name(m->code), m->code);
	printf("  documents   %" PRIu64 "\n", m->ndocidx - 1);
	printf("  sequences   %" PRIu64 "\n", m->nseq);
	printf("  tokens      %" PRIu64 "\n", m->ntokens);
	printf("  bin bytes   %" PRIu64 "\n", m->bin_size);
	printf("  multimodal  %s\n", m->multimodal ? "yes (sequence modes)" : "no");
	if (seq_len)
		printf("  samples     %" PRIu64 " of seq_len %" PRIu64 " (one epoch of all "
		       "documents)\n", samples, seq_len);
}

int cmd_inspect(struct ctl *ctl, int argc, char **argv)
{
	char prefix[4096], idx_path[4200], bin_path[4200], err[1024] = "";
	size_t n = strlen(argv[0]);
	struct fd_ctx f = { -1, idx_path };
	uint64_t idx_size = 0, bin_size = 0, samples = 0;
	struct mmidx m;
	int bin_fd = -1, r;

	(void)argc;
	if (n >= sizeof(prefix))
		usage_error("inspect: path too long");
	memcpy(prefix, argv[0], n + 1);
	if (n > 4 && (!strcmp(prefix + n - 4, ".idx") || !strcmp(prefix + n - 4, ".bin")))
		prefix[n - 4] = '\0';
	snprintf(idx_path, sizeof(idx_path), "%s.idx", prefix);
	snprintf(bin_path, sizeof(bin_path), "%s.bin", prefix);
	r = open_size(idx_path, &f.fd, &idx_size, err, sizeof(err));
	if (r >= 0)
		r = open_size(bin_path, &bin_fd, &bin_size, err, sizeof(err));
	if (r >= 0)
		r = mmidx_parse(&m, fd_read, &f, idx_path, idx_size, bin_path, bin_size, err,
				sizeof(err));
	if (f.fd >= 0)
		close(f.fd);
	if (bin_fd >= 0)
		close(bin_fd);
	if (r < 0) {
		if (ctl->json)
			print_json(json_pack("{s:s, s:b, s:s}", "prefix", prefix, "valid", 0,
					     "error", err));
		else
			fprintf(stderr, PROG ": inspect: %s\n", err);
		return EXIT_FAILURE;
	}
	if (ctl->seq_len && m.ntokens > 1)
		samples = (m.ntokens - 1) / ctl->seq_len;
	if (ctl->json) {
		json_t *o = json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:b}", "prefix", prefix,
				      "valid", 1, "dtype", mmidx_code_name(m.code),
				      "documents", (json_int_t)(m.ndocidx - 1),
				      "sequences", (json_int_t)m.nseq,
				      "tokens", (json_int_t)m.ntokens,
				      "bin_bytes", (json_int_t)m.bin_size,
				      "multimodal", m.multimodal);

		if (o && ctl->seq_len) {
			json_object_set_new(o, "seq_len", json_integer((json_int_t)ctl->seq_len));
			json_object_set_new(o, "samples", json_integer((json_int_t)samples));
		}
		print_json(o);
	} else {
		print_text(prefix, &m, ctl->seq_len, samples);
	}
	mmidx_free(&m);
	return EXIT_SUCCESS;
}
