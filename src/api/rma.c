// SPDX-License-Identifier: MIT
/*
 * liburdma: one-sided operations (write, read, compare-and-swap,
 * fetch-and-add) against a peer's region, as its urdma_rmem describes it.
 * Every check is made before anything is posted: the connection is open,
 * the region allows the operation, [off, off+len) lies inside it, the local
 * side is a pool buffer or inside a registered region (a write of at most
 * the connection's inline size may come from anywhere), an atomic's target
 * is 8-byte aligned.  A failure returns an error and posts nothing;
 * -EAGAIN (the send queue or the atomics' result slots are full) is
 * followed by a WRITABLE event when there is room again.
 */
#include <errno.h>
#include <string.h>

#include "api/api.h"

/* No room now: WRITABLE says when there is. */
static int busy(urdma_conn *c)
{
	c->want_writable |= WANT_SQ;
	return -EAGAIN;
}

static int check(urdma_conn *c, const urdma_rmem *rm, uint64_t off,
		 uint64_t len, uint32_t need)
{
	if (!c || !rm)
		return -EINVAL;
	if (c->state != ST_OPEN)
		return c->state == ST_LISTEN ? -EINVAL :
		       c->err		      ? c->err :
		       c->state < ST_OPEN     ? -EAGAIN :
						-ENOTCONN;
	if (c->bye_rcvd) /* the peer closed: it is disconnecting */
		return -EPIPE;
	if (!(rm->access & need))
		return -EACCES;
	if (off > rm->len || len > rm->len - off ||
	    rm->addr + off < rm->addr)
		return -ERANGE;
	return c->sq_head - c->sq_tail < c->sq_size ? 0 : busy(c);
}

static int rdma_op(urdma_conn *c, bool write, void *local, size_t len,
		   const urdma_rmem *rm, uint64_t off, void *user)
{
	urdma_ctx *ctx = c ? c->ctx : NULL;
	struct ibv_sge sge = { .addr = (uintptr_t)local,
			       .length = (uint32_t)len };
	struct ibv_send_wr wr = {
		.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
	};
	int64_t lkey = 0;
	int ret;

	if (!ctx || (len && !local))
		return -EINVAL;
	api_lock(ctx);
	ret = check(c, rm, off, len,
		    write ? URDMA_REMOTE_WRITE : URDMA_REMOTE_READ);
	if (ret)
		goto out;
	if (len > ctx->dattr.max_mr_size || len > UINT32_MAX) {
		ret = -EMSGSIZE;
		goto out;
	}
	if (write && len <= c->inline_max) {
		wr.send_flags = IBV_SEND_INLINE;
	} else if (len) {
		lkey = api_lkey(ctx, local, len, !write);
		if (lkey < 0) {
			ret = (int)lkey;
			goto out;
		}
		sge.lkey = (uint32_t)lkey;
	}
	wr.wr.rdma.remote_addr = rm->addr + off;
	wr.wr.rdma.rkey = rm->rkey;
	/* a write without a user pointer completes silently; a read is
	 * always reported (its data is there only then) */
	ret = api_post_send(c, &wr, NULL, user, write ? OP_WRITE : OP_READ,
			    !write || user, 0);
out:
	api_unlock(ctx);
	return ret;
}

API_EXPORT int urdma_write(urdma_conn *c, const void *local, size_t len,
			   const urdma_rmem *rm, uint64_t off, void *user)
{
	return rdma_op(c, true, (void *)local, len, rm, off, user);
}

API_EXPORT int urdma_read(urdma_conn *c, void *local, size_t len,
			  const urdma_rmem *rm, uint64_t off, void *user)
{
	return rdma_op(c, false, local, len, rm, off, user);
}

API_EXPORT int urdma_atomic(urdma_conn *c, int op, const urdma_rmem *rm,
			    uint64_t off, uint64_t add_or_compare,
			    uint64_t swap, void *user)
{
	urdma_ctx *ctx = c ? c->ctx : NULL;
	struct ibv_sge sge = { .length = 8 };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1 };
	uint32_t slot;
	int ret;

	if (!ctx || (op != URDMA_FADD && op != URDMA_CAS))
		return -EINVAL;
	api_lock(ctx);
	ret = check(c, rm, off, 8, URDMA_REMOTE_ATOMIC);
	if (ret)
		goto out;
	if ((rm->addr + off) % 8) {
		ret = -EINVAL;
		goto out;
	}
	if (ctx->dattr.atomic_cap == IBV_ATOMIC_NONE) {
		ret = -EOPNOTSUPP;
		goto out;
	}
	if (!c->aslots) {
		/* the results land in one pool buffer of the connection */
		c->aslots = api_buf_get(ctx, &c->aslot_lkey);
		if (!c->aslots) {
			ret = busy(c);
			goto out;
		}
		c->aslot_n = ctx->cfg.buf_size / 8;
		if (c->aslot_n > c->sq_size)
			c->aslot_n = c->sq_size;
	}
	if (c->aslot_busy == c->aslot_n) {
		ret = busy(c);
		goto out;
	}
	/* results come back in order: a ring */
	slot = c->aslot_next++ % c->aslot_n;
	sge.addr = (uintptr_t)&c->aslots[slot];
	sge.lkey = c->aslot_lkey;
	wr.opcode = op == URDMA_FADD ? IBV_WR_ATOMIC_FETCH_AND_ADD :
				       IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.remote_addr = rm->addr + off;
	wr.wr.atomic.rkey = rm->rkey;
	wr.wr.atomic.compare_add = add_or_compare;
	wr.wr.atomic.swap = swap;
	ret = api_post_send(c, &wr, NULL, user, OP_ATOMIC, true,
			    (uint16_t)slot);
	if (!ret)
		c->aslot_busy++;
	else
		c->aslot_next--;
out:
	api_unlock(ctx);
	return ret;
}
