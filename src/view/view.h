/* SPDX-License-Identifier: MIT */
/*
 * The device view: what liburdma_view.so's files share (view.c has the
 * overview).
 */
#ifndef URDMA_VIEW_H
#define URDMA_VIEW_H

#include <stddef.h>

#define VIEW_EXPORT __attribute__((visibility("default")))

/* view_gen.c: build the tree of this process's view under the directory
 * open at rootfd (empty, ours) from the libibverbs at verbs (urdma's): 0,
 * or -1 if there is no urdma device. */
int view_generate(int rootfd, const char *verbs);

/* view.c: the real libc function of that name (the next after us). */
void *view_real(const char *name);

#endif
