// SPDX-License-Identifier: MIT
/*
 * liburdma: messages on a connection.  Receives posted from the pool and
 * re-posted, sending (at once, inline or from a pool buffer, or queued
 * for credits and send-queue room), flushing what waits and granting what
 * is owed, and the completions of both queues.  The credit scheme is
 * described at the top of conn.c, which makes and ends connections.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

/* ---- receives ---- */

static int post_recv(urdma_conn *c, struct api_rrec *r)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)r->buf,
		.length = c->ctx->cfg.buf_size,
		.lkey = r->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = (uintptr_t)r | RECV_TAG,
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	if (ibv_post_recv(c->qp, &wr, &bad))
		return api_errno();
	c->rq_posted++;
	return 0;
}

/* A receive's buffer goes back to the pool; its slot is empty. */
static void rrec_drop(urdma_ctx *ctx, struct api_rrec *r)
{
	api_buf_put(ctx, r->buf);
	r->buf = NULL;
}

/* Post receive r with a fresh pool buffer: a credit to grant.  With the
 * pool empty the connection waits for a buffer to come back (starved). */
static bool recv_fill(urdma_conn *c, struct api_rrec *r)
{
	r->buf = api_buf_get(c->ctx, &r->lkey);
	if (!r->buf) {
		if (list_empty(&c->snode))
			list_add_tail(&c->snode, &c->ctx->starved);
		return false;
	}
	if (post_recv(c, r)) {
		rrec_drop(c->ctx, r);
		return false;
	}
	c->owed++;
	return true;
}

/* c needs no more buffers: the next connection that does has its turn. */
static void unstarve(urdma_conn *c)
{
	urdma_ctx *ctx = c->ctx;

	if (list_empty(&c->snode))
		return;
	list_del(&c->snode);
	if (ctx->nfree && !list_empty(&ctx->starved))
		api_mark_dirty(list_entry(ctx->starved.next, urdma_conn, snode));
}

/* Every receive slot without a buffer (set-up, or starved before). */
void api_refill(urdma_conn *c)
{
	for (uint32_t i = 0; i < c->rq_size && c->rq_posted < c->rq_size; i++)
		if (!c->rrec[i].buf && !recv_fill(c, &c->rrec[i]))
			return;
	unstarve(c);
}

/* ---- sending ---- */

/* A connection's send queue: two WRs per credit (a message, and a write
 * or a read beside it), a power of two as records are indexed by a mask. */
uint32_t api_sq_size(uint32_t depth)
{
	uint32_t sq = 8;

	while (sq < depth * 2)
		sq *= 2;
	return sq;
}

static uint32_t sq_used(const urdma_conn *c)
{
	return c->sq_head - c->sq_tail;
}

int api_post_send(urdma_conn *c, struct ibv_send_wr *wr, void *buf,
		  void *user, uint8_t op, bool event, uint16_t slot)
{
	uint32_t idx = c->sq_head & (c->sq_size - 1);
	struct api_srec *r = &c->srec[idx];
	struct ibv_send_wr *bad;

	/* Signal what must be reported, and now and then, so that the
	 * records (and pool buffers) of unsignaled WRs are given back. */
	if (event || op == OP_READ || op == OP_ATOMIC || op == OP_BYE ||
	    ++c->unsignaled >= c->sq_size / 4 || sq_used(c) + 1 >= c->sq_size) {
		wr->send_flags |= IBV_SEND_SIGNALED;
		c->unsignaled = 0;
	}
	wr->wr_id = (uintptr_t)r;
	*r = (struct api_srec){ .buf = buf, .user = user, .op = op,
				.event = event, .slot = slot, .conn = c };
	if (ibv_post_send(c->qp, wr, &bad))
		return api_errno();
	c->sq_head++;
	return 0;
}

/* A SEND WITH IMMEDIATE of [buf, len), from a pool buffer (lkey; given
 * back when done) or inline (lkey < 0): the credits we owe go with it. */
