/* SPDX-License-Identifier: MIT */
/* test-spec - spec parsing, defaults and error messages */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "creds.h"
#include "spec.h"

static char err[512];

static struct spec *ok(const char *text)
{
	struct spec *s = NULL;
	int r = spec_parse(&s, text, err, sizeof(err));

	if (r != 0)
		fprintf(stderr, "unexpected error for %s: %s\n", text, err);
	assert(r == 0 && s);
	return s;
}

/* Parse must fail and the message must contain @want. */
static void bad(const char *text, const char *want)
{
	struct spec *s = NULL;
	int r = spec_parse(&s, text, err, sizeof(err));

	if (r != -EINVAL || !strstr(err, want))
		fprintf(stderr, "for %s\n  got %d \"%s\"\n  want \"%s\"\n", text, r, err, want);
	assert(r == -EINVAL);
	assert(s == NULL);
	assert(strncmp(err, "spec: ", 6) == 0);
	assert(strstr(err, want));
}

#define TOK "\"source\": {\"kind\": \"tokens\", \"path\": \"/d/t.bin\", \"seq_len\": 4}"
#define NPY "\"source\": {\"kind\": \"npy\", \"paths\": [\"/d/x.npy\", \"y.npy\"]}"

static void test_defaults(void)
{
	struct spec *s = ok("{\"name\": \"tok\", " TOK "}");

	assert(strcmp(s->name, "tok") == 0);
	assert(s->kind == SOURCE_TOKENS);
	assert(strcmp(s->source.path, "/d/t.bin") == 0);
	assert(s->source.dtype == LDR_DTYPE_UINT16);
	assert(s->source.output_dtype == LDR_DTYPE_INT64);
	assert(s->source.seq_len == 4);
	assert(s->batch_size == 32);
	assert(!s->shuffle && s->seed == 0 && !s->drop_last);
	/* prefetch 0: sized by the daemon at create (registry.c, prefetch_auto()) */
	assert(s->epochs == 1 && s->prefetch == 0 && s->min_clients == 1);

	json_t *want = json_loads("{\"name\": \"tok\", \"source\": {\"kind\": \"tokens\", "
				  "\"path\": \"/d/t.bin\", \"dtype\": \"uint16\", \"seq_len\": 4, "
				  "\"output_dtype\": \"int64\", \"boundaries\": \"file\", "
				  "\"sampling\": \"aligned\"}, \"batch_size\": 32, "
				  "\"shuffle\": false, \"seed\": 0, \"drop_last\": false, "
				  "\"epochs\": 1, \"prefetch\": \"auto\", \"min_clients\": 1}",
				  0, NULL);
	assert(want && json_equal(want, s->json));
	json_decref(want);
	/* "auto" is the default said out loud; a prefetch named is another spec */
	struct spec *a = ok("{\"name\": \"tok\", " TOK ", \"prefetch\": \"auto\"}");
	struct spec *eight = ok("{\"name\": \"tok\", " TOK ", \"prefetch\": 8}");
	assert(a->prefetch == 0 && spec_equal(s, a));
	assert(eight->prefetch == 8 && !spec_equal(s, eight));
	spec_free(a);
	spec_free(eight);
	spec_free(s);

	s = ok("{\"name\": \"arr\", " NPY ", \"batch_size\": 64}");
	assert(s->kind == SOURCE_NPY);
	assert(s->source.npaths == 2);
	assert(strcmp(s->source.paths[0], "/d/x.npy") == 0);
	assert(strcmp(s->source.paths[1], "y.npy") == 0);
	assert(s->batch_size == 64);
	assert(json_equal(json_object_get(json_object_get(s->json, "source"), "paths"),
			  json_object_get(json_object_get(s->json, "source"), "paths")));
	assert(json_array_size(json_object_get(json_object_get(s->json, "source"), "paths")) == 2);
	spec_free(s);

	s = ok("{\"name\": \"A-z_0.9\", \"source\": {\"kind\": \"tokens\", \"path\": \"t\", "
	       "\"dtype\": \"int32\", \"seq_len\": 16777216, \"output_dtype\": \"int32\"}, "
	       "\"batch_size\": 1048576, \"shuffle\": true, \"seed\": 9223372036854775807, "
	       "\"drop_last\": true, \"epochs\": 0, \"prefetch\": 1024, \"min_clients\": 3}");
	assert(s->source.dtype == LDR_DTYPE_INT32 && s->source.output_dtype == LDR_DTYPE_INT32);
	assert(s->source.seq_len == 16777216 && s->batch_size == 1048576);
	assert(s->shuffle && s->drop_last && s->epochs == 0 && s->prefetch == 1024);
	assert(s->seed == 9223372036854775807ull && s->min_clients == 3);
	/* the canonical json parses back to an equal spec */
	char *dump = json_dumps(s->json, JSON_COMPACT);
	struct spec *s2 = ok(dump);
	assert(spec_equal(s, s2));
	free(dump);
	spec_free(s2);
	spec_free(s);
}

