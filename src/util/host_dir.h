/* SPDX-License-Identifier: MIT */
/*
 * The user's host directory (/dev/shm/urdma-<euid>, or URDMA_SHM_DIR),
 * opened as libibverbs (core/host.c) and the device view (view/view.c)
 * both require it: ours alone.
 */
#ifndef URDMA_HOST_DIR_H
#define URDMA_HOST_DIR_H

#include <stddef.h>
#include <sys/stat.h>

/* The host directory's path, into buf. */
void urdma_host_dir_path(char *buf, size_t len);

/* Open directory path (made, 0700, if missing): a directory, not reached
 * through a link, owned by our effective uid, writable by nobody else.
 * Its fd; or -errno, -EPERM when it is not ours alone (*st then says
 * whose it is and its mode). */
int urdma_private_dir_open(const char *path, struct stat *st);

#endif