static int send_msg(urdma_conn *c, void *buf, uint32_t len, int64_t lkey,
		    void *user, uint32_t flags)
{
	bool lent = lkey >= 0;
	uint32_t grant = c->owed > API_IMM_CREDITS ? API_IMM_CREDITS : c->owed;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len };
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_SEND_WITH_IMM,
		.imm_data = htonl(grant | flags),
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
	};
	int ret;

	if (lent)
		sge.lkey = (uint32_t)lkey;
	else
		wr.send_flags = IBV_SEND_INLINE;
	ret = api_post_send(c, &wr, lent ? buf : NULL, user,
			    flags & API_IMM_BYE ? OP_BYE : OP_SEND, user != NULL,
			    0);
	if (!ret) {
		c->owed -= grant;
		c->credits--;
		if (flags & API_IMM_BYE)
			c->bye_sent = true;
	}
	return ret;
}

static bool can_send_data(const urdma_conn *c)
{
	return (c->state == ST_OPEN || c->state == ST_CLOSING) &&
	       c->credits >= 2 && sq_used(c) < c->sq_size;
}

uint32_t api_queued(const urdma_conn *c)
{
	return c->pend_head - c->pend_tail;
}

static int pend_grow(urdma_conn *c)
{
	uint32_t n = api_queued(c), cap = c->pend_cap * 2;
	struct api_pending *p = calloc(cap, sizeof(*p));

	if (!p)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		p[i] = c->pend[(c->pend_tail + i) & (c->pend_cap - 1)];
	free(c->pend);
	c->pend = p;
	c->pend_cap = cap;
	c->pend_tail = 0;
	c->pend_head = n;
	return 0;
}

API_EXPORT int urdma_send(urdma_conn *c, const void *buf, size_t len,
			  void *user)
{
	urdma_ctx *ctx;
	uint32_t lkey;
	uint8_t *held = NULL;
	void *copy;
	bool now;
	int ret = 0;

	if (!c || (len && !buf))
		return -EINVAL;
	ctx = c->ctx;
	api_lock(ctx);
	if (c->state == ST_LISTEN) {
		ret = -EINVAL;
		goto out;
	}
	if (c->state >= ST_CLOSING || c->closed_by_app) {
		ret = c->err ? c->err : -ENOTCONN;
		goto out;
	}
	if (c->bye_rcvd) { /* the peer closed: nobody reads any more */
		ret = -EPIPE;
		goto out;
	}
	if (len > ctx->cfg.buf_size || (c->peer_max && len > c->peer_max)) {
		ret = -EMSGSIZE;
		goto out;
	}
	/* a pool buffer the application holds is lent, not copied */
	held = len ? api_buf_held(ctx, buf, &lkey) : NULL;
	if (held && !*held) {
		ret = -EINVAL; /* a pool buffer it gave back or sent already */
		goto out;
	}
	now = !api_queued(c) && can_send_data(c);
	/* Inline when it fits, a pool buffer too (it is back in the pool at
	 * once): a small message then travels in the WR, and on one host in
	 * the receive entry itself; a larger pool buffer is lent. */
	if (now && (held || len <= c->inline_max)) {
		bool inl = len <= c->inline_max;

		ret = send_msg(c, (void *)buf, (uint32_t)len,
			       inl ? -1 : (int64_t)lkey, user, 0);
		if (!ret && held && inl) {
			*held = 0;
			api_buf_put(ctx, (void *)buf);
			held = NULL;
		}
		goto out;
	}
	/* Copies wait up to queue_depth, and take no buffer while a
	 * connection waits for one to post a receive: the pool stays for
	 * receives, or two sides that flood each other would fill their
	 * pools with sends and grant no credit ever again. */
	if (held) {
		copy = (void *)buf;
	} else {
		copy = (now || c->pend_copies < ctx->cfg.queue_depth) &&
				       list_empty(&ctx->starved) ?
			       api_buf_get(ctx, &lkey) :
			       NULL;
		if (!copy) {
			if (!(c->want_writable & WANT_COPY) ||
			    len < c->want_len)
				c->want_len = (uint32_t)len;
			c->want_writable |= WANT_COPY;
			ret = -EAGAIN;
			goto out;
		}
		memcpy(copy, buf, len);
	}
	if (now) {
		ret = send_msg(c, copy, (uint32_t)len, lkey, user, 0);
		if (ret && !held)
			api_buf_put(ctx, copy);
		goto out;
	}
	if (api_queued(c) == c->pend_cap && pend_grow(c)) {
		if (!held)
			api_buf_put(ctx, copy);
		ret = -ENOMEM;
		goto out;
	}
	/* It goes when what it waits for (credits, send-queue room, the
	 * connection) comes: that marks the connection dirty. */
	c->pend[c->pend_head++ & (c->pend_cap - 1)] = (struct api_pending){
		.buf = copy, .len = (uint32_t)len, .lkey = lkey, .user = user,
		.copy = !held };
	c->pend_copies += !held;
out:
	if (!ret && held)
		*held = 0; /* ours until sent */
	api_unlock(ctx);
	return ret;
}

