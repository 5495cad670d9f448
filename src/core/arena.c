// SPDX-License-Identifier: MIT
/*
 * Shared blocks of this process: each QP's shared header and receive ring.
 *
 * They live in the identity memfd like registered memory (file offset ==
 * address, core/backing.c), so a peer that has the memfd reaches them
 * through the 1 GiB windows it maps anyway: no file, fd or mapping per QP,
 * and nothing a peer can resize under us (the memfd is sealed).  Chunks of
 * 64 MiB of address space, aligned, so a block never crosses a peer's
 * window; pages handed out first-fit.  A freed block starts the next one
 * there zeroed: a small one (up to KEEP_MAX) is zeroed in place and its
 * pages kept, up to KEEP_PAGES of them (punching a page out costs a TLB
 * shoot-down in every process that maps it, and the next block there a
 * page fault in each); the others are punched out of the memfd.  A block
 * that a stalled peer may still write into is quarantined: punched, never
 * reused.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"
#include "util/rawmm.h"

#define CHUNK_SHIFT 26
#define CHUNK_SIZE (1ull << CHUNK_SHIFT)
#define PAGE_SHIFT 12
#define CHUNK_PAGES (CHUNK_SIZE >> PAGE_SHIFT)
#define MAX_CHUNKS 1024 /* 64 GiB of shared blocks */
#define KEEP_MAX (64u << 10)
#define KEEP_PAGES 4096 /* 16 MiB */

static_assert(CHUNK_SHIFT <= URDMA_WIN_SHIFT, "a chunk stays in one window");

struct chunk {
	uint8_t *base; /* == its offset in the memfd */
	uint64_t used[CHUNK_PAGES / 64];
	uint64_t kept[CHUNK_PAGES / 64]; /* free, zeroed, still backed */
};

static struct {
	pthread_mutex_t lock;
	struct chunk *c[MAX_CHUNKS];
	int n;
	uint64_t kept; /* pages, of all chunks */
} A = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool page_used(const struct chunk *c, uint64_t p)
{
	return c->used[p / 64] >> (p % 64) & 1;
}

/* Mark pages [p, p + n) used or free; kept: free ones keep their memory.
 * A page taken stops being kept.  Under A.lock. */
static void pages_mark(struct chunk *c, uint64_t p, uint64_t n, bool used,
		       bool kept)
{
	for (uint64_t i = p; i < p + n; i++) {
		uint64_t bit = 1ull << (i % 64);

		if (c->kept[i / 64] & bit)
			A.kept--;
		c->kept[i / 64] &= ~bit;
		if (used)
			c->used[i / 64] |= bit;
		else
			c->used[i / 64] &= ~bit;
		if (kept) {
			c->kept[i / 64] |= bit;
			A.kept++;
		}
	}
}

/* First run of n free pages in c, or -1. */
static int64_t chunk_find(const struct chunk *c, uint64_t n)
{
	uint64_t run = 0;

	for (uint64_t p = 0; p < CHUNK_PAGES; p++) {
		if (p % 64 == 0 && c->used[p / 64] == ~0ull) {
			run = 0;
			p += 63; /* a full word */
			continue;
		}
		if (page_used(c, p)) {
			run = 0;
			continue;
		}
		if (++run == n)
			return (int64_t)(p + 1 - n);
	}
	return -1;
}

/* A new chunk: aligned address space, the memfd mapped over it at its own
 * address.  Under A.lock. */
static struct chunk *chunk_new(int memfd)
{
	struct chunk *c;
	uint8_t *r, *base;