static void test_errors(void)
{
	/* exact messages */
	bad("{\"name\": \"t\", " TOK ", \"batch_size\": 0}",
	    "spec: batch_size: must be an integer in 1..1048576");
	assert(strcmp(err, "spec: batch_size: must be an integer in 1..1048576") == 0);
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", \"seq_len\": 1, "
	    "\"dtype\": \"int64\"}}",
	    "spec: source.dtype: must be one of uint16, uint32, int32");
	assert(strcmp(err, "spec: source.dtype: must be one of uint16, uint32, int32") == 0);
	bad("{\"name\": \"t\", " TOK ", \"shufle\": true}", "spec: unknown key \"shufle\"");
	assert(strcmp(err, "spec: unknown key \"shufle\"") == 0);

	/* unknown keys at every level */
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", \"seq_len\": 1, "
	    "\"bogus\": 1}}", "unknown key \"source.bogus\"");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": [\"a.npy\"], "
	    "\"path\": \"p\"}}", "unknown key \"source.path\"");

	/* required keys */
	bad("{" TOK "}", "name: is required");
	bad("{\"name\": \"t\"}", "source: is required");
	bad("{\"name\": \"t\", \"source\": {}}", "source.kind: is required");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"seq_len\": 1}}",
	    "source.path: is required");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\"}}",
	    "source.seq_len: is required");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\"}}", "source.paths: is required");

	/* types and ranges */
	bad("{\"name\": 3, " TOK "}", "name: must be");
	bad("{\"name\": \"\", " TOK "}", "name: must be");
	bad("{\"name\": \".x\", " TOK "}", "name: must be");
	bad("{\"name\": \"-x\", " TOK "}", "name: must be");
	bad("{\"name\": \"a b\", " TOK "}", "name: must be");
	bad("{\"name\": \"a/b\", " TOK "}", "name: must be");
	bad("{\"name\": \"a\\u0000b\", " TOK "}", "invalid JSON");
	bad("{\"name\": \"0123456789012345678901234567890123456789012345678901234567890123\", "
	    TOK "}", "name: must be");
	bad("{\"name\": \"t\", \"source\": []}", "source: must be an object");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"images\"}}",
	    "spec: source.kind: must be one of tokens, npy");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"\", \"seq_len\": 1}}",
	    "source.path: must be a non-empty string");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": 1, \"seq_len\": 1}}",
	    "source.path: must be a non-empty string");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", \"seq_len\": 0}}",
	    "spec: source.seq_len: must be an integer in 1..16777216");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", "
	    "\"seq_len\": 16777217}}", "source.seq_len: must be");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", \"seq_len\": 1.5}}",
	    "source.seq_len: must be");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"p\", \"seq_len\": 1, "
	    "\"output_dtype\": \"uint32\"}}",
	    "spec: source.output_dtype: must be int64 or the source dtype (uint16)");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": []}}",
	    "spec: source.paths: must be an array of 1..16 strings");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": \"x.npy\"}}",
	    "source.paths: must be an array");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": [\"a\",\"b\",\"c\",\"d\","
	    "\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}}",
	    "source.paths: must be an array of 1..16 strings");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": [\"a.npy\", 2]}}",
	    "source.paths[1]: must be a non-empty string");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": [\"/a/x.npy\", "
	    "\"/b/x.npy\"]}}", "source.paths[1]: field name \"x\"");
	bad("{\"name\": \"t\", \"source\": {\"kind\": \"npy\", \"paths\": [\"/a/\"]}}",
	    "source.paths[0]: the file stem");
	bad("{\"name\": \"t\", " TOK ", \"batch_size\": 1048577}", "batch_size: must be");
	bad("{\"name\": \"t\", " TOK ", \"batch_size\": \"32\"}", "batch_size: must be");
	bad("{\"name\": \"t\", " TOK ", \"shuffle\": 1}", "spec: shuffle: must be true or false");
	bad("{\"name\": \"t\", " TOK ", \"drop_last\": null}", "drop_last: must be true or false");
	bad("{\"name\": \"t\", " TOK ", \"seed\": -1}", "spec: seed: must be a non-negative integer");
	bad("{\"name\": \"t\", " TOK ", \"epochs\": -1}", "spec: epochs: must be");
	bad("{\"name\": \"t\", " TOK ", \"prefetch\": 1}",
	    "spec: prefetch: must be an integer in 2..1024, or \"auto\"");
	bad("{\"name\": \"t\", " TOK ", \"prefetch\": \"Auto\"}", "prefetch: must be");
	bad("{\"name\": \"t\", " TOK ", \"prefetch\": null}", "prefetch: must be");
	bad("{\"name\": \"t\", " TOK ", \"prefetch\": 1025}", "prefetch: must be");
	bad("{\"name\": \"t\", " TOK ", \"min_clients\": 0}",
	    "spec: min_clients: must be an integer in 1..1024");
	bad("{\"name\": \"t\", " TOK ", \"min_clients\": 1025}", "min_clients: must be");

	/* JSON level */
	bad("{\"name\": \"t\", \"name\": \"u\", " TOK "}", "spec: invalid JSON at line 1");
	assert(strstr(err, "duplicate"));
	bad("{\"name\": \"t\",\n  " TOK ",\n  \"batch_size\": }", "invalid JSON at line 3, column");
	bad("[1, 2]", "spec: must be a JSON object");
	bad("42", "spec: must be a JSON object");
	bad("", "invalid JSON");

	char *big = malloc(300 * 1024);
	memset(big, ' ', 300 * 1024 - 1);
	big[300 * 1024 - 1] = '\0';
	bad(big, "spec: longer than 262144 bytes");
	free(big);
}

