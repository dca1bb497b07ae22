/* SPDX-License-Identifier: MIT */
/* loaderctl - the admin and test command of loaderd */

/*
 * loaderctl is a plain client of the daemon: it links only the public
 * libloader API (plus jansson to format the JSON the daemon answers with, and
 * zlib for the CRC-32 of `consume`). Anything it can do, a trainer can do with
 * the same API; that is the point.
 *
 * Exit status: 0 success, 1 the daemon refused or an I/O error happened,
 * 2 a usage error. `--json` makes every command print exactly one JSON object
 * on stdout.
 *
 * `consume` computes one CRC-32 chained over the bytes of every field of every
 * batch, in order: exactly the bytes `--dump` writes, so
 * zlib.crc32(open(dump, "rb").read()) equals the printed checksum.
 */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "config.h"
#include "loaderctl.h"

enum opt_id {
	OPT_SOCKET = 's',
	OPT_JSON = 'j',
	OPT_HELP = 'h',
	OPT_VERSION = 'V',
	OPT_VERBOSE = 'v',
	OPT_SPEC = 256,
	OPT_EXIST_OK,
	OPT_SCOPED,
	OPT_FORCE,
	OPT_MODE,
	OPT_RANK,
	OPT_WORLD_SIZE,
	OPT_START_EPOCH,
	OPT_START_BATCH,
	OPT_START_POSITION,
	OPT_BATCHES,
	OPT_EPOCHS,
	OPT_DUMP,
	OPT_INFLIGHT,
	OPT_TIMEOUT,
	OPT_DELAY,
	OPT_DEVICE,
	OPT_AUGMENT_SEED,
	OPT_OWNER,
	OPT_JOB,
	OPT_INTERVAL = 'd',
	OPT_ITERATIONS = 'n',
	OPT_SORT = 257 + 64,
	OPT_SEQ_LEN,
};

struct verb {
	const char *name;
	int min_args;
	int max_args;
	int (*fn)(struct ctl *ctl, int argc, char **argv);
	const char *help;
	const char *synopsis;          /* arguments and options, for --help */
	const struct option *options;  /* command options, beside the common ones */
};



static int cmd_help(struct ctl *ctl, int argc, char **argv);

/* ------------------------------------------------------------- the table */

#define COMMON_OPTIONS                                              \
	{ "socket", required_argument, NULL, OPT_SOCKET },          \
	{ "json", no_argument, NULL, OPT_JSON },                    \
	{ "help", no_argument, NULL, OPT_HELP }

static const struct option no_options[] = {
	COMMON_OPTIONS,
	{ NULL, 0, NULL, 0 },
};

static const struct option create_options[] = {
	COMMON_OPTIONS,
	{ "spec", required_argument, NULL, OPT_SPEC },
	{ "exist-ok", no_argument, NULL, OPT_EXIST_OK },
	{ "owner", required_argument, NULL, OPT_OWNER },
	{ "scoped", no_argument, NULL, OPT_SCOPED },
	{ NULL, 0, NULL, 0 },
};

static const struct option drop_options[] = {
	COMMON_OPTIONS,
	{ "force", no_argument, NULL, OPT_FORCE },
	{ NULL, 0, NULL, 0 },
};

static const struct option consume_options[] = {
	COMMON_OPTIONS,
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "world-size", required_argument, NULL, OPT_WORLD_SIZE },
	{ "start-epoch", required_argument, NULL, OPT_START_EPOCH },
	{ "start-batch", required_argument, NULL, OPT_START_BATCH },
	{ "start-position", required_argument, NULL, OPT_START_POSITION },
	{ "batches", required_argument, NULL, OPT_BATCHES },
	{ "epochs", required_argument, NULL, OPT_EPOCHS },
	{ "dump", required_argument, NULL, OPT_DUMP },
	{ "inflight", required_argument, NULL, OPT_INFLIGHT },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "delay", required_argument, NULL, OPT_DELAY },
	{ "verbose", no_argument, NULL, OPT_VERBOSE },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "augment-seed", required_argument, NULL, OPT_AUGMENT_SEED },
	{ "job", required_argument, NULL, OPT_JOB },
	{ NULL, 0, NULL, 0 },
};

static const struct option top_options[] = {
	COMMON_OPTIONS,
	{ "interval", required_argument, NULL, OPT_INTERVAL },
	{ "iterations", required_argument, NULL, OPT_ITERATIONS },
	{ "sort", required_argument, NULL, OPT_SORT },
	{ NULL, 0, NULL, 0 },
};

