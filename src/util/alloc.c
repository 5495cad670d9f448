// SPDX-License-Identifier: MIT
/*
 * Page-isolated allocations for the library's own objects (alloc.h).
 *
 * Small objects (up to 4 KiB with the header: a connection's QP and CM id
 * are 1.5-2.5 KiB, and a mapping each cost an mmap and a munmap, with its
 * TLB shoot-down, per connection) come from slabs of 64 KiB mappings, one
 * free list per size class; larger ones get a mapping each.
 * A 64-byte header in front of each object says which: the mapping's
 * length, or 0 and the class.  Slab memory is kept for reuse, never
 * unmapped.
 */
#include "util/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HDR 64
#define SLAB (64 * 1024)

struct hdr {
	size_t map_len; /* 0: a slab slot */
	unsigned int cls;
};

static const size_t slot_size[] = { 128, 256, 512, 1024, 2048, 4096 };
#define NCLS (sizeof(slot_size) / sizeof(slot_size[0]))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *free_slots[NCLS]; /* linked through each slot's first word */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void atfork_child(void)
{
	pthread_mutex_init(&lock, NULL);
}

static void init_once(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

static void *map(size_t len)
{
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return m == MAP_FAILED ? NULL : m;
}

static uint8_t *slot_get(unsigned int c)
{
	uint8_t *s;

	pthread_mutex_lock(&lock);
	if (!free_slots[c]) {
		uint8_t *m = map(SLAB);

		if (!m) {
			pthread_mutex_unlock(&lock);
			return NULL;
		}
		for (size_t off = 0; off + slot_size[c] <= SLAB;
		     off += slot_size[c]) {
			*(void **)(m + off) = free_slots[c];
			free_slots[c] = m + off;
		}
	}
	s = free_slots[c];
	free_slots[c] = *(void **)s;
	pthread_mutex_unlock(&lock);
	memset(s, 0, slot_size[c]);
	return s;
}

void *urdma_zalloc(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), len;
	uint8_t *m;
	struct hdr *h;

	pthread_once(&once, init_once);
	if (size > SIZE_MAX - HDR - page)
		goto nomem;
	for (unsigned int c = 0; c < NCLS; c++) {
		if (size + HDR > slot_size[c])
			continue;
		m = slot_get(c);
		if (!m)
			goto nomem;
		((struct hdr *)m)->cls = c; /* map_len 0: zeroed */
		return m + HDR;
	}
	len = (size + HDR + page - 1) & ~(page - 1);
	m = map(len);
	if (!m)
		goto nomem;
	h = (struct hdr *)m;
	h->map_len = len;
	return m + HDR;
nomem:
	errno = ENOMEM;
	return NULL;
}

void *urdma_zalloc_array(size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size) {
		errno = ENOMEM;
		return NULL;
	}
	return urdma_zalloc(n * size);
}

void *urdma_ring_move(void *old, size_t cap, size_t head, size_t n,
		      size_t ncap, size_t sz)
{
	uint8_t *r = urdma_zalloc_array(ncap, sz);

	if (!r)
		return NULL;
	for (size_t i = 0; i < n; i++)
		memcpy(r + i * sz, (uint8_t *)old + (head + i) % cap * sz, sz);
	urdma_free(old);
	return r;
}

void urdma_free(void *p)
{
	uint8_t *m = p;
	struct hdr *h;

	if (!p)
		return;
	m -= HDR;
	h = (struct hdr *)m;
	if (h->map_len) {
		munmap(m, h->map_len);
		return;
	}
	pthread_mutex_lock(&lock);
	*(void **)m = free_slots[h->cls];
	free_slots[h->cls] = m;
	pthread_mutex_unlock(&lock);
}