static void test_equal(void)
{
	struct spec *a = ok("{\"name\": \"t\", " TOK "}");
	struct spec *b = ok("{\"batch_size\": 32, " TOK ", \"name\": \"t\", \"epochs\": 1}");
	struct spec *c = ok("{\"name\": \"t\", " TOK ", \"seed\": 1}");
	struct spec *d = ok("{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", "
			    "\"path\": \"/d/t.bin\", \"seq_len\": 4, \"output_dtype\": \"uint16\"}}");

	assert(spec_equal(a, b));
	assert(!spec_equal(a, c));
	assert(!spec_equal(a, d));
	spec_free(a);
	spec_free(b);
	spec_free(c);
	spec_free(d);

	/* spec_from_json works on a config object */
	json_t *obj = json_pack("{s:s, s:{s:s, s:[s]}}", "name", "cfg", "source", "kind", "npy",
				"paths", "/x/img.npy");
	struct spec *s = NULL;
	assert(spec_from_json(&s, obj, err, sizeof(err)) == 0);
	assert(s->kind == SOURCE_NPY && s->source.npaths == 1);
	spec_free(s);
	json_decref(obj);

	char stem[LDR_NAME_MAX + 1];
	assert(spec_npy_stem("/a/b/labels.npy", stem) == 6 && strcmp(stem, "labels") == 0);
	assert(spec_npy_stem("plain", stem) == 5 && strcmp(stem, "plain") == 0);
	assert(spec_npy_stem("/a/", stem) == -EINVAL);
	assert(spec_free(NULL) == NULL);
}