/* Has what a call that got -EAGAIN waited for come?  A copy needs a pool
 * buffer (and the copies' bound); a message that fits inline needs none
 * once it can go at once; a one-sided operation needs send-queue room. */
static bool writable(const urdma_conn *c)
{
	const urdma_ctx *ctx = c->ctx;
	bool pool = (ctx->nfree || ctx->nbufs < ctx->cfg.buf_count) &&
		    list_empty(&ctx->starved);

	if ((c->want_writable & WANT_COPY) &&
	    ((c->pend_copies < ctx->cfg.queue_depth && pool) ||
	     (c->want_len <= c->inline_max && !api_queued(c) &&
	      can_send_data(c))))
		return true;
	return (c->want_writable & WANT_SQ) && sq_used(c) < c->sq_size &&
	       (c->aslots ? c->aslot_busy < c->aslot_n : pool);
}

/* Send what waits, grant what is owed, say goodbye. */
void api_flush(urdma_conn *c)
{
	urdma_ctx *ctx = c->ctx;

	if (c->state > ST_CLOSING || !c->qp) {
		unstarve(c);
		return;
	}
	api_refill(c);
	/* After the peer's goodbye nothing more goes: it disconnects. */
	if (c->state < ST_OPEN || c->bye_rcvd)
		return;
	while (api_queued(c) && can_send_data(c)) {
		struct api_pending *p =
			&c->pend[c->pend_tail & (c->pend_cap - 1)];

		/* queued before the peer said what it takes */
		if (p->len > c->peer_max) {
			api_conn_fail(c, -EMSGSIZE);
			return;
		}
		if (send_msg(c, p->buf, p->len, p->lkey, p->user, 0)) {
			api_conn_fail(c, -EIO);
			return;
		}
		c->pend_copies -= p->copy;
		c->pend_tail++;
	}
	if (c->want_writable && c->state == ST_OPEN && writable(c) &&
	    !api_push(ctx, URDMA_EV_WRITABLE, 0, c, c->user, NULL, 0, 0))
		c->want_writable = 0;
	if (c->state == ST_CLOSING && !api_queued(c) && !c->bye_sent) {
		if (c->credits >= 1 && sq_used(c) < c->sq_size &&
		    send_msg(c, NULL, 0, -1, NULL, API_IMM_BYE))
			api_conn_disconnect(c);
		return;
	}
	if (c->owed && c->owed >= c->rq_size / 2 && c->credits >= 1 &&
	    sq_used(c) < c->sq_size && !c->bye_sent &&
	    send_msg(c, NULL, 0, -1, NULL, API_IMM_UPDATE))
		api_conn_fail(c, -EIO);
}

