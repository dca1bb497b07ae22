/* SPDX-License-Identifier: MIT */
/* fuzz-spec - spec_parse() on any text, and its canonical form parsed again
 *
 * A pipeline spec comes from any client (CreatePipeline) and from the config
 * file. Besides "no crash, no leak, no undefined behaviour", a spec that
 * parses must give a canonical form (spec->json) that parses to an equal
 * spec: create with exist_ok compares pipelines by it (spec_equal()), and a
 * pipeline status shows is one a client can send back.
 */
#include "fuzz.h"

#include "spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[1024], err2[1024], diff[512];
	struct spec *spec = NULL, *again = NULL;
	char *text = fuzz_cstr(data, size), *canon;

	if (!text)
		return 0;
	if (spec_parse(&spec, text, err, sizeof(err)) == 0) {
		canon = json_dumps(spec->json, JSON_COMPACT | JSON_SORT_KEYS);
		if (!canon)
			abort();
		if (spec_parse(&again, canon, err2, sizeof(err2)) != 0) {
			fprintf(stderr, "canonical form refused: %s\n  %s\n", err2, canon);
			abort();
		}
		if (!spec_equal(spec, again) || spec_diff(spec, again, diff, sizeof(diff)) != 0) {
			spec_diff(spec, again, diff, sizeof(diff));
			fprintf(stderr, "canonical form differs: %s\n  %s\n", diff, canon);
			abort();
		}
		free(canon);
		spec_free(again);
		spec_free(spec);
	}
	free(text);
	return 0;
}