/* persist and ttl: parsed, checked, and outside the canonical form */
static void test_lifetime(void)
{
	struct spec *a = ok("{\"name\": \"t\", " TOK "}");
	struct spec *p = ok("{\"name\": \"t\", " TOK ", \"persist\": true}");
	struct spec *t = ok("{\"name\": \"t\", " TOK ", \"ttl\": 2.5}");
	struct spec *f = ok("{\"name\": \"t\", " TOK ", \"persist\": false, \"ttl\": 0}");

	assert(!a->persist && !a->has_persist && !a->has_ttl);
	assert(p->persist && p->has_persist && !p->has_ttl);
	assert(!t->persist && t->has_ttl && t->ttl_ms == 2500);
	assert(!f->persist && f->has_persist && f->has_ttl && f->ttl_ms == 0);
	assert(spec_equal(a, p) && spec_equal(a, t) && spec_equal(a, f));
	assert(!json_object_get(p->json, "persist") && !json_object_get(t->json, "ttl"));
	assert(spec_diff(p, a, err, sizeof(err)) == 0 && err[0] == '\0');
	spec_free(a);
	spec_free(p);
	spec_free(t);
	spec_free(f);

	bad("{\"name\": \"t\", " TOK ", \"persist\": 1}", "spec: persist: must be true or false");
	bad("{\"name\": \"t\", " TOK ", \"ttl\": -1}", "spec: ttl: must be a number of seconds in 0..31536000");
	bad("{\"name\": \"t\", " TOK ", \"ttl\": \"5\"}", "spec: ttl: must be a number");
	bad("{\"name\": \"t\", " TOK ", \"ttl\": 31536001}", "spec: ttl: must be a number");
	bad("{\"name\": \"t\", " TOK ", \"persist\": true, \"ttl\": 5}", "spec: ttl: not with persist: true");
}

/* spec_diff: the keys that differ, nested ones dotted, in canonical order */
static void test_diff(void)
{
	struct spec *have = ok("{\"name\": \"m\", " TOK ", \"batch_size\": 32}");
	struct spec *want = ok("{\"name\": \"m\", " TOK ", \"batch_size\": 64, \"shuffle\": true}");
	struct spec *path = ok("{\"name\": \"m\", \"source\": {\"kind\": \"tokens\", \"path\": \"/e/t.bin\", "
			       "\"seq_len\": 8}}");
	struct spec *npy = ok("{\"name\": \"m\", " NPY "}");
	char small[40];

	assert(spec_diff(want, have, err, sizeof(err)) == 2);
	assert(strcmp(err, "batch_size 64 (it has 32), shuffle true (it has false)") == 0);
	assert(spec_diff(path, have, err, sizeof(err)) == 2);
	assert(strcmp(err, "source.path \"/e/t.bin\" (it has \"/d/t.bin\"), "
		       "source.seq_len 8 (it has 4)") == 0);
	/* another kind: keys only one side has */
	assert(spec_diff(npy, have, err, sizeof(err)) == 8);
	assert(strstr(err, "source.kind \"npy\" (it has \"tokens\")"));
	assert(strstr(err, "source.paths [\"/d/x.npy\",\"y.npy\"] (it has none)"));
	assert(strstr(err, "no source.seq_len (it has 4)"));
	/* what does not fit is counted */
	assert(spec_diff(npy, have, small, sizeof(small)) == 8);
	assert(strlen(small) < sizeof(small) && strstr(small, "more"));
	spec_free(have);
	spec_free(want);
	spec_free(path);
	spec_free(npy);
}

#define PYSRC(extra) "\"source\": {\"kind\": \"python\", \"dataset\": \"mypkg.data:DS\", " \
	"\"samples\": 10, \"fields\": [{\"name\": \"image\", \"dtype\": \"float32\", " \
	"\"shape\": [3, 4]}, {\"name\": \"label\", \"dtype\": \"int64\", \"shape\": []}]" extra "}"

