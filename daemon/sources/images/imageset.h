/* SPDX-License-Identifier: MIT */
/* imageset - the samples of an image source: a class-per-folder tree or tar shards */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct creds;
struct imageset;

#define IMAGESET_SHARDS_MAX 65536     /* shards a webdataset may name (imageset.c) */

/**
 * imageset_open_folder() - list an ImageFolder tree once.
 * @who: whose permissions the tree and its files are read with (creds.h),
 *       here and in imageset_read()
 * @root: a folder whose subfolders are the classes
 *
 * As torchvision's ImageFolder: classes are the subfolders of @root sorted by
 * name (label = index), and each class holds the files of its whole subtree,
 * walked folder by folder in sorted path order, files sorted by name. Only
 * .jpg, .jpeg and .png files (any case) count.
 * Return: 0, or a negative errno with @err naming the path.
 */
int imageset_open_folder(struct imageset **out, const struct creds *who, const char *root,
			 char *err, size_t errlen);
/* The same as @src's creator; @root may also be s3://bucket/prefix, listed
 * (ListObjectsV2) and every image fetched into the node's cache (objects.c),
 * or, when they are more than cache_bytes, each read as a stream: fetched
 * when read or ahead of the reads, @object_of(@arg, idx) naming sample
 * idx's URL (imageset_shard_of() of this set). */
struct source;
int imageset_open_folder_of(struct imageset **out, const struct source *src, const char *root,
			    const char *(*object_of)(void *arg, uint64_t idx), void *arg, char *err, size_t errlen);

/**
 * imageset_open_webdataset() - index WebDataset tar shards once.
 * @src: the source: its creator's permissions read the shards, and a shard
 *       named by an s3:// or https:// URL is its cached copy (objects.c)
 * @urls: shard paths or brace patterns ("train-{0000..0099}.tar"), in order
 *
 * Members group into samples by key, as the webdataset library does: the
 * member path up to the first '.' of its last component; consecutive members
 * with the same key form one sample. A sample's image is its first .jpg, .jpeg
 * or .png member, its label the decimal integer in its .cls member (read
 * here). Keys without an image are not samples.
 * Return: 0, or a negative errno with @err naming the shard.
 */
struct source;
int imageset_open_webdataset(struct imageset **out, const struct source *src, char *const *urls,
			     size_t nurls, char *err, size_t errlen);
/* The shard (its path or URL) of a webdataset's sample @idx; a store's folder
 * read as a stream: its image's URL; NULL for another folder's. */
const char *imageset_shard_of(const struct imageset *set, uint64_t idx);
struct imageset *imageset_free(struct imageset *set);
/* A webdataset's shard boundaries: a malloc'd array of nshards + 1, entry k
 * the first sample of shard k, the last n; NULL (no memory, or a folder). */
uint64_t *imageset_shard_first(const struct imageset *set, uint32_t *nshards);

uint64_t imageset_count(const struct imageset *set);
/* Classes of an image folder (0 for webdataset). */
size_t imageset_nclasses(const struct imageset *set);

/* A webdataset's sample @idx read by range (a shuffled stream): its
 * image member's range noted for the worker's read-ahead (source.h), nothing
 * read; nothing for another set or a sample its checks refuse. */
void imageset_note(const struct imageset *set, uint64_t idx);

/**
 * imageset_read() - read the encoded image of sample @idx.
 * @buf, @cap: a buffer grown with realloc as needed (the caller frees it)
 * @len: receives the number of bytes
 * @label: receives the label
 *
 * Thread-safe. Errors name the file (or shard and key): a missing or bad
 * .cls member, an unreadable or vanished file.
 * Return: 0 or a negative errno with @err set.
 */
int imageset_read(const struct imageset *set, uint64_t idx, uint8_t **buf, size_t *cap,
		  size_t *len, int64_t *label, char *err, size_t errlen);

/* "root/cls/x.jpg" or "shard.tar: key" for messages. */
void imageset_describe(const struct imageset *set, uint64_t idx, char *buf, size_t len);

/**
 * imageset_count_shards() - the shards @urls name, from the patterns alone.
 * Return: the count, or -EINVAL (a bad pattern) or -E2BIG (more than the
 * most, "webdataset: 1000000 shards named, the most is 65536") with @err set.
 */
long imageset_count_shards(char *const *urls, size_t nurls, char *err, size_t errlen);
/* The bytes the index takes (samples, names, shard paths). */
uint64_t imageset_bytes(const struct imageset *set);
