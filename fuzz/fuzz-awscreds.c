/* SPDX-License-Identifier: MIT */
/* fuzz-awscreds - a trainer's ~/.aws/credentials or ~/.aws/config
 * (client/libloader/awscreds.c)
 *
 * The files are the user's to write, but a parser that a typo crashes
 * would crash the trainer: the input is parsed for profile "default" and
 * "profile dev"; what is filled must be NUL-terminated within its field
 * and a key must come with its secret. The same bytes as an
 * AWS_CREDENTIAL_EXPIRATION (awscreds_time()): an answer only for a time;
 * and as a credential_process's output (awscreds_process_json()), a
 * container's or an instance's metadata answer (awscreds_meta_json()) and
 * an STS answer (awscreds_sts_xml()): keys NUL-terminated within their
 * fields, both or neither.
 */
#include "fuzz.h"

#include "awscreds.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const sections[] = { "default", "profile dev" };
	char *text = fuzz_cstr(data, size), err[512];

	if (!text)
		return 0;
	for (int i = 0; i < 2; i++) {
		struct awscreds c;
		int found;

		memset(&c, 0, sizeof c);
		if (awscreds_parse(&c, text, "fuzz", sections[i], &found, err, sizeof err) == 0) {
			if (strnlen(c.access_key, sizeof c.access_key) == sizeof c.access_key ||
			    strnlen(c.region, sizeof c.region) == sizeof c.region ||
			    strnlen(c.endpoint, sizeof c.endpoint) == sizeof c.endpoint ||
			    !c.access_key[0] != !c.secret_key[0])
				abort();
		}
	}
	{
		struct awscreds c;

		memset(&c, 0, sizeof c);
		if (awscreds_process_json(&c, text, "fuzz", err, sizeof err) == 0 &&
		    (strnlen(c.access_key, sizeof c.access_key) == sizeof c.access_key ||
		     strnlen(c.session_token, sizeof c.session_token) == sizeof c.session_token ||
		     !c.access_key[0] != !c.secret_key[0]))
			abort();
	}
	{
		struct awscreds c;
		int r;

		memset(&c, 0, sizeof c);
		if (awscreds_meta_json(&c, text, "fuzz", err, sizeof err) == 0 &&
		    (strnlen(c.session_token, sizeof c.session_token) == sizeof c.session_token ||
		     !c.access_key[0] || !c.secret_key[0]))
			abort();
		memset(&c, 0, sizeof c);
		r = awscreds_sts_xml(&c, text, "fuzz", err, sizeof err);
		if (r == 0 && (strnlen(c.secret_key, sizeof c.secret_key) == sizeof c.secret_key || !c.access_key[0] ||
			       !c.secret_key[0]))
			abort();
		if (r < 0 && c.access_key[0])
			abort(); /* a failure leaves no half of a pair */
	}
	{
		int64_t t;

		if (awscreds_time(text, &t) == 0 && (strlen(text) < 20 || t < -86400))
			abort();
	}
	free(text);
	return 0;
}