static void test_python(void)
{
	struct spec *s = ok("{\"name\": \"p\", " PYSRC("") "}");
	char *text = json_dumps(s->json, JSON_SORT_KEYS | JSON_COMPACT);

	/* every default in the canonical form, on_error "raise" for this kind
	 * (torch's: a failed batch is an error in its place, the stream goes on) */
	assert(strstr(text, "\"on_error\":\"raise\""));
	assert(s->on_error_raise && s->on_error_fail);
	assert(strstr(text, "\"source\":{\"args\":{},\"collate\":\"\",\"dataset\":\"mypkg.data:DS\","
			    "\"digest\":\"\",\"fields\":[{\"dtype\":\"float32\",\"name\":\"image\","
			    "\"pad\":false,\"shape\":[3,4]},{\"dtype\":\"int64\",\"name\":\"label\","
			    "\"pad\":false,\"shape\":[]}],\"kind\":\"python\",\"samples\":10,"
			    "\"structure\":null}"));
	assert(!s->source.py_collate);
	free(text);
	spec_free(s);
	s = ok("{\"name\": \"p\", \"on_error\": \"skip\", " PYSRC(", \"collate\": \"m:f\", "
	       "\"structure\": {\"t\": [\"image\", \"label\"]}, \"args\": {\"root\": \"/d\"}") "}");
	assert(s->source.py_collate && !s->on_error_fail && !s->on_error_raise);
	spec_free(s);
	s = ok("{\"name\": \"p\", \"on_error\": \"fail\", " PYSRC("") "}");
	assert(s->on_error_fail && !s->on_error_raise);
	text = json_dumps(s->json, JSON_SORT_KEYS | JSON_COMPACT);
	assert(strstr(text, "\"on_error\":\"fail\""));
	free(text);
	spec_free(s);
	/* seeding: "sample" (the default) is left out of the canonical form */
	s = ok("{\"name\": \"p\", " PYSRC(", \"seeding\": \"sample\"") "}");
	assert(!json_object_get(json_object_get(s->json, "source"), "seeding"));
	spec_free(s);
	s = ok("{\"name\": \"p\", " PYSRC(", \"seeding\": \"worker\"") "}");
	assert(strcmp(json_string_value(json_object_get(json_object_get(s->json, "source"),
							"seeding")), "worker") == 0);
	spec_free(s);
	bad("{\"name\": \"p\", " PYSRC(", \"seeding\": \"epoch\"") "}",
	    "source.seeding: must be \"sample\" (each sample seeded from seed, epoch, index) or "
	    "\"worker\"");
	/* a spec of another kind does not take the python keys */
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"samples\": 1}}",
	    "source.dataset: must name the Dataset class as \"module:QualName\"");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"nocolon\"}}",
	    "source.dataset: must name");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\"}}",
	    "source.samples: is required (len(dataset))");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", \"samples\": 3}}",
	    "source.fields: is required");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", \"samples\": 3, "
	    "\"fields\": [{\"name\": \"x\", \"dtype\": \"str\", \"shape\": []}]}}",
	    "source.fields[0].dtype: must be one of bool");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", \"samples\": 3, "
	    "\"fields\": [{\"name\": \"x\", \"dtype\": \"int8\", \"shape\": [0]}]}}",
	    "source.fields[0].shape[0]: must be an integer in 1..");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", \"samples\": 3, "
	    "\"fields\": [{\"name\": \"x\", \"dtype\": \"int8\", \"shape\": [4]}, "
	    "{\"name\": \"x\", \"dtype\": \"int8\", \"shape\": []}]}}",
	    "source.fields[1].name: \"x\" is already used by source.fields[0]");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", \"samples\": 3, "
	    "\"fields\": [{\"name\": \"tok\", \"dtype\": \"int64\", \"shape\": [16], \"pad\": true}]}}",
	    "source.fields[0]: \"pad\": true needs a field \"tok_len\" (int64, shape [])");
	bad("{\"name\": \"p\", \"on_error\": \"retry\", " PYSRC("") "}", "on_error: must be raise, fail or skip");
	bad("{\"name\": \"p\", \"transforms\": [], " PYSRC("") "}", "transforms: only for");
	spec_free(ok("{\"name\": \"p\", \"source\": {\"kind\": \"python\", \"dataset\": \"a:B\", "
		     "\"samples\": 3, \"fields\": [{\"name\": \"tok\", \"dtype\": \"int64\", \"shape\": [16], "
		     "\"pad\": true}, {\"name\": \"tok_len\", \"dtype\": \"int64\", \"shape\": []}]}}"));
}

#define BIG_GID 4242424
#define BIG_MEMBERS 5000

/* In a mount namespace of its own (no change to the machine's /etc/group):
 * /etc/group with one more group, of 5000 members (about 55 KB on its line,
 * as an LDAP group can be). Returns 77 where no namespace can be made. */
