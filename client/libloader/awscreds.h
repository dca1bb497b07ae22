/* SPDX-License-Identifier: MIT */
/* awscreds - a trainer's object-store credentials, read where the AWS CLI
 * and boto3 read them (libloader's side of docs/storage.md) */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* What awscreds_load() found; "" where nothing was. */
struct awscreds {
	char access_key[128];
	char secret_key[128];
	char session_token[4096];
	char region[64];
	char endpoint[512];
	char source[160];   /* where the keys came from: "environment", "PROFILE in FILE" */
	int64_t expires;    /* when the keys expire, Unix seconds (UTC); 0: not known */
	char process[1024]; /* the profile's credential_process, "" none (run by awscreds_load()) */
};

/**
 * awscreds_load() - the credentials, region and endpoint of this process
 * @env: "NAME=VALUE" strings, NULL-terminated (environ)
 * @home: the home directory (~/.aws/ lies there); NULL: no files
 *
 * Keys: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 * else the profile (AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default")
 * in the credentials file (AWS_SHARED_CREDENTIALS_FILE, else
 * ~/.aws/credentials), else in the config file (AWS_CONFIG_FILE, else
 * ~/.aws/config, section [profile NAME] or [default]). Region: AWS_REGION,
 * AWS_DEFAULT_REGION, the profile's region. Endpoint: AWS_ENDPOINT_URL_S3,
 * AWS_ENDPOINT_URL, the profile's `s3 =` sub-section's endpoint_url, the
 * profile's endpoint_url. No keys anywhere is not an error (public
 * objects). Expiry: AWS_CREDENTIAL_EXPIRATION (ISO 8601, as botocore and
 * the SDKs read it) with the environment's keys. A profile with no keys but
 * a credential_process: the command is run (/bin/sh -c, @env as its
 * environment) and its JSON read (awscreds_process_json()).
 *
 * Return: 0; -EINVAL with a message naming the variable, or the file and
 * line: one key of a pair without the other, a profile named explicitly
 * that neither file has, a line that is not `[section]`, `key = value` or
 * a comment, a value too long, an AWS_CREDENTIAL_EXPIRATION that is no
 * ISO 8601 time.
 */
int awscreds_load(struct awscreds *out, const char *const *env, const char *home, char *err, size_t errlen);

/**
 * awscreds_parse() - one INI file's profile @section into @out
 * @text: the file's bytes (NUL-terminated); @path names it in messages
 * @found: set to 1 when the section is there
 *
 * Fills what @out lacks (an earlier source wins). Used by
 * awscreds_load(); a fuzz target's entry (fuzz/fuzz-awscreds.c).
 */
int awscreds_parse(struct awscreds *out, const char *text, const char *path, const char *section, int *found,
		   char *err, size_t errlen);

/**
 * awscreds_time() - an ISO 8601 time (2026-12-06T13:00:00Z, with fractions
 * of a second or a +HH:MM offset) as Unix seconds
 *
 * Return: 0, or -EINVAL when @s is not one.
 */
int awscreds_time(const char *s, int64_t *out);

/**
 * awscreds_process_json() - the keys a credential_process printed
 * @text: its output (NUL-terminated): one JSON object, {"Version": 1,
 *        "AccessKeyId", "SecretAccessKey", "SessionToken"?, "Expiration"?}
 * @what: names the process in messages
 *
 * Return: 0 with the keys (and the expiry) in @out; -EINVAL naming @what
 * and what is wrong. A fuzz target's entry too (fuzz/fuzz-awscreds.c).
 */
int awscreds_process_json(struct awscreds *out, const char *text, const char *what, char *err, size_t errlen);