static const struct option inspect_options[] = {
	COMMON_OPTIONS,
	{ "seq-len", required_argument, NULL, OPT_SEQ_LEN },
	{ NULL, 0, NULL, 0 },
};

static const struct verb verbs[] = {
	{ "status", 0, 0, cmd_status, "daemon, pipelines and clients", "", no_options },
	{ "pipelines", 0, 0, cmd_pipelines, "list the pipelines", "", no_options },
	{ "clients", 0, 0, cmd_clients, "list the connected clients", "", no_options },
	{ "create", 0, 0, cmd_create, "create a pipeline from a JSON spec (docs/spec.md)",
	  "--spec FILE [--exist-ok] [--owner USER] [--scoped]", create_options },
	{ "drop", 1, 1, cmd_drop, "drop a pipeline", "NAME [--force]", drop_options },
	{ "credentials", 1, 1, cmd_credentials,
	  "hand a running pipeline fresh object-store credentials, read as a create reads them "
	  "(AWS_* environment, ~/.aws files; docs/storage.md)", "NAME", no_options },
	{ "consume", 1, 1, cmd_consume,
	  "read batches, report throughput and a CRC-32 of their bytes",
	  "NAME [--mode M] [--rank R --world-size W] [--start-epoch E --start-batch B]\n"
	  "          [--start-position P]\n"
	  "          [--batches N | --epochs E] [--dump FILE] [--inflight K] [--timeout MS]\n"
	  "          [--delay MS] [--device cpu|cuda:N] [--augment-seed S] [--job NAME]\n"
	  "          [--verbose]",
	  consume_options },
	{ "set", 2, 3, cmd_set, "change a setting of the running daemon now (admins only)",
	  "workers N | prefetch PIPELINE N | log-level LEVEL | memory-limit SIZE", no_options },
	{ "reload", 0, 0, cmd_reload,
	  "re-read the daemon's config file and apply it, as SIGHUP does (admins only)", "",
	  no_options },
	{ "top", 0, 0, cmd_top, "the figures of status, refreshed live; q quits",
	  "[-d SECS] [-n ITER] [--sort wait|rate|name|id]", top_options },
	{ "inspect", 1, 1, cmd_inspect,
	  "check a Megatron .bin/.idx pair here, without the daemon: its documents,\n"
	  "      tokens, dtype and samples",
	  "PREFIX|FILE [--seq-len N]", inspect_options },
	{ "help", 0, 0, cmd_help, "show this help", "", no_options },
};

/* getopt's short options of a command: the common -s, -j, -h and its own. */
static const char *short_options(const struct verb *verb)
{
	if (verb->options == consume_options)
		return "s:jhv";
	if (verb->options == top_options)
		return "s:jhd:n:";
	return "s:jh";
}