static int big_group_child(void)
{
	char path[] = "/tmp/ldr-test-group-XXXXXX", buf[4096], name[64];
	struct spec *s;
	size_t n;
	gid_t gid = 0;
	FILE *in, *out;
	int fd;

	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return 77;
	assert((fd = mkstemp(path)) >= 0);
	assert((out = fdopen(fd, "w")) && (in = fopen("/etc/group", "r")));
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		assert(fwrite(buf, 1, n, out) == n);
	fclose(in);
	fprintf(out, "ldr-big-test:x:%d:", BIG_GID);
	for (int i = 0; i < BIG_MEMBERS; i++)
		fprintf(out, "%smember%04d", i ? "," : "", i);
	fprintf(out, "\n");
	assert(fclose(out) == 0);
	assert(mount(path, "/etc/group", NULL, MS_BIND, NULL) == 0);
	unlink(path); /* the mount keeps it */

	s = ok("{\"name\": \"g\", " TOK ", \"access\": \"group\", \"group\": \"ldr-big-test\"}");
	assert(s->has_group && s->group == BIG_GID);
	spec_free(s);
	assert(creds_group_by_name("ldr-big-test", &gid) == 0 && gid == BIG_GID);
	assert(creds_group_by_name("ldr-no-such-group-x", &gid) == -ENOENT);
	assert(creds_group_name(BIG_GID, name, sizeof(name)) == name);
	assert(strcmp(name, "ldr-big-test") == 0);
	return 0;
}

/* A group too big for a fixed lookup buffer (ERANGE) is found all the same. */
#define PART_T "{\"kind\": \"tokens\", \"path\": \"/d/t.bin\", \"seq_len\": 4}"
#define PART_N "{\"kind\": \"npy\", \"paths\": [\"/d/input.npy\", \"/d/target.npy\"]}"
#define BLEND(parts, more) "{\"name\": \"b\", \"source\": {\"kind\": \"blend\", " \
	"\"sources\": [" parts "]" more "}}"

/* A blend: its parts' canonical forms, and every failure path (under ASan
 * with leak checks, the parts parsed before an error are freed). */
static void test_blend(void)
{
	struct spec *s = ok(BLEND(PART_T ", " PART_N, ", \"weights\": [7, 0.5]"));
	char *text = json_dumps(json_object_get(s->json, "source"), JSON_COMPACT | JSON_SORT_KEYS);

	assert(strcmp(text, "{\"kind\":\"blend\",\"min_size\":null,\"size\":null,\"sources\":[{"
	       "\"boundaries\":\"file\",\"dtype\":\"uint16\","
	       "\"kind\":\"tokens\",\"name\":\"t.bin\",\"output_dtype\":\"int64\",\"path\":"
	       "\"/d/t.bin\",\"sampling\":\"aligned\",\"seq_len\":4},{\"kind\":\"npy\",\"name\":\"input.npy\",\"paths\":"
	       "[\"/d/input.npy\",\"/d/target.npy\"]}],\"surplus\":0.0050000000000000001,"
	       "\"weights\":[7,0.5]}") == 0);
	free(text);
	spec_free(s);
	s = ok(BLEND("{\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"repeat\": 2.5, \"name\": \"x\"}",
		     ", \"size\": null"));
	spec_free(s);
	bad(BLEND(PART_T ", " PART_N, ", \"weights\": [1]"),
	    "spec: source.weights: has 1 weights for 2 sources");
	bad(BLEND(PART_T ", " PART_N, ", \"weights\": [1, -2]"),
	    "spec: source.weights[1]: must be a finite number > 0");
	bad(BLEND(PART_T ", {\"kind\": \"npy\"}", ""), "spec: source.sources[1].paths: is required");
	bad(BLEND(PART_T ", {\"kind\": \"npy\", \"paths\": [\"a.npy\", \"a.npy\"]}", ""),
	    "spec: source.sources[1].paths[1]: field name \"a\" (the file stem) is already used by "
	    "source.sources[1].paths[0]");
	bad(BLEND(PART_T ", {\"kind\": \"webdataset\", \"urls\": [\"a.tar\"]}", ""),
	    "spec: source.sources[1].kind: webdataset sources cannot be blended");
	bad(BLEND(PART_T ", {\"kind\": 3}", ""), "spec: source.sources[1].kind: must be a source kind");
	bad(BLEND(PART_T ", {\"paths\": []}", ""), "spec: source.sources[1].kind: is required");
	bad(BLEND("{\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"name\": \"\"}", ""),
	    "spec: source.sources[0].name: must be a string of 1..48 bytes");
	bad(BLEND("{\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"proportion\": 1, \"choose\": 2}", ""),
	    "spec: source.sources[0]: at most one of proportion, repeat, choose");
	bad(BLEND(PART_T ", {\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"proportion\": 1}", ""),
	    "spec: source.sources[1].proportion: every part needs one, or none");
	bad(BLEND("{\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"proportion\": 1}, "
		  "{\"kind\": \"npy\", \"paths\": [\"y.npy\"], \"proportion\": 2, \"repeat\": 1}", ""),
	    "spec: source.sources[1]: at most one of proportion, repeat, choose");
	bad(BLEND("{\"kind\": \"npy\", \"paths\": [\"x.npy\"], \"proportion\": 1}", ", \"weights\": [1]"),
	    "spec: source.weights: not with the parts' proportion (the same thing)");
	bad(BLEND(PART_T, ", \"size\": 1.5"), "spec: source.size: must be an integer in 1..68719476736");
	bad("{\"name\": \"b\", \"source\": {\"kind\": \"blend\"}}", "spec: source.sources: is required");
	bad("{\"name\": \"b\", \"source\": {\"kind\": \"blend\", \"sources\": {}}}",
	    "spec: source.sources: must be an array of 1..32766 sources");
}

