/* SPDX-License-Identifier: MIT */
/* daemon - the process: main.c, settings, reload, systemd notification
 *
 * The top layer, and the map of the layers below it (docs/architecture.md).
 * Each folder is one layer with one public header; a layer includes only the
 * layers below it, as tests/layers.py checks:
 *
 *   daemon/          main, settings, reload, notify: builds the objects,
 *      |             runs the loop, applies the config
 *   daemon/server/   server.h: socket, sessions, requests, admin, /metrics
 *      |
 *   daemon/engine/   engine.h: pipelines, streams, slots, leases, workers
 *      |        \
 *   daemon/sources/  source.h, spec.h: the spec, the kinds, one per file
 *      |   daemon/gpu/  cudadev.h: device slabs, copy engines
 *      |        /
 *   daemon/base/     base.h: log, creds, socket paths, sizes
 *
 * A layer calls a higher one only through a callback it was given (the
 * engine's engine_ops, the server's reload function, the GPU's copy
 * completion). The process may include every layer; nothing includes it.
 *
 * layer: daemon -> daemon/server daemon/engine daemon/sources daemon/gpu daemon/base common include
 */
#pragma once