void api_flush_dirty(urdma_ctx *ctx)
{
	while (!list_empty(&ctx->dirty)) {
		urdma_conn *c = list_entry(ctx->dirty.next, urdma_conn, dnode);

		list_del(&c->dnode);
		api_flush(c);
	}
}

/* ---- completions ---- */

static void on_recv(urdma_ctx *ctx, struct api_rrec *r, const struct ibv_wc *wc)
{
	urdma_conn *c = r->conn;
	uint32_t imm;

	if (c->state >= ST_DEAD)
		return; /* its buffers went back when it was freed */
	c->rq_posted--;
	if (r == &c->drain_rrec) {
		c->rdrain = false;
		api_drain_check(c);
		return;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		rrec_drop(ctx, r);
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			api_conn_fail(c, api_wc_errno(wc->status));
		return;
	}
	if (!(wc->wc_flags & IBV_WC_WITH_IMM)) {
		rrec_drop(ctx, r);
		api_conn_fail(c, -EPROTO);
		return;
	}
	imm = ntohl(wc->imm_data);
	c->credits += imm & API_IMM_CREDITS;
	if (imm & (API_IMM_UPDATE | API_IMM_BYE)) {
		if (imm & API_IMM_BYE)
			c->bye_rcvd = true;
		if (c->state >= ST_DRAINING || post_recv(c, r))
			rrec_drop(ctx, r);
		else
			c->owed++;
	} else if (api_push(ctx, URDMA_EV_RECV, 0, c, c->user, r->buf,
			    wc->byte_len, 0)) {
		rrec_drop(ctx, r); /* no room to say it: the end */
		api_conn_fail(c, -ENOMEM);
	} else {
		*api_buf_held(ctx, r->buf, NULL) = 1;
		if (c->state <= ST_CLOSING)
			recv_fill(c, r); /* the old buffer is the application's */
		else
			r->buf = NULL;
	}
	api_mark_dirty(c);
}

static void on_send(urdma_ctx *ctx, struct api_srec *r, const struct ibv_wc *wc)
{
	urdma_conn *c = r->conn;
	int err = api_wc_errno(wc->status);
	static const int type[] = {
		[OP_SEND] = URDMA_EV_SEND, [OP_WRITE] = URDMA_EV_WRITE,
		[OP_READ] = URDMA_EV_READ, [OP_ATOMIC] = URDMA_EV_ATOMIC,
	};

	if (c->state >= ST_DEAD)
		return;
	/* RC completes in order: every WR up to this one is done (the drain
	 * WR is the last of all). */
	while (c->sq_tail != c->sq_head) {
		struct api_srec *s = &c->srec[c->sq_tail & (c->sq_size - 1)];

		c->sq_tail++;
		if (s->buf)
			api_buf_put(ctx, s->buf);
		if (s->op == OP_ATOMIC)
			c->aslot_busy--;
		if (s != r)
			continue;
		if (s->event) {
			if (api_push(ctx, type[s->op], err, c, s->user, NULL,
				     wc->byte_len,
				     s->op == OP_ATOMIC && !err ?
					     c->aslots[s->slot] : 0))
				api_conn_fail(c, -ENOMEM);
		} else if (s->op == OP_BYE && !err && c->state == ST_CLOSING)
			api_conn_disconnect(c); /* the goodbye is there */
		break;
	}
	if (r == &c->drain_srec) {
		c->sdrain = false;
		api_drain_check(c);
		return;
	}
	/* (after the peer's goodbye, closed() tells the close from this) */
	if (err && err != -ECANCELED)
		api_conn_fail(c, err);
	api_mark_dirty(c);
}

void api_wc(urdma_ctx *ctx, const struct ibv_wc *wc)
{
	if (wc->wr_id & RECV_TAG)
		on_recv(ctx, (struct api_rrec *)(uintptr_t)(wc->wr_id & ~RECV_TAG),
			wc);
	else
		on_send(ctx, (struct api_srec *)(uintptr_t)wc->wr_id, wc);
}