	if (A.n == MAX_CHUNKS)
		return NULL;
	c = urdma_zalloc(sizeof(*c));
	if (!c)
		return NULL;
	r = mmap(NULL, 2 * CHUNK_SIZE, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r == MAP_FAILED)
		goto err_free;
	base = (uint8_t *)(((uintptr_t)r + CHUNK_SIZE - 1) & ~(CHUNK_SIZE - 1));
	if (base > r)
		munmap(r, base - r);
	munmap(base + CHUNK_SIZE, r + 2 * CHUNK_SIZE - (base + CHUNK_SIZE));
	if ((uintptr_t)base >> URDMA_VA_BITS ||
	    mmap(base, CHUNK_SIZE, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_FIXED, memfd, (off_t)(uintptr_t)base) !=
		    base) {
		munmap(base, CHUNK_SIZE);
		goto err_free;
	}
	c->base = base;
	A.c[A.n++] = c;
	return c;
err_free:
	urdma_free(c);
	return NULL;
}

void *urdma_arena_alloc(size_t size, uint64_t *va)
{
	uint64_t n = (size + (1u << PAGE_SHIFT) - 1) >> PAGE_SHIFT;
	int memfd = urdma_memfd();
	void *p = NULL;

	if (memfd < 0) {
		errno = -memfd;
		return NULL;
	}
	if (!n || n > CHUNK_PAGES) {
		errno = EINVAL;
		return NULL;
	}
	pthread_mutex_lock(&A.lock);
	for (int i = 0; i <= A.n && !p; i++) {
		struct chunk *c = i < A.n ? A.c[i] : chunk_new(memfd);
		int64_t at;

		if (!c)
			break;
		at = chunk_find(c, n);
		if (at < 0)
			continue;
		pages_mark(c, at, n, true, false);
		p = c->base + ((uint64_t)at << PAGE_SHIFT);
	}
	pthread_mutex_unlock(&A.lock);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	*va = (uintptr_t)p;
	return p;
}

void urdma_arena_free(void *p, size_t size, bool quarantine)
{
	uint64_t n = (size + (1u << PAGE_SHIFT) - 1) >> PAGE_SHIFT;
	uint8_t *b = p;
	bool keep;

	if (!p)
		return;
	/* Zero it, so that the next block here starts clean: in place, or
	 * the memory goes (not under the lock). */
	pthread_mutex_lock(&A.lock);
	keep = !quarantine && n << PAGE_SHIFT <= KEEP_MAX &&
	       A.kept + n <= KEEP_PAGES;
	if (keep) {
		memset(b, 0, n << PAGE_SHIFT);
	} else {
		pthread_mutex_unlock(&A.lock);
		if (fallocate(urdma_proc.memfd,
			      FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)(uintptr_t)b, (off_t)(n << PAGE_SHIFT)))
			memset(b, 0, n << PAGE_SHIFT);
		if (quarantine)
			return;
		pthread_mutex_lock(&A.lock);
	}
	for (int i = 0; i < A.n; i++) {
		struct chunk *c = A.c[i];

		if (b >= c->base && b < c->base + CHUNK_SIZE) {
			pages_mark(c, (uint64_t)(b - c->base) >> PAGE_SHIFT, n,
				   false, keep);
			break;
		}
	}
	pthread_mutex_unlock(&A.lock);
}

/* The lock word of atomics on direct MRs (shared.h): the first word of
 * a block made on first use.  Its memfd offset, or 0. */
static _Atomic uint64_t lock_va;

uint64_t urdma_arena_lock(void)
{
	static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
	uint64_t va = atomic_load(&lock_va);

	if (va)
		return va;
	pthread_mutex_lock(&once);
	va = atomic_load(&lock_va);
	if (!va && urdma_arena_alloc(4096, &va))
		atomic_store(&lock_va, va);
	pthread_mutex_unlock(&once);
	return va;
}

/* In a forked child the QPs, and so the blocks, are the parent's: the
 * chunks go before backing.c's fork handler would copy them (it calls
 * this first).  A bare munmap (util/rawmm.h). */
void urdma_arena_atfork_child(void)
{
	for (int i = 0; i < A.n; i++)
		raw_munmap(A.c[i]->base, CHUNK_SIZE);
	memset(&A, 0, sizeof(A));
	pthread_mutex_init(&A.lock, NULL);
	atomic_store(&lock_va, 0);
	urdma_wake_atfork_child();
}
