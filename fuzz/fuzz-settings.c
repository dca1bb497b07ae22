/* SPDX-License-Identifier: MIT */
/* fuzz-settings - settings_load() of any config file, then its pipelines' specs
 *
 * The input is the whole config file, written to a private directory (no
 * conf.d/ beside it) and loaded as the daemon loads it at start and on
 * SIGHUP: with values already set (keep_set), then every pipeline of the
 * file through spec_from_json(). size_parse() gets the input as a
 * size string too.
 */
#include "fuzz.h"

#include "settings.h"
#include "size.h"
#include "spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct settings cfg = { 0 };
	char path[128], err[1024] = "";
	char *text = fuzz_cstr(data, size);
	uint64_t bytes;
	json_t *v;
	size_t i;
	int r;

	if (!text)
		return 0;
	(void)size_parse(text, &bytes);
	free(text);

	fuzz_file("loaderd.json", data, size, path, sizeof(path));
	cfg.workers = 2;
	cfg.socket_path = strdup("/run/loaderd/fuzz.sock");
	r = settings_load(&cfg, path, size & 1, err, sizeof(err));
	if (r == 0) {
		json_array_foreach(cfg.pipelines, i, v) {
			struct spec *spec = NULL;
			if (spec_from_json(&spec, v, err, sizeof(err)) == 0)
				spec_free(spec);
		}
	} else if (!err[0] && r != -ENOMEM) { /* common.h's error rule */
		fprintf(stderr, "settings_load failed without a message\n");
		abort();
	}
	settings_clear(&cfg);
	return 0;
}