static void print_help(FILE *f)
{
	fprintf(f,
	        "Usage: " PROG " [OPTIONS] COMMAND [ARGS...]\n"
	        "\n"
	        "Administer and test a running loaderd.\n"
	        "\n"
	        "Options (also accepted after the command):\n"
	        "  -s, --socket PATH   daemon socket; default $LOADERD_SOCKET, else\n"
	        "                      $RUNTIME_DIRECTORY/loaderd.sock, else\n"
	        "                      $XDG_RUNTIME_DIR/loaderd.sock, else /run/loaderd/loaderd.sock\n"
	        "  -j, --json          print one JSON object per command\n"
	        "  -h, --help          show this help\n"
	        "  -V, --version       show the versions of loaderctl and the libraries it runs on\n"
	        "\n"
	        "Commands:\n");
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		fprintf(f, "  %s%s%s\n      %s\n", verbs[i].name, *verbs[i].synopsis ? " " : "",
		        verbs[i].synopsis, verbs[i].help);
	fprintf(f,
	        "\n"
	        "create options:\n"
	        "  --spec FILE         the pipeline spec; '-' reads standard input\n"
	        "  --exist-ok          succeed when an identical pipeline of yours (or the\n"
	        "                      config's) exists (a persistent create makes it persistent)\n"
	        "  --owner USER        --exist-ok that may also join USER's identical pipeline\n"
	        "                      (a user name or uid; docs/security.md)\n"
	        "  --scoped            send the spec as it is: without \"persist\" or \"ttl\" of its\n"
	        "                      own the pipeline is dropped once unused for the daemon's\n"
	        "                      linger (5 s by default), and loaderctl leaves at once\n"
	        "                      (default: add \"persist\": true when the spec has neither,\n"
	        "                      so the pipeline stays until `drop`)\n"
	        "\n"
	        "drop options:\n"
	        "  --force             drop even while clients are attached\n"
	        "\n"
	        "consume options:\n"
	        "  --mode M            broadcast (default), partition or dynamic\n"
	        "  --rank R            partition: this consumer's rank (with --world-size)\n"
	        "  --world-size W      partition: number of ranks\n"
	        "  --start-epoch E     partition: resume at epoch E (default 0)\n"
	        "  --start-batch B     partition: resume at batch index B (default 0)\n"
	        "  --start-position P  partition: epoch E is the tail from position P of its\n"
	        "                      order, which ranks of any world size read up to there\n"
	        "                      (elastic resume: docs/spec.md, \"Partition\")\n"
	        "  --batches N         stop after N batches\n"
	        "  --epochs E          stop after E epochs of this consumer's share\n"
	        "                      (without --batches/--epochs: read until the pipeline ends)\n"
	        "  --dump FILE         write every field of every batch, in order, as raw C-order\n"
	        "                      bytes ('-' = stdout; the report then goes to stderr)\n"
	        "  --inflight K        batches asked for or waiting, 1..%d (default: the daemon's\n"
	        "                      choice, 4..16 by the batch bytes)\n"
	        "  --timeout MS        fail when no batch arrives within MS ms (default: wait)\n"
	        "  --delay MS          hold each batch MS ms before releasing it, as a\n"
	        "                      trainer's step would (default 0)\n"
	        "  --device D          where batches are delivered: cpu (default, host memory)\n"
	        "                      or cuda:N (GPU N; a daemon that cannot serve it says why;\n"
	        "                      the checksum and --dump read each batch's host copy)\n"
	        "  --augment-seed S    broadcast, partition: draw the random transforms from seed S\n"
	        "                      (0..2^63-1) instead of the spec's seed: the batches a solo\n"
	        "                      run of the spec with \"seed\": S gives; the samples and\n"
	        "                      their order stay the spec's (docs/spec.md, \"Augment seeds\")\n"
	        "  --job NAME          the job this consumer is part of (default: torchrun's\n"
	        "                      $TORCHELASTIC_RUN_ID, else this process): a stream no\n"
	        "                      client reads starts again for another job (docs/spec.md, \"Jobs\")\n"
	        "  -v, --verbose       one line per batch: epoch, batch index, rows, bytes\n"
	        "\n"
	        "top options:\n"
	        "  -d, --interval SECS seconds between refreshes, 0.1 to 3600 (default 1)\n"
	        "  -n, --iterations N  stop after N refreshes (default: run until q)\n"
	        "  --sort KEY          the rows' order: wait (default: the clients that wait\n"
	        "                      longest for data and the busiest pipelines first),\n"
	        "                      rate (samples/s), name, or id (the daemon's order)\n"
	        "  keys: w, r, n, i choose the sort key, s or > the next one, < the one\n"
	        "  before; q or Ctrl-C quits. Without a terminal top prints N frames\n"
	        "  (default 1), one after the other.\n"
	        "\n"
	        "inspect options:\n"
	        "  --seq-len N         also the samples of N tokens one epoch of all documents\n"
	        "                      gives, as megatron-core's GPTDataset builds them\n"
	        "                      (N + 1 tokens each, one shared: (tokens - 1) / N)\n"
	        "  inspect reads PREFIX.idx and PREFIX.bin (FILE: either, its suffix dropped)\n"
	        "  with this process's permissions and checks the index against the data file:\n"
	        "  exit 1 with the error, naming the file and byte offset, when it is invalid.\n"
	        "\n"
	        "The checksum is zlib's CRC-32 of exactly the bytes --dump writes.\n"
	        "\n"
	        "set and reload (root, loaderd's user and the config's admin_group only):\n"
	        "  set workers N       worker threads, 1..1024; a shrink lets running tasks finish\n"
	        "  set prefetch PIPELINE N\n"
	        "                      slots of PIPELINE its streams may fill, 1..its slots\n"
	        "                      (slots_total: the slab cannot grow live)\n"
	        "  set log-level LEVEL error, warning, notice, info or debug\n"
	        "  set memory-limit SIZE\n"
	        "                      bytes or 512M, 4G, for creates from now on; slabs made stay\n"
	        "  reload              prints what changed (old -> new), the keys that need a\n"
	        "                      restart and what became of the config's pipelines;\n"
	        "                      an invalid file changes nothing and says why\n"
	        "                      (exit 1, also when a pipeline could not be created)\n"
	        "A set lasts until the next reload or restart, which apply the file's values\n"
	        "and the config's pipelines' prefetch (docs/config.md).\n"
	        "\n"
	        "Exit status: 0 success, 1 failure (the daemon refused: its message says why),\n"
	        "2 usage error.\n", LDR_INFLIGHT_MAX);
}

