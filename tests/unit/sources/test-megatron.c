/* SPDX-License-Identifier: MIT */
/* test-megatron - the megatron kind's numpy legacy RandomState (nprandom.h)
 * against numpy itself, run by the test (skipped, exit 77, without numpy):
 * the raw MT19937 draws, and shuffles of int32 and int64 arrays of several
 * sizes drawn one after another from one state, as megatron-core draws its
 * document and shuffle indexes. */
#undef NDEBUG
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nprandom.h"

static const char script[] =
	"import numpy as np\n"
	"for seed in (0, 1, 1234, 4294967295):\n"
	"    r = np.random.RandomState(seed)\n"
	"    print(*r.randint(0, 2**32, size=8, dtype=np.uint32))\n"
	"    for n in (1, 2, 7, 1000, 70000):\n"
	"        a = np.arange(n, dtype=np.int32 if n % 2 else np.int64)\n"
	"        r.shuffle(a)\n"
	"        print(*a)\n";

/* The script has no single quote: it goes into the shell's '...' as it is. */
static FILE *numpy_lines(void)
{
	static char cmd[sizeof(script) + 64];

	if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
		return NULL;
	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c '%s'", script);
	return popen(cmd, "r");
}

int main(void)
{
	static const uint32_t seeds[] = { 0, 1, 1234, 4294967295u };
	static const size_t sizes[] = { 1, 2, 7, 1000, 70000 };
	FILE *np = numpy_lines();
	int64_t *a = malloc(70000 * sizeof(*a));
	int32_t *b = malloc(70000 * sizeof(*b));

	if (!np) {
		printf("test-megatron: skipped: no numpy for /usr/bin/python3\n");
		return 77;
	}
	for (size_t s = 0; s < 4; s++) {
		struct nprandom st;

		nprandom_seed(&st, seeds[s]);
		for (int i = 0; i < 8; i++) {
			unsigned long long want;

			assert(fscanf(np, "%llu", &want) == 1);
			assert(nprandom_next32(&st) == want);
		}
		for (size_t k = 0; k < 5; k++) {
			size_t n = sizes[k];

			for (size_t i = 0; i < n; i++) {
				a[i] = (int64_t)i;
				b[i] = (int32_t)i;
			}
			if (n % 2)
				nprandom_shuffle32(&st, b, n);
			else
				nprandom_shuffle64(&st, a, n);
			for (size_t i = 0; i < n; i++) {
				long long want;

				assert(fscanf(np, "%lld", &want) == 1);
				assert((n % 2 ? (long long)b[i] : (long long)a[i]) == want);
			}
		}
	}
	assert(pclose(np) == 0);
	free(a);
	free(b);
	printf("test-megatron: ok\n");
	return 0;
}
