/* SPDX-License-Identifier: MIT */
/* test-store-url - the store's URLs (daemon/store/url.c) and its config
 * from an environment (store_config_from_env()) */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store.h"
#include "url.h"

static void test_encode(void)
{
	char out[128];
	const char *key = "a b+c/ü~_.-%&=?*";

	assert(url_encode(out, out + sizeof out, key, strlen(key), true));
	assert(!strcmp(out, "a%20b%2Bc/%C3%BC~_.-%25%26%3D%3F%2A"));
	assert(url_encode(out, out + sizeof out, key, strlen(key), false));
	assert(!strcmp(out, "a%20b%2Bc%2F%C3%BC~_.-%25%26%3D%3F%2A"));
	/* it never writes past @cap */
	assert(url_encode(out, out + 4, "abcd", 4, true) == NULL);
	assert(url_encode(out, out + 5, "abcd", 4, true) == out + 4 && !strcmp(out, "abcd"));
	assert(url_encode(out, out + 3, " ", 1, true) == NULL);
}

static void test_split(void)
{
	char scheme[8], host[64], bucket[64];
	const char *key;

	assert(url_split_endpoint("http://127.0.0.1:8333", scheme, sizeof scheme, host, sizeof host) == 0);
	assert(!strcmp(scheme, "http") && !strcmp(host, "127.0.0.1:8333"));
	assert(url_split_endpoint("https://s3.example.com/", scheme, sizeof scheme, host, sizeof host) == 0);
	assert(!strcmp(scheme, "https") && !strcmp(host, "s3.example.com"));
	assert(url_split_endpoint("ftp://x", scheme, sizeof scheme, host, sizeof host) == -EINVAL);
	assert(url_split_endpoint("http://x/path", scheme, sizeof scheme, host, sizeof host) == -EINVAL);
	assert(url_split_endpoint("http://u:p@x", scheme, sizeof scheme, host, sizeof host) == -EINVAL);
	assert(url_split_endpoint("http://", scheme, sizeof scheme, host, sizeof host) == -EINVAL);
	assert(url_split_endpoint("x", scheme, sizeof scheme, host, sizeof host) == -EINVAL);

	assert(url_split_s3("s3://b-1.x/k/e y", bucket, sizeof bucket, &key) == 0);
	assert(!strcmp(bucket, "b-1.x") && !strcmp(key, "k/e y"));
	assert(url_split_s3("s3://b", bucket, sizeof bucket, &key) == 0 && !strcmp(key, ""));
	assert(url_split_s3("s3:///k", bucket, sizeof bucket, &key) == -EINVAL);
	assert(url_split_s3("s3://b c/k", bucket, sizeof bucket, &key) == -EINVAL);
	assert(url_split_s3("s3://b?x/k", bucket, sizeof bucket, &key) == -EINVAL);

	assert(url_host_is_literal("127.0.0.1:9000") && url_host_is_literal("localhost") &&
	       url_host_is_literal("localhost:9000") && url_host_is_literal("[::1]:9000"));
	assert(!url_host_is_literal("s3.amazonaws.com") && !url_host_is_literal("localhost.example"));
}

static void test_env(void)
{
	struct store_config cfg;
	char err[256];
	const char *both[] = { "AWS_ENDPOINT_URL=http://a:1", "AWS_ENDPOINT_URL_S3=http://127.0.0.1:2",
			       "AWS_DEFAULT_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AK",
			       "AWS_SECRET_ACCESS_KEY=SK", "AWS_SESSION_TOKEN=TOK", NULL };
	const char *general[] = { "AWS_ENDPOINT_URL=https://minio.example:9000", "AWS_REGION=r1",
				  "AWS_DEFAULT_REGION=r2", "AWS_ENDPOINT_URL_S3=", NULL };
	const char *bad[] = { "AWS_ENDPOINT_URL_S3=s3.example.com", NULL };

	store_config_init(&cfg);
	assert(cfg.retry_seconds == 20 && cfg.stall_seconds == 30 && !cfg.path_style);
	assert(store_config_from_env(&cfg, both, err, sizeof err) == 0);
	assert(!strcmp(cfg.endpoint, "http://127.0.0.1:2") && cfg.path_style);
	assert(!strcmp(cfg.region, "eu-west-1") && !strcmp(cfg.access_key, "AK") &&
	       !strcmp(cfg.secret_key, "SK") && !strcmp(cfg.session_token, "TOK"));

	store_config_init(&cfg);
	assert(store_config_from_env(&cfg, general, err, sizeof err) == 0);
	/* an empty value counts as unset; a named host keeps virtual-hosted addressing */
	assert(!strcmp(cfg.endpoint, "https://minio.example:9000") && !cfg.path_style);
	assert(!strcmp(cfg.region, "r1") && cfg.access_key[0] == '\0');

	store_config_init(&cfg);
	assert(store_config_from_env(&cfg, bad, err, sizeof err) == -EINVAL);
	assert(!strcmp(err, "AWS_ENDPOINT_URL_S3: 's3.example.com' is not http(s)://HOST[:PORT]"));
}

int main(void)
{
	test_encode();
	test_split();
	test_env();
	printf("test-store-url: ok\n");
	return 0;
}
