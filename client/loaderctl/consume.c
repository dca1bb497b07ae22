/* SPDX-License-Identifier: MIT */
/* consume - `loaderctl consume`: read batches, report throughput and a CRC-32 */

#include <zlib.h>

#include "loaderctl.h"

struct consume_result {
	uint64_t batches, samples, bytes;
	uint64_t first_epoch, first_batch;
	uLong crc;
	double seconds;
	bool eof;
};

static int consume_loop(struct ctl *ctl, struct ldr_client *client, struct ldr_attachment *att,
                        FILE *dump, FILE *vout, uint64_t limit, struct consume_result *res)
{
	double t0 = now_s();
	int r = 0;

	res->crc = crc32(0L, Z_NULL, 0);
	while (limit == 0 || res->batches < limit) {
		struct ldr_batch *b = NULL;
		uint64_t nbytes = 0;
		int nf;

		r = ldr_next(att, ctl->timeout_ms, &b);
		if (r == LDR_EOF) {
			res->eof = true;
			r = 0;
			break;
		}
		if (r == -ETIMEDOUT) {
			/* --timeout ran out, or the daemon detached a stopped client:
			 * the library's message says which */
			const char *msg = ldr_client_error(client);
			warnx("consume: %s (after %" PRIu64 " batches)",
			      msg && *msg ? msg : ldr_strerror(r), res->batches);
			goto out;
		}
		if (r < 0) {
			fail(client, "consume", r);
			goto out;
		}

		nf = ldr_batch_nfields(b);
		for (int i = 0; i < nf; i++) {
			struct ldr_field f;

			/* a CUDA batch's fields are device pointers: read the host copy */
			r = ldr_batch_field_host(b, i, &f);
			if (r < 0) {
				warnx("consume: field %d of batch %" PRIu64 ": %s", i,
				      ldr_batch_index(b), ldr_strerror(r));
				ldr_release(b);
				goto out;
			}
			if (f.nbytes && !f.data) {
				warnx("consume: field %s has no data", f.name ? f.name : "?");
				ldr_release(b);
				r = -EPROTO;
				goto out;
			}
			res->crc = crc32_z(res->crc, f.data, f.nbytes);
			if (dump && f.nbytes && fwrite(f.data, 1, f.nbytes, dump) != f.nbytes) {
				warnx("consume: writing %s: %s", ctl->dump, strerror(errno));
				ldr_release(b);
				r = -EIO;
				goto out;
			}
			nbytes += f.nbytes;
		}
		if (res->batches == 0) {
			res->first_epoch = ldr_batch_epoch(b);
			res->first_batch = ldr_batch_index(b);
		}
		if (vout)
			fprintf(vout, "epoch %" PRIu64 " batch %" PRIu64 " rows %" PRIu32
			              " bytes %" PRIu64 "\n",
			        ldr_batch_epoch(b), ldr_batch_index(b), ldr_batch_rows(b), nbytes);
		res->batches++;
		res->samples += ldr_batch_rows(b);
		res->bytes += nbytes;
		if (ctl->delay_ms) {
			/* a trainer's step: the batch is held meanwhile */
			struct timespec ts = { .tv_sec = ctl->delay_ms / 1000,
			                       .tv_nsec = (long)(ctl->delay_ms % 1000) * 1000000L };
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		}
		ldr_release(b);
	}
out:
	res->seconds = now_s() - t0;
	return r;
}

