// SPDX-License-Identifier: MIT
/*
 * liburdma: the message buffer pool and registered regions.
 *
 * The pool is slabs of buffers of buf_size bytes, each slab one memory
 * region, added as connections need buffers, up to buf_count buffers; a
 * slab is as large as all before it (the first API_SLAB_BUFS), so there
 * are few to search.  Free buffers are a stack of (buffer, lkey).  A
 * buffer returned while a connection lacks receives goes to it (starved:
 * msg.c).
 * A buffer belongs to the library (posted as a receive, or queued or
 * posted as a send) or to the application (urdma_buf_alloc, or a RECV
 * event) until it gives it back (urdma_buf_free) or sends it (urdma_send
 * lends it, zero-copy).
 *
 * Regions (urdma_reg) are memory regions of the application's memory, and
 * what urdma_write/urdma_read may use as their local side.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "api/api.h"

int api_pool_init(urdma_ctx *ctx)
{
	ctx->free_bufs = calloc(ctx->cfg.buf_count, sizeof(*ctx->free_bufs));
	return ctx->free_bufs ? 0 : -ENOMEM;
}

void api_pool_fini(urdma_ctx *ctx)
{
	struct api_slab *s, *n;

	for (s = ctx->slabs; s; s = n) {
		n = s->next;
		ibv_dereg_mr(s->mr);
		munmap(s->base, s->bytes);
		free(s->held);
		free(s);
	}
	ctx->slabs = NULL;
	free(ctx->free_bufs);
	ctx->free_bufs = NULL;
}

static int slab_add(urdma_ctx *ctx)
{
	uint32_t n = ctx->nbufs > API_SLAB_BUFS ? ctx->nbufs : API_SLAB_BUFS;
	size_t bytes;
	struct api_slab *s;

	if (n > ctx->cfg.buf_count - ctx->nbufs)
		n = ctx->cfg.buf_count - ctx->nbufs;
	if (!n)
		return -ENOBUFS;
	bytes = (size_t)n * ctx->cfg.buf_size;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->held = calloc(n, 1);
	s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!s->held || s->base == MAP_FAILED) {
		if (s->base != MAP_FAILED)
			munmap(s->base, bytes);
		free(s->held);
		free(s);
		return -ENOMEM;
	}
	s->mr = ibv_reg_mr(ctx->pd, s->base, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!s->mr) {
		int err = -errno;

		munmap(s->base, bytes);
		free(s->held);
		free(s);
		return err ? err : -ENOMEM;
	}
	s->bytes = bytes;
	s->next = ctx->slabs;
	ctx->slabs = s;
	/* pushed in reverse, so that buffers go out in address order */
	for (uint32_t i = n; i-- > 0;)
		ctx->free_bufs[ctx->nfree++] = (struct api_buf){
			s->base + (size_t)i * ctx->cfg.buf_size, s->mr->lkey };
	ctx->nbufs += n;
	return 0;
}

void *api_buf_get(urdma_ctx *ctx, uint32_t *lkey)
{
	if (!ctx->nfree && slab_add(ctx))
		return NULL;
	ctx->nfree--;
	if (lkey)
		*lkey = ctx->free_bufs[ctx->nfree].lkey;
	return ctx->free_bufs[ctx->nfree].p;
}

static struct api_slab *slab_of(urdma_ctx *ctx, const void *p)
{
	for (struct api_slab *s = ctx->slabs; s; s = s->next)
		if ((const uint8_t *)p >= s->base &&
		    (const uint8_t *)p < s->base + s->bytes)
			return s;
	return NULL;
}

static void buf_push(urdma_ctx *ctx, void *buf, uint32_t lkey)
{
	ctx->free_bufs[ctx->nfree++] = (struct api_buf){ buf, lkey };
	/* the first connection short of receives refills at its flush; it
	 * stays on the list (copies take no buffer) until it is full */
	if (!list_empty(&ctx->starved))
		api_mark_dirty(list_entry(ctx->starved.next, urdma_conn, snode));
}

void api_buf_put(urdma_ctx *ctx, void *buf)
{
	buf_push(ctx, buf, slab_of(ctx, buf)->mr->lkey);
}

uint8_t *api_buf_held(urdma_ctx *ctx, const void *p, uint32_t *lkey)
{
	struct api_slab *s = slab_of(ctx, p);
	size_t off = s ? (size_t)((const uint8_t *)p - s->base) : 1;

	if (!s || off % ctx->cfg.buf_size)
		return NULL;
	if (lkey)
		*lkey = s->mr->lkey;
	return &s->held[off / ctx->cfg.buf_size];
}

