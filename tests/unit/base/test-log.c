/* SPDX-License-Identifier: MIT */
/* test-log - logfmt values and the per-client event rate limit */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static void test_quote(void)
{
	char buf[LOG_QUOTE_MAX], big[LOG_QUOTE_MAX * 2];

	assert(!strcmp(log_quote(buf, "tok-1.a"), "tok-1.a"));
	assert(!strcmp(log_quote(buf, ""), "\"\""));
	assert(!strcmp(log_quote(buf, "two words"), "\"two words\""));
	assert(!strcmp(log_quote(buf, "a=b"), "\"a=b\""));
	assert(!strcmp(log_quote(buf, "say \"hi\" \\o/"), "\"say \\\"hi\\\" \\\\o/\""));
	assert(!strcmp(log_quote(buf, "line\nbreak\ttab"), "\"line break tab\""));
	/* UTF-8 stays; C1 controls (the 8-bit CSI) and invalid bytes do not */
	assert(!strcmp(log_quote(buf, "caf\xc3\xa9"), "caf\xc3\xa9"));
	assert(!strcmp(log_quote(buf, "a\xc2\x9b" "31mb"), "\"a 31mb\""));
	assert(!strcmp(log_quote(buf, "x\x9b" "1m\xff"), "\"x 1m \""));
	assert(!strcmp(log_quote(buf, "\xe2\x82"), "\"  \""));       /* cut sequence */
	/* cut to fit, still quoted and terminated */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	log_quote(buf, big);
	assert(strlen(buf) < LOG_QUOTE_MAX && strlen(buf) > LOG_QUOTE_MAX / 2 && buf[0] == 'x');
	memset(big, '"', sizeof(big) - 1);
	log_quote(buf, big);
	assert(strlen(buf) < LOG_QUOTE_MAX && buf[strlen(buf) - 1] == '"' && buf[strlen(buf) - 2] == '"');
}

static void test_rate(void)
{
	struct log_rate r = { 0 };
	uint64_t span = 0, t = 1000;
	int written = 0;

	/* 100 events in one window: LOG_RATE_EVENTS written, the rest counted */
	for (int i = 0; i < 100; i++)
		written += log_rate_pass(&r, t + (uint64_t)i);
	assert(written == LOG_RATE_EVENTS);
	assert(log_rate_due(&r, t + 200, false, &span) == 0);   /* its window is not over */
	assert(log_rate_due(&r, t + LOG_RATE_WINDOW_MS, false, &span) == 100 - LOG_RATE_EVENTS);
	assert(span == LOG_RATE_WINDOW_MS - LOG_RATE_EVENTS);
	assert(log_rate_due(&r, t + LOG_RATE_WINDOW_MS, true, &span) == 0); /* counted once */
	/* the next window writes again */
	assert(log_rate_pass(&r, t + LOG_RATE_WINDOW_MS + 1));
	for (int i = 0; i < 30; i++)
		log_rate_pass(&r, t + LOG_RATE_WINDOW_MS + 2);
	/* at the end the count comes out whatever the window */
	assert(log_rate_due(&r, t + LOG_RATE_WINDOW_MS + 3, true, &span) == 30 - (LOG_RATE_EVENTS - 1));
}

int main(void)
{
	test_quote();
	test_rate();
	printf("log: ok\n");
	return 0;
}