#define PART_M(p, more) "{\"kind\": \"megatron\", \"prefix\": \"/d/" p "\", \"seq_len\": 8" more "}"

static json_int_t part_samples(const struct spec *s, size_t i)
{
	json_t *src = json_object_get(s->json, "source");

	return json_integer_value(json_object_get(json_array_get(json_object_get(src, "sources"),
								 i), "num_samples"));
}

/* min_size: megatron parts asked what megatron's builder asks of them;
 * "prefixes" as the blend it stands for. */
static void test_megatron_blend(void)
{
	struct spec *s = ok(BLEND(PART_M("a", "") ", " PART_M("b", ""),
				  ", \"weights\": [1, 3], \"min_size\": 100"));

	/* ceil(ceil(100 x 0.25) x 1.005), ceil(ceil(100 x 0.75) x 1.005) */
	assert(part_samples(s, 0) == 26 && part_samples(s, 1) == 76);
	spec_free(s);
	s = ok(BLEND(PART_M("a", ", \"num_samples\": 7") ", " PART_M("b", ""),
		     ", \"weights\": [1, 3], \"min_size\": 100, \"surplus\": 0"));
	assert(part_samples(s, 0) == 7 && part_samples(s, 1) == 75);
	spec_free(s);
	s = ok(BLEND(PART_M("a", ""), ", \"min_size\": 100"));
	assert(part_samples(s, 0) == 100);
	spec_free(s);
	s = ok("{\"name\": \"p\", \"source\": {\"kind\": \"megatron\", \"prefixes\": "
	       "[\"/d/a\", \"/d/b\", \"/d/c\"], \"seq_len\": 8, \"num_samples\": 50}}");
	assert(s->kind == SOURCE_BLEND && s->source.blend);
	assert(json_integer_value(json_object_get(json_object_get(s->json, "source"),
						  "min_size")) == 50);
	assert(json_is_null(json_object_get(json_array_get(json_object_get(json_object_get(
		s->json, "source"), "sources"), 2), "num_samples")));
	spec_free(s);
	s = ok("{\"name\": \"p\", \"source\": {\"kind\": \"megatron\", \"prefixes\": "
	       "[\"/d/a\"], \"seq_len\": 8, \"num_samples\": 50}}");
	assert(s->kind == SOURCE_MEGATRON);
	assert(json_integer_value(json_object_get(json_object_get(s->json, "source"),
						  "num_samples")) == 50);
	spec_free(s);
	bad(BLEND(PART_M("a", "") ", " PART_M("b", ", \"split\": \"9,1\""), ", \"min_size\": 10"),
	    "spec: source.sources[1].split: \"9,1\" is not the first megatron part's \"1,0,0\"");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"megatron\", \"prefixes\": "
	    "[\"/d/a\", \"/d/b\"], \"weights\": [1, 2], \"seq_len\": 8}}",
	    "spec: source.weights: need source.num_samples");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"megatron\", \"prefixes\": "
	    "[\"/d/a\", \"/d/b\"], \"weights\": [1, null], \"seq_len\": 8, \"num_samples\": 5}}",
	    "spec: source.weights[1]: must be a finite number > 0");
	bad("{\"name\": \"p\", \"source\": {\"kind\": \"megatron\", \"prefixes\": "
	    "[\"/d/a\", \"/d/b\"], \"seq_len\": 1}}",
	    "spec: source.seq_len: must be an integer in 2..16777216");
}