static bool mem_holds(const struct urdma_mem *m, uint64_t a, size_t len)
{
	return m && a >= m->addr && a - m->addr <= m->len &&
	       len <= m->len - (a - m->addr);
}

int64_t api_lkey(urdma_ctx *ctx, const void *p, size_t len, bool write)
{
	uint64_t a = (uintptr_t)p;
	struct api_slab *s = slab_of(ctx, p);
	struct urdma_mem *m = ctx->last_mem;

	if (s) {
		uint64_t off = a - (uintptr_t)s->base;
		uint64_t end = (off / ctx->cfg.buf_size + 1) * ctx->cfg.buf_size;

		/* within one buffer: the rest may be another's */
		return len <= end - off ? (int64_t)s->mr->lkey : -EFAULT;
	}
	if (!mem_holds(m, a, len))
		for (m = ctx->mems; m && !mem_holds(m, a, len); m = m->next)
			;
	if (!m)
		return -EFAULT;
	ctx->last_mem = m;
	if (write && !(m->access & IBV_ACCESS_LOCAL_WRITE))
		return -EFAULT;
	return m->mr->lkey;
}

API_EXPORT void *urdma_buf_alloc(urdma_ctx *ctx)
{
	void *b;

	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	api_lock(ctx);
	b = api_buf_get(ctx, NULL);
	if (b)
		*api_buf_held(ctx, b, NULL) = 1;
	api_unlock(ctx);
	if (!b)
		errno = ENOBUFS;
	return b;
}

/* A buffer the application does not hold is left alone: giving one back
 * twice would put it twice on the free stack (and past its end). */
API_EXPORT void urdma_buf_free(urdma_ctx *ctx, void *buf)
{
	uint8_t *held;
	uint32_t lkey;

	if (!ctx || !buf)
		return;
	api_lock(ctx);
	held = api_buf_held(ctx, buf, &lkey);
	if (held && *held) {
		*held = 0;
		buf_push(ctx, buf, lkey);
	} else {
		urdma_info("urdma_buf_free(%p): %s", buf,
			   !held ? "not a pool buffer" :
				   "not the application's (freed "
				   "before, or sent)");
	}
	api_unlock(ctx);
}

API_EXPORT size_t urdma_buf_size(const urdma_ctx *ctx)
{
	return ctx ? ctx->cfg.buf_size : 0;
}

API_EXPORT urdma_mem *urdma_reg(urdma_ctx *ctx, void *addr, size_t len,
				int access, urdma_rmem *desc)
{
	int flags = 0;
	urdma_mem *m;

	if (!ctx || !addr || !len ||
	    (access & ~(URDMA_LOCAL_WRITE | URDMA_REMOTE_READ |
			URDMA_REMOTE_WRITE | URDMA_REMOTE_ATOMIC))) {
		errno = EINVAL;
		return NULL;
	}
	if (access & URDMA_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	if (access & URDMA_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	if (access & URDMA_REMOTE_ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
	if (access & URDMA_LOCAL_WRITE)
		flags |= IBV_ACCESS_LOCAL_WRITE;
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	api_lock(ctx);
	m->mr = ibv_reg_mr(ctx->pd, addr, len, flags);
	if (!m->mr) {
		int err = errno;

		api_unlock(ctx);
		free(m);
		errno = err ? err : EINVAL;
		return NULL;
	}
	m->ctx = ctx;
	m->access = flags;
	m->addr = (uintptr_t)addr;
	m->len = len;
	m->next = ctx->mems;
	ctx->mems = m;
	api_unlock(ctx);
	if (desc)
		*desc = (urdma_rmem){ .addr = (uintptr_t)addr, .len = len,
				      .rkey = m->mr->rkey,
				      .access = (uint32_t)access &
						~(uint32_t)URDMA_LOCAL_WRITE };
	return m;
}

API_EXPORT int urdma_dereg(urdma_mem *mem)
{
	urdma_ctx *ctx;
	int ret = 0;

	if (!mem)
		return -EINVAL;
	ctx = mem->ctx;
	api_lock(ctx);
	for (urdma_mem **p = &ctx->mems; *p; p = &(*p)->next) {
		if (*p != mem)
			continue;
		*p = mem->next;
		break;
	}
	if (ctx->last_mem == mem)
		ctx->last_mem = NULL;
	if (ibv_dereg_mr(mem->mr))
		ret = -errno;
	api_unlock(ctx);
	free(mem);
	return ret;
}
