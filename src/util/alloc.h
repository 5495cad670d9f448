/* SPDX-License-Identifier: MIT */
/*
 * Memory for the library's own objects, on pages that no application
 * allocation shares.
 *
 * ibv_reg_mr backs the pages of a registered range with the identity memfd:
 * it copies each page into the memfd and maps the memfd over it (core/backing.c).
 * A write that another thread makes to such a page between the copy and the
 * mapping is lost.  Application data on those pages is the application's
 * affair (ARCHITECTURE.md, "Memory"), but the library's objects (QPs, CQs
 * and their rings, TCP connections, MRs...) are written by the progress
 * thread and by other application threads at any moment; from malloc they
 * could sit on the same page as a buffer the application registers.  So
 * they come from the library's own anonymous mappings (alloc.c).  For
 * objects that outlive the call that makes them; a call's own scratch
 * arrays stay on malloc, like the application's.
 */
#ifndef URDMA_ALLOC_H
#define URDMA_ALLOC_H

#include <stddef.h>

/* Zeroed, 64-byte aligned; NULL with errno ENOMEM. */
void *urdma_zalloc(size_t size);
/* n * size, checked for overflow. */
void *urdma_zalloc_array(size_t n, size_t size);
void urdma_free(void *p);
/* A ring moved to a new zeroed one of ncap elements of sz bytes: the n
 * elements of old (capacity cap, the oldest at index head, taken modulo
 * cap) in order at its start; old is freed.  NULL, old untouched, if out
 * of memory. */
void *urdma_ring_move(void *old, size_t cap, size_t head, size_t n,
		      size_t ncap, size_t sz);

#endif