static void test_big_group(void)
{
	int status;
	pid_t pid = fork();

	assert(pid >= 0);
	if (pid == 0)
		_exit(big_group_child());
	assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		printf("test-spec: big group: skipped (no mount namespace: not root?)\n");
	else
		assert(WEXITSTATUS(status) == 0);
}

/* A tokens corpus: "paths" kept as written, the new keys' defaults filled
 * in, the list limit exact (tests/python/test_tokens_corpus.py reads it). */
static void test_tokens_corpus(void)
{
	size_t n = 100001, len = 200 + n * 6;
	char *text = malloc(len), *p = text;
	struct spec *s = NULL;
	json_t *src, *obj;

	if (!text)
		abort();
	p += sprintf(p, "{\"name\": \"c\", \"source\": {\"kind\": \"tokens\", \"seq_len\": 4, "
		     "\"eos\": 3, \"sampling\": \"random_offset\", \"samples_per_epoch\": 9, "
		     "\"paths\": [");
	for (size_t i = 0; i < n; i++) {
		memcpy(p, ",\"/a\"" + !i, 5 - !i);
		p += 5 - !i;
	}
	/* over a spec text's 256 KiB: a pipeline of the config (spec_from_json) */
	strcpy(p, "]}}");
	obj = json_loads(text, 0, NULL);
	assert(obj && spec_from_json(&s, obj, err, sizeof(err)) == -EINVAL);
	assert(strcmp(err, "spec: source.paths: must be an array of 1..100000 strings (paths, "
			   "brace ranges, globs)") == 0);
	json_decref(obj);
	strcpy(p - 5, "]}}");                /* 100000 */
	obj = json_loads(text, 0, NULL);
	assert(obj && spec_from_json(&s, obj, err, sizeof(err)) == 0);
	json_decref(obj);
	assert(s->source.npaths == 100000 && s->source.tokens.eos == 3);
	assert(s->source.tokens.random_offset && s->source.tokens.samples_per_epoch == 9);
	src = json_object_get(s->json, "source");
	assert(json_array_size(json_object_get(src, "paths")) == 100000);
	assert(strcmp(json_string_value(json_object_get(src, "boundaries")), "file") == 0);
	assert(json_integer_value(json_object_get(src, "eos")) == 3);
	spec_free(s);
	free(text);

	s = ok("{\"name\": \"c\", \"source\": {\"kind\": \"tokens\", \"seq_len\": 4, "
	       "\"paths\": [\"/d/x-{00..99}.bin\", \"/d/y-*.bin\"]}}");
	src = json_object_get(s->json, "source");
	assert(strcmp(json_string_value(json_array_get(json_object_get(src, "paths"), 0)),
		      "/d/x-{00..99}.bin") == 0);
	assert(!json_object_get(src, "eos") && !json_object_get(src, "path"));
	assert(strcmp(json_string_value(json_object_get(src, "sampling")), "aligned") == 0);
	spec_free(s);
	bad("{\"name\": \"c\", \"source\": {\"kind\": \"tokens\", \"seq_len\": 4, "
	    "\"paths\": [\"/d/x-{0..500000}.bin\", \"/d/y-{0..500000}.bin\"]}}",
	    "spec: source.paths: 1000002 files named, the most is 1000000");
	bad("{\"name\": \"c\", \"source\": {\"kind\": \"tokens\", \"seq_len\": 4, "
	    "\"paths\": [\"/d/x-{1..}.bin\"]}}", "spec: source.paths[0]: ");
}

int main(void)
{
	test_defaults();
	test_python();
	test_errors();
	test_equal();
	test_lifetime();
	test_diff();
	test_big_group();
	test_blend();
	test_tokens_corpus();
	test_megatron_blend();
	printf("test-spec: ok\n");
	return 0;
}