int cmd_consume(struct ctl *ctl, int argc, char **argv)
{
	const char *pipeline = argv[0];
	struct ldr_attach_opts opts = LDR_ATTACH_OPTS_INIT;
	struct consume_result res = { 0 };
	struct ldr_client *client = NULL;
	struct ldr_attachment *att = NULL;
	FILE *dump = NULL, *out = stdout, *vout = NULL;
	uint64_t limit = 0;
	int r, ret = EXIT_FAILURE;

	/* Options that do not apply are usage errors, not silently ignored. */
	if (ctl->has_batches && ctl->has_epochs)
		usage_error("consume: --batches and --epochs exclude each other");
	if ((ctl->has_rank || ctl->has_world) && ctl->mode != LDR_MODE_PARTITION)
		usage_error("consume: --rank and --world-size need --mode partition");
	if ((ctl->has_start_epoch || ctl->has_start_batch || ctl->has_start_position) &&
	    ctl->mode != LDR_MODE_PARTITION)
		usage_error("consume: --start-epoch, --start-batch and --start-position need --mode "
		            "partition");
	if (ctl->has_rank != ctl->has_world)
		usage_error("consume: --rank and --world-size go together");
	if (ctl->has_augment_seed && ctl->mode == LDR_MODE_DYNAMIC)
		usage_error("consume: --augment-seed applies to broadcast and partition clients");
	if (ctl->has_rank && ctl->rank >= ctl->world_size)
		usage_error("consume: rank %" PRIu32 " is not below world size %" PRIu32,
		            ctl->rank, ctl->world_size);

	opts.mode = ctl->mode;
	opts.rank = ctl->has_rank ? ctl->rank : 0;
	opts.world_size = ctl->has_world ? ctl->world_size : 1;
	opts.has_start = ctl->has_start_epoch || ctl->has_start_batch || ctl->has_start_position;
	opts.has_start_position = ctl->has_start_position;
	opts.start_position = ctl->start_position;
	opts.start_epoch = ctl->start_epoch;
	opts.start_batch = ctl->start_batch;
	opts.inflight = ctl->inflight;
	opts.device_kind = ctl->device_kind;
	opts.device_index = ctl->device_index;
	opts.has_augment_seed = ctl->has_augment_seed;
	opts.augment_seed = ctl->augment_seed;
	opts.job = ctl->job;

	if (ctl->dump) {
		if (!strcmp(ctl->dump, "-")) {
			dump = stdout;
			out = stderr; /* the report must not mix with the bytes */
		} else {
			dump = fopen(ctl->dump, "wb");
			if (!dump) {
				warnx("consume: cannot open %s: %s", ctl->dump, strerror(errno));
				return EXIT_FAILURE;
			}
		}
		setvbuf(dump, NULL, _IOFBF, 1 << 20);
	}
	if (ctl->verbose)
		vout = (ctl->json || dump == stdout) ? stderr : stdout;

	r = connect_daemon(ctl, "consume", &client);
	if (r)
		goto out;
	r = ldr_attach(client, pipeline, &opts, &att);
	if (r < 0) {
		fail(client, "consume", r);
		goto out;
	}

	if (ctl->has_batches) {
		limit = ctl->batches;
	} else if (ctl->has_epochs) {
		uint64_t bpe = ldr_attachment_batches_per_epoch(att);

		if (bpe == 0) {
			warnx("consume: pipeline %s has no batches per epoch", pipeline);
			goto out;
		}
		if (ctl->epochs > UINT64_MAX / bpe) {
			warnx("consume: --epochs %" PRIu64 " is too many", ctl->epochs);
			goto out;
		}
		limit = ctl->epochs * bpe;
	}

	r = consume_loop(ctl, client, att, dump, vout, limit, &res);
	if (r < 0)
		goto out; /* already reported */
	if (dump && dump != stdout) {
		r = fclose(dump);
		dump = NULL;
		if (r == EOF) {
			warnx("consume: writing %s: %s", ctl->dump, strerror(errno));
			goto out;
		}
	} else if (dump && fflush(dump) == EOF) {
		warnx("consume: writing to stdout: %s", strerror(errno));
		goto out;
	}

	{
		double secs = res.seconds > 0 ? res.seconds : 1e-9;
		double sps = (double)res.samples / secs;
		double gbps = (double)res.bytes / secs / 1e9;
		char crc[9];

		snprintf(crc, sizeof(crc), "%08lx", (unsigned long)(res.crc & 0xffffffffUL));
		if (ctl->json) {
			json_t *o = json_pack("{ss ss sI sI sI sf ss sf sf so so sb}",
			                      "pipeline", pipeline,
			                      "mode", ldr_mode_name(ctl->mode),
			                      "batches", (json_int_t)res.batches,
			                      "samples", (json_int_t)res.samples,
			                      "bytes", (json_int_t)res.bytes,
			                      "seconds", round_to(res.seconds, 1e6),
			                      "checksum", crc,
			                      "samples_per_s", round_to(sps, 10),
			                      "gb_per_s", round_to(gbps, 1e6),
			                      "first_epoch", res.batches ? json_integer((json_int_t)res.first_epoch) : json_null(),
			                      "first_batch", res.batches ? json_integer((json_int_t)res.first_batch) : json_null(),
			                      "eof", res.eof);
			char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER |
			                                    JSON_REAL_PRECISION(15))
			            : NULL;

			json_decref(o);
			if (!s) {
				warnx("out of memory");
				goto out;
			}
			fprintf(out, "%s\n", s);
			free(s);
		} else {
			fprintf(out,
			        "batches %" PRIu64 "  samples %" PRIu64 "  bytes %" PRIu64
			        "  seconds %.3f  checksum %s  (%.0f samples/s, %.2f GB/s)\n",
			        res.batches, res.samples, res.bytes, res.seconds, crc, sps, gbps);
		}
		if (fflush(out) == EOF)
			goto out;
	}
	ret = EXIT_SUCCESS;
out:
	if (att) {
		r = ldr_detach(att);
		if (r < 0 && ret == EXIT_SUCCESS)
			ret = fail(client, "consume", r);
	}
	ldr_close(client);
	if (dump && dump != stdout)
		fclose(dump);
	return ret;
}