static int cmd_help(struct ctl *ctl, int argc, char **argv)
{
	print_help(stdout);
	return 0;
}

static void print_version(void)
{
	printf(PROG " %s\n", LOADERD_VERSION);
	printf("libloader %s\n", ldr_version());
	printf("nng %s\n", ldr_nng_version());
	printf("protobuf-c %s\n", ldr_protobuf_c_version());
	printf("jansson %s\n", jansson_version_str());
	printf("zlib %s\n", zlibVersion());
}

/* Parse one option into @ctl; usage errors exit. */
static void handle_option(struct ctl *ctl, int id, const char *arg)
{
	switch (id) {
	case OPT_SOCKET:
		if (!*arg)
			usage_error("invalid socket path -- ''");
		ctl->socket = arg;
		break;
	case OPT_JSON:
		ctl->json = true;
		break;
	case OPT_HELP:
		print_help(stdout);
		exit(EXIT_SUCCESS);
	case OPT_VERSION:
		print_version();
		exit(EXIT_SUCCESS);
	case OPT_VERBOSE:
		ctl->verbose = true;
		break;
	case OPT_SPEC:
		if (!*arg)
			usage_error("invalid spec file -- ''");
		ctl->spec = arg;
		break;
	case OPT_EXIST_OK:
		ctl->exist_ok = true;
		break;
	case OPT_SCOPED:
		ctl->scoped = true;
		break;
	case OPT_OWNER: {
		struct passwd *pw = getpwnam(arg);

		if (pw)
			ctl->owner = (uint32_t)pw->pw_uid;
		else if (*arg >= '0' && *arg <= '9')
			ctl->owner = (uint32_t)arg_u64("owner", arg, 0, UINT32_MAX - 1);
		else
			usage_error("invalid owner -- '%s' (a user name or uid)", arg);
		ctl->has_owner = ctl->exist_ok = true;
		break;
	}
	case OPT_FORCE:
		ctl->force = true;
		break;
	case OPT_MODE: {
		int m = ldr_mode_from_name(arg);

		if (m < 0)
			usage_error("invalid mode -- '%s' (broadcast, partition or dynamic)", arg);
		ctl->mode = m;
		ctl->has_mode = true;
		break;
	}
	case OPT_RANK:
		ctl->rank = (uint32_t)arg_u64("rank", arg, 0, UINT32_MAX - 1);
		ctl->has_rank = true;
		break;
	case OPT_WORLD_SIZE:
		ctl->world_size = (uint32_t)arg_u64("world size", arg, 1, UINT32_MAX);
		ctl->has_world = true;
		break;
	case OPT_START_EPOCH:
		ctl->start_epoch = arg_u64("start epoch", arg, 0, UINT64_MAX);
		ctl->has_start_epoch = true;
		break;
	case OPT_AUGMENT_SEED:
		ctl->augment_seed = arg_u64("augment seed (0..2^63-1)", arg, 0, INT64_MAX);
		ctl->has_augment_seed = true;
		break;
	case OPT_JOB:
		ctl->job = arg;
		break;
	case OPT_START_BATCH:
		ctl->start_batch = arg_u64("start batch", arg, 0, UINT64_MAX);
		ctl->has_start_batch = true;
		break;
	case OPT_START_POSITION:
		ctl->start_position = arg_u64("start position", arg, 0, UINT64_MAX);
		ctl->has_start_position = true;
		break;
	case OPT_BATCHES:
		ctl->batches = arg_u64("batch count", arg, 1, UINT64_MAX);
		ctl->has_batches = true;
		break;
	case OPT_EPOCHS:
		ctl->epochs = arg_u64("epoch count", arg, 1, UINT64_MAX);
		ctl->has_epochs = true;
		break;
	case OPT_DUMP:
		if (!*arg)
			usage_error("invalid dump file -- ''");
		ctl->dump = arg;
		break;
	case OPT_INFLIGHT:
		ctl->inflight = (uint32_t)arg_u64("inflight count", arg, 1, LDR_INFLIGHT_MAX);
		break;
	case OPT_TIMEOUT:
		ctl->timeout_ms = (int)arg_u64("timeout", arg, 0, INT_MAX);
		break;
	case OPT_DELAY:
		ctl->delay_ms = (unsigned)arg_u64("delay", arg, 0, 3600000);
		break;
	case OPT_INTERVAL: {
		char *end;
		double v;

		errno = 0;
		v = strtod(arg, &end);
		if (!*arg || *end || errno || !(v >= 0.1 && v <= 3600))
			usage_error("invalid interval -- '%s' (seconds, 0.1 to 3600)", arg);
		ctl->interval = v;
		break;
	}
	case OPT_ITERATIONS:
		ctl->iterations = arg_u64("iteration count", arg, 1, UINT64_MAX);
		break;
	case OPT_SEQ_LEN:
		ctl->seq_len = arg_u64("sequence length", arg, 1, 1u << 24);
		break;
	case OPT_SORT:
		ctl->sort = sort_from_name(arg);
		if (ctl->sort < 0)
			usage_error("invalid sort key -- '%s' (wait, rate, name or id)", arg);
		break;
	case OPT_DEVICE: {
		uint64_t v;

		if (!strcmp(arg, "cpu") || !strcmp(arg, "host")) {
			ctl->device_kind = LDR_DEVICE_HOST;
			ctl->device_index = 0;
		} else if (!strcmp(arg, "cuda")) {
			ctl->device_kind = LDR_DEVICE_CUDA;
			ctl->device_index = 0;
		} else if (!strncmp(arg, "cuda:", 5) && parse_u64(arg + 5, INT_MAX, &v) == 0) {
			ctl->device_kind = LDR_DEVICE_CUDA;
			ctl->device_index = (int)v;
		} else {
			usage_error("invalid device -- '%s' (cpu, cuda or cuda:N)", arg);
		}
		break;
	}
	default:
		/* getopt already said what was wrong */
		fputs("Try '" PROG " --help' for more information.\n", stderr);
		exit(EXIT_USAGE);
	}
}

