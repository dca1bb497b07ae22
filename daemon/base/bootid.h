/* SPDX-License-Identifier: MIT */
/* bootid - the running kernel's boot id: which files a power loss may have torn
 *
 * The daemon's caches (megatron's indexes, the object cache) write files
 * without fsync and rename them into place: a process that dies leaves
 * them whole in the page cache, only a kernel crash or a power loss can
 * tear one, and either changes the boot id. So a file stamped with this
 * boot's id is used as it is, one of another boot is checked first.
 */
#pragma once

/* Bytes of the id as the caches store it: 36 characters, zero-padded. */
#define BOOT_ID_BYTES 40

/* /proc/sys/kernel/random/boot_id, BOOT_ID_BYTES zero-padded (36
 * characters and a NUL), or NULL when it cannot be read. Read once. */
const char *boot_id(void);