int main(int argc, char **argv)
{
	static const struct option global_options[] = {
		COMMON_OPTIONS,
		{ "version", no_argument, NULL, OPT_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct ctl ctl = { .mode = LDR_MODE_BROADCAST, .timeout_ms = -1, .interval = 1 };
	const struct verb *verb = NULL;
	int c, nargs;

	argv[0] = (char *)PROG; /* getopt's messages say "loaderctl: ..." */

	/* '+': stop at the command, whose own options follow it. */
	while ((c = getopt_long(argc, argv, "+s:jhV", global_options, NULL)) != -1)
		handle_option(&ctl, c, optarg);
	if (optind >= argc)
		usage_error("missing command");

	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		if (!strcmp(argv[optind], verbs[i].name))
			verb = &verbs[i];
	if (!verb)
		usage_error("unknown command -- '%s'", argv[optind]);

	/* Parse the command's options; argv[0] of the sub-vector is the command. */
	argc -= optind;
	argv += optind;
	argv[0] = (char *)PROG;
	optind = 0;
	while ((c = getopt_long(argc, argv, short_options(verb), verb->options, NULL)) != -1)
		handle_option(&ctl, c, optarg);

	nargs = argc - optind;
	if (nargs < verb->min_args)
		usage_error("%s: missing %s", verb->name,
		            verb->max_args == 1 ? "argument NAME" : verb->fn == cmd_set ?
		            "arguments (set workers N, set prefetch PIPELINE N, set log-level LEVEL)" :
		            "arguments");
	if (nargs > verb->max_args)
		usage_error("%s: unexpected argument -- '%s'", verb->name, argv[optind + verb->max_args]);
	if (verb->fn == cmd_create && !ctl.spec)
		usage_error("create: missing --spec FILE");

	return verb->fn(&ctl, nargs, argv + optind);
}
