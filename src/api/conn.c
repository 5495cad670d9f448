// SPDX-License-Identifier: MIT
/*
 * liburdma: connections.  Listening and connecting by "host:port" on
 * asynchronous rdma_cm ids, the queue pair of each connection, and
 * closing; its messages are msg.c's.
 *
 * Credits: each side keeps queue_depth receives posted (pool buffers) and
 * tells the peer how many in its hello.  A message consumes one; its
 * receiver re-posts a receive as soon as urdma_poll takes the message (with
 * a fresh pool buffer: the old one is the application's now) and grants it
 * back in the immediate data of its next message, or in a credit update
 * (a message with nothing for the application) once half the depth is
 * owed.  A sender never sends without a credit, so no message ever meets
 * a receive queue that is empty (no RNR, no retry).  Data needs two
 * credits: the last one is kept for a credit update or the goodbye, so the
 * two sides can never both wait for credits.  Messages beyond the credits
 * or the send queue wait in a software queue, in pool buffers: lent ones
 * (the application's already), and copies up to queue_depth per
 * connection, so that the rest of the pool stays for receives.  Beyond
 * that (or with the pool empty) urdma_send says -EAGAIN, and a WRITABLE
 * event follows when it may try again.  A receiver whose pool is empty
 * re-posts no receive, so it grants no credit: back-pressure.
 *
 * Closing: urdma_close sends what is queued, then a goodbye (BYE), and
 * disconnects once the goodbye has completed; the peer's CLOSED then says
 * 0, an orderly close.  A disconnect without a goodbye (the peer's process
 * died, or the network failed) gives -ECONNRESET.  Either way the QP goes
 * to ERR, a drain WR is posted in each queue, and CLOSED is reported when
 * both have completed: no completion can refer to the connection after.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

/* A deadline ms from now (the connect or the op timeout). */
static void timed_in(urdma_conn *c, int ms)
{
	c->deadline_ns = urdma_now_ns() + (uint64_t)ms * 1000000ull;
	if (list_empty(&c->tnode))
		list_add_tail(&c->tnode, &c->ctx->timed);
}

static void timed_del(urdma_conn *c)
{
	list_del(&c->tnode);
}

void api_mark_dirty(urdma_conn *c)
{
	if (list_empty(&c->dnode))
		list_add_tail(&c->dnode, &c->ctx->dirty);
}

static urdma_conn *conn_new(urdma_ctx *ctx, void *user)
{
	urdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	/* sends may be queued before the connection is made */
	c->pend_cap = 16; /* grows: the pool bounds what may wait */
	c->pend = calloc(c->pend_cap, sizeof(*c->pend));
	if (!c->pend || api_evq_reserve(ctx)) {
		free(c->pend);
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->ctx = ctx;
	c->user = user;
	list_init(&c->tnode);
	list_init(&c->dnode);
	list_init(&c->rnode);
	list_init(&c->snode);
	list_init(&c->anode);
	list_add_tail(&c->node, &ctx->conns);
	return c;
}

/* Split "host:port", "[v6]:port", ":port" or "port" and look it up. */
static int resolve(const char *hostport, bool passive, struct addrinfo **res)
{
	char host[256];
	const char *colon, *port, *h = host;
	struct addrinfo hints = {
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0),
	};
	size_t hl;

	if (!hostport)
		return -EINVAL;
	colon = strrchr(hostport, ':');
	if (!colon) {
		port = hostport;
		h = NULL;
	} else {
		port = colon + 1;
		hl = (size_t)(colon - hostport);
		if (hl && hostport[0] == '[' && hostport[hl - 1] == ']') {
			hostport++;
			hl -= 2;
		}
		if (hl >= sizeof(host))
			return -EINVAL;
		memcpy(host, hostport, hl);
		host[hl] = 0;
		if (!hl)
			h = NULL;
	}
	if (!*port || strspn(port, "0123456789") != strlen(port) ||
	    atol(port) > 65535)
		return -EINVAL;
	if (!h && !passive)
		h = "localhost";
	switch (getaddrinfo(h, port, &hints, res)) {
	case 0:
		return 0;
	case EAI_MEMORY:
		return -ENOMEM;
	case EAI_SYSTEM:
		return errno ? -errno : -EIO;
	default:
		return -EHOSTUNREACH;
	}
}

static void hello_make(urdma_conn *c, uint8_t *out, uint8_t *len,
		       uint32_t credits)
{
	struct api_hello h = {
		.magic = htons(API_MAGIC),
		.version = API_VERSION,
		.hello_len = c->hello_len,
		.credits = htonl(credits),
		.max_msg = htonl(c->ctx->cfg.buf_size),
	};

	memcpy(out, &h, sizeof(h));
	memcpy(out + sizeof(h), c->hello, c->hello_len);
	*len = (uint8_t)(sizeof(h) + c->hello_len);
}

/* The peer's hello from CM private data: its credits and largest
 * message; -EPROTO if it is not a liburdma peer. */
static int hello_take(urdma_conn *c, const void *pd, uint8_t len)
{
	struct api_hello h;

	if (!pd || len < sizeof(h))
		return -EPROTO;
	memcpy(&h, pd, sizeof(h));
	if (ntohs(h.magic) != API_MAGIC || h.version != API_VERSION ||
	    h.hello_len > URDMA_HELLO_MAX ||
	    sizeof(h) + h.hello_len > len || !ntohl(h.credits) ||
	    !ntohl(h.max_msg))
		return -EPROTO;
	c->credits = ntohl(h.credits);
	c->peer_max = ntohl(h.max_msg);
	memcpy(c->peer_hello, (const uint8_t *)pd + sizeof(h), h.hello_len);
	c->peer_hello_len = h.hello_len;
	return 0;
}

static int set_hello(urdma_conn *c, const void *hello, size_t len)
{
	if (len > URDMA_HELLO_MAX || (len && !hello))
		return -EINVAL;
	if (len)
		memcpy(c->hello, hello, len);
	c->hello_len = (uint8_t)len;
	return 0;
}

/* ---- the queue pair ---- */

static uint8_t ack_timeout(int op_ms)
{
	/* 4.096 us * 2^t per try, 8 tries (retry_count 7) */
	uint64_t per_try_us = (uint64_t)op_ms * 1000 / 8;
	uint8_t t = 1;

	while (t < 31 && 4ull << t < per_try_us)
		t++;
	return t;
}

/* The QP, the records and every receive posted: the credits we give. */
static int qp_setup(urdma_conn *c, struct rdma_cm_id *id)
{
	urdma_ctx *ctx = c->ctx;
	uint32_t depth = ctx->cfg.queue_depth, sq = api_sq_size(depth);
	struct ibv_qp_init_attr a = {
		.send_cq = ctx->cq,
		.recv_cq = ctx->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_recv_wr = depth + 1,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = ctx->cfg.inline_max },
	};
	uint8_t to = ack_timeout(ctx->cfg.op_timeout_ms);
	int ret;

	if (id->verbs != ctx->verbs)
		return -EXDEV; /* another device than the context's */
	a.cap.max_send_wr = sq + 1; /* + the drain WR */
	ret = api_cq_grow(ctx, (int)(depth * 3 + 2));
	if (ret)
		return ret;
	rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &to,
			sizeof(to));
	ret = rdma_create_qp(id, ctx->pd, &a) ? api_errno() : 0;
	if (ret == -EINVAL && a.cap.max_inline_data) {
		/* a device that refuses this much inline data: none (one
		 * that takes less says how much in a.cap, used below) */
		a.cap.max_inline_data = 0;
		ret = rdma_create_qp(id, ctx->pd, &a) ? api_errno() : 0;
	}
	if (ret) {
		api_cq_grow(ctx, -(int)(depth * 3 + 2));
		return ret;
	}
	c->id = id;
	c->qp = id->qp;
	c->sq_size = sq;
	c->rq_size = depth;
	c->inline_max = a.cap.max_inline_data < ctx->cfg.inline_max ?
				a.cap.max_inline_data : ctx->cfg.inline_max;
	c->srec = calloc(c->sq_size, sizeof(*c->srec));
	c->rrec = calloc(c->rq_size, sizeof(*c->rrec));
	if (!c->srec || !c->rrec)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->rq_size; i++)
		c->rrec[i].conn = c;
	api_refill(c);
	c->owed = 0; /* the first receives are the hello's credits */
	c->drain_rrec.conn = c;
	c->drain_srec = (struct api_srec){ .conn = c, .op = OP_DRAIN };
	return c->rq_posted ? 0 : -ENOBUFS;
}

static void conn_params(urdma_conn *c, struct rdma_conn_param *p,
			uint8_t *pd)
{
	uint8_t len;

	hello_make(c, pd, &len, c->rq_posted);
	*p = (struct rdma_conn_param){
		.private_data = pd,
		.private_data_len = len,
		.responder_resources =
			(uint8_t)(c->ctx->dattr.max_qp_rd_atom > 255 ? 255 :
				  c->ctx->dattr.max_qp_rd_atom),
		.initiator_depth =
			(uint8_t)(c->ctx->dattr.max_qp_init_rd_atom > 255 ? 255 :
				  c->ctx->dattr.max_qp_init_rd_atom),
		.retry_count = 7,
		.rnr_retry_count = 7,
	};
}

/* ---- the end of a connection ---- */

static void closed(urdma_conn *c)
{
	urdma_ctx *ctx = c->ctx;

	timed_del(c);
	if (!c->err && c->peer_gone && !c->bye_rcvd && !c->bye_sent)
		c->err = -ECONNRESET; /* no goodbye: it died */
	/* The peer said goodbye: a send of ours that met its QP going away
	 * (a reset, no answer) is the close, not an error. */
	if (c->bye_rcvd && (c->err == -ETIMEDOUT || c->err == -ECONNRESET ||
			    c->err == -EIO))
		c->err = 0;
	c->state = ST_DEAD;
	api_push(ctx, URDMA_EV_CLOSED, c->err, c, c->user, NULL, 0, 0);
}

void api_drain_check(urdma_conn *c)
{
	if (c->state == ST_DRAINING && !c->sdrain && !c->rdrain)
		closed(c);
}

/* QP to ERR and a drain WR in each queue: when both have completed, no
 * completion can refer to the connection any more. */
void api_conn_disconnect(urdma_conn *c)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	if (c->state >= ST_DRAINING)
		return;
	c->state = ST_DRAINING;
	if (!c->qp) {
		closed(c);
		return;
	}
	rdma_disconnect(c->id);
	ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
	{
		struct ibv_recv_wr rw = { .wr_id = (uintptr_t)&c->drain_rrec |
						   RECV_TAG },
				   *rbad;
		struct ibv_send_wr sw = { .wr_id = (uintptr_t)&c->drain_srec,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED },
				   *sbad;

		c->rdrain = !ibv_post_recv(c->qp, &rw, &rbad);
		c->sdrain = !ibv_post_send(c->qp, &sw, &sbad);
	}
	/* A provider that refuses WRs in ERR: give it the op timeout. */
	timed_in(c, c->ctx->cfg.op_timeout_ms);
	api_drain_check(c);
}

void api_conn_fail(urdma_conn *c, int err)
{
	if (c->state >= ST_DRAINING)
		return;
	if (!c->err)
		c->err = err;
	urdma_info("connection %p: %s", (void *)c, strerror(-err));
	api_conn_disconnect(c);
}

void api_conn_free(urdma_conn *c)
{
	urdma_ctx *ctx = c->ctx;

	api_evq_release(ctx);
	timed_del(c);
	list_del(&c->dnode);
	list_del(&c->rnode);
	list_del(&c->snode);
	list_del(&c->anode);
	list_del(&c->node);
	if (c->qp) {
		rdma_destroy_qp(c->id);
		api_cq_grow(ctx, -(int)(ctx->cfg.queue_depth * 3 + 2));
	}
	/* Completions of a QP whose drain never came back may still be in
	 * the CQ: the records they point to must stay. */
	bool keep = c->qp && (c->sdrain || c->rdrain) && ctx->cq;
	if (c->id)
		rdma_destroy_id(c->id);
	for (uint32_t i = 0; c->rrec && i < c->rq_size; i++)
		if (c->rrec[i].buf)
			api_buf_put(ctx, c->rrec[i].buf);
	for (; c->srec && c->sq_tail != c->sq_head; c->sq_tail++) {
		struct api_srec *r = &c->srec[c->sq_tail & (c->sq_size - 1)];

		if (r->buf)
			api_buf_put(ctx, r->buf);
	}
	for (; c->pend && api_queued(c); c->pend_tail++)
		api_buf_put(ctx, c->pend[c->pend_tail & (c->pend_cap - 1)].buf);
	if (c->aslots)
		api_buf_put(ctx, c->aslots);
	free(c->pend);
	if (keep) {
		c->state = ST_ZOMBIE;
		list_add_tail(&c->node, &ctx->zombies);
		return; /* srec and rrec stay too (ctx.c frees them) */
	}
	free(c->srec);
	free(c->rrec);
	free(c);
}

void api_reap(urdma_ctx *ctx)
{
	while (!list_empty(&ctx->dead))
		api_conn_free(list_entry(ctx->dead.next, urdma_conn, rnode));
}

static void close_locked(urdma_conn *c)
{
	urdma_ctx *ctx = c->ctx;

	if (c->closed_by_app || c->state >= ST_CLOSING) {
		c->closed_by_app = true;
		return;
	}
	c->closed_by_app = true;
	switch (c->state) {
	case ST_LISTEN:
		rdma_destroy_id(c->id);
		c->id = NULL;
		closed(c);
		break;
	case ST_OPEN:
		c->state = ST_CLOSING;
		timed_in(c, ctx->cfg.op_timeout_ms);
		api_timer_update(ctx);
		api_flush(c); /* what is queued, then the goodbye */
		break;
	case ST_ACCEPTING:
		rdma_reject(c->id, NULL, 0);
		/* fall through */
	default: /* still connecting */
		api_conn_fail(c, -ECANCELED);
		break;
	}
}

API_EXPORT void urdma_close(urdma_conn *c)
{
	if (!c)
		return;
	api_lock(c->ctx);
	close_locked(c);
	api_unlock(c->ctx);
}

/* urdma_ctx_destroy: every connection closes as urdma_close does; true
 * while some are still sending what was queued, or their goodbye. */
bool api_close_all(urdma_ctx *ctx)
{
	urdma_conn *c, *n;
	bool closing = false;

	list_for_each_entry_safe(c, n, &ctx->conns, node) {
		close_locked(c);
		closing |= c->state == ST_CLOSING;
	}
	return closing;
}

void api_expire(urdma_ctx *ctx, uint64_t now)
{
	urdma_conn *c, *n;

	list_for_each_entry_safe(c, n, &ctx->timed, tnode) {
		if (c->deadline_ns > now)
			continue;
		timed_del(c);
		switch (c->state) {
		case ST_DRAINING: /* the drain WRs never came back */
			closed(c);
			break;
		case ST_CLOSING:
			api_conn_disconnect(c);
			break;
		case ST_OPEN:
		case ST_LISTEN:
		case ST_DEAD:
			break;
		default:
			api_conn_fail(c, -ETIMEDOUT);
			break;
		}
	}
}

/* ---- listening and connecting ---- */

/* A listener (passive) or an outgoing connection, on its way: the id
 * listens, or resolves the address (the CM events take it from there). */
static urdma_conn *conn_open(urdma_ctx *ctx, const char *hostport,
			     const void *hello, size_t len, void *user,
			     bool passive)
{
	struct addrinfo *ai = NULL;
	struct rdma_cm_id *id = NULL;
	urdma_conn *c;
	int ret;

	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	api_lock(ctx);
	c = conn_new(ctx, user);
	if (!c) {
		ret = -ENOMEM;
		goto fail;
	}
	c->state = passive ? ST_LISTEN : ST_RESOLVING;
	ret = set_hello(c, hello, len);
	if (!ret)
		ret = resolve(hostport, passive, &ai);
	if (ret)
		goto fail;
	if (rdma_create_id(ctx->cm, &id, c, RDMA_PS_TCP) ||
	    (passive ? rdma_bind_addr(id, ai->ai_addr) ||
			       rdma_listen(id, 1024) :
		       rdma_resolve_addr(id, NULL, ai->ai_addr,
					 ctx->cfg.connect_timeout_ms))) {
		ret = api_errno();
		goto fail;
	}
	c->id = id;
	freeaddrinfo(ai);
	if (!passive) {
		timed_in(c, ctx->cfg.connect_timeout_ms);
		api_timer_update(ctx);
	}
	api_unlock(ctx);
	return c;
fail:
	if (id)
		rdma_destroy_id(id);
	if (ai)
		freeaddrinfo(ai);
	if (c)
		api_conn_free(c);
	api_unlock(ctx);
	urdma_info("%s %s: %s", passive ? "listen on" : "connect to",
		   hostport ? hostport : "(null)", strerror(-ret));
	errno = -ret;
	return NULL;
}

API_EXPORT urdma_conn *urdma_listen(urdma_ctx *ctx, const char *hostport,
				    const void *hello, size_t len, void *user)
{
	return conn_open(ctx, hostport, hello, len, user, true);
}

API_EXPORT urdma_conn *urdma_connect(urdma_ctx *ctx, const char *hostport,
				     const void *hello, size_t len, void *user)
{
	return conn_open(ctx, hostport, hello, len, user, false);
}

API_EXPORT void urdma_set_user(urdma_conn *c, void *user)
{
	if (!c)
		return;
	api_lock(c->ctx);
	c->user = user;
	api_unlock(c->ctx);
}

API_EXPORT void *urdma_user(const urdma_conn *c)
{
	void *user;

	if (!c)
		return NULL;
	api_lock(c->ctx);
	user = c->user;
	api_unlock(c->ctx);
	return user;
}

API_EXPORT int urdma_conn_port(const urdma_conn *c)
{
	if (!c || !c->id)
		return -EINVAL;
	return ntohs(c->state == ST_LISTEN ? rdma_get_src_port(c->id) :
					     rdma_get_dst_port(c->id));
}

/* A request on a listener: a connection, reported, accepted at the next
 * urdma_poll unless the application closes it first. */
static void on_request(urdma_conn *lis, struct rdma_cm_event *ev)
{
	urdma_ctx *ctx = lis->ctx;
	urdma_conn *c = conn_new(ctx, lis->user);
	int ret;

	if (!c) {
		rdma_reject(ev->id, NULL, 0);
		rdma_destroy_id(ev->id);
		return;
	}
	ev->id->context = c;
	c->state = ST_ACCEPTING;
	memcpy(c->hello, lis->hello, lis->hello_len);
	c->hello_len = lis->hello_len;
	ret = hello_take(c, ev->param.conn.private_data,
			 ev->param.conn.private_data_len);
	if (!ret)
		ret = qp_setup(c, ev->id);
	if (ret) {
		urdma_info("refusing a connection: %s", strerror(-ret));
		rdma_reject(ev->id, NULL, 0);
		if (!c->id)
			rdma_destroy_id(ev->id);
		api_conn_free(c);
		return;
	}
	timed_in(c, ctx->cfg.connect_timeout_ms);
	list_add_tail(&c->anode, &ctx->accepting);
	api_push(ctx, URDMA_EV_ACCEPTED, 0, c, c->user, c->peer_hello,
		 c->peer_hello_len, 0);
	api_kick(ctx); /* the next urdma_poll accepts it */
}

void api_accept_pending(urdma_ctx *ctx)
{
	while (!list_empty(&ctx->accepting)) {
		urdma_conn *c = list_entry(ctx->accepting.next, urdma_conn,
					   anode);
		struct rdma_conn_param p;
		uint8_t pd[sizeof(struct api_hello) + URDMA_HELLO_MAX];

		list_del(&c->anode);
		if (c->state != ST_ACCEPTING)
			continue; /* closed by the application first */
		conn_params(c, &p, pd);
		if (rdma_accept(c->id, &p))
			api_conn_fail(c, api_errno());
		else
			c->state = ST_ACCEPT_SENT;
	}
}

static void open_conn(urdma_conn *c, int type)
{
	struct ibv_qp_attr a = {
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				   IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};

	timed_del(c);
	c->state = ST_OPEN;
	/* rdma_cm leaves atomics off on some devices */
	ibv_modify_qp(c->qp, &a, IBV_QP_ACCESS_FLAGS);
	if (type)
		api_push(c->ctx, type, 0, c, c->user, c->peer_hello,
			 c->peer_hello_len, 0);
	api_mark_dirty(c);
}

static void on_event(urdma_ctx *ctx, struct rdma_cm_event *ev)
{
	urdma_conn *c = ev->id->context;
	struct rdma_conn_param p;
	uint8_t pd[sizeof(struct api_hello) + URDMA_HELLO_MAX];
	int ret;

	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		on_request(ev->listen_id->context, ev);
		return;
	}
	if (!c || c->state >= ST_DEAD)
		return;
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(c->id, ctx->cfg.connect_timeout_ms))
			api_conn_fail(c, api_errno());
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		ret = qp_setup(c, c->id);
		if (!ret) {
			conn_params(c, &p, pd);
			if (rdma_connect(c->id, &p))
				ret = api_errno();
		}
		if (ret)
			api_conn_fail(c, ret);
		else
			c->state = ST_CONNECTING;
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->state == ST_CONNECTING) {
			ret = hello_take(c, ev->param.conn.private_data,
					 ev->param.conn.private_data_len);
			if (ret)
				api_conn_fail(c, ret);
			else
				open_conn(c, URDMA_EV_CONNECTED);
		} else if (c->state == ST_ACCEPT_SENT) {
			open_conn(c, 0);
		}
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		api_conn_fail(c, ev->status < 0 ? ev->status : -EHOSTUNREACH);
		break;
	case RDMA_CM_EVENT_REJECTED:
		api_conn_fail(c, -ECONNREFUSED);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		api_conn_fail(c, ev->status < 0 ? ev->status : -ECONNRESET);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		/* A reset unless a goodbye comes: it may still be in the CQ,
		 * before the flushes (closed() decides). */
		c->peer_gone = true;
		api_conn_disconnect(c);
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		api_conn_fail(c, -ENODEV);
		break;
	default:
		break;
	}
}

void api_cm_events(urdma_ctx *ctx)
{
	struct rdma_cm_event *ev;

	while (!rdma_get_cm_event(ctx->cm, &ev)) {
		struct rdma_cm_event copy = *ev;
		uint8_t pd[256];

		/* Acknowledged before it is acted on (destroying an id
		 * waits for its events to be acknowledged): the private
		 * data is copied first. */
		if (ev->param.conn.private_data &&
		    (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
		     ev->event == RDMA_CM_EVENT_ESTABLISHED)) {
			memcpy(pd, ev->param.conn.private_data,
			       ev->param.conn.private_data_len);
			copy.param.conn.private_data = pd;
		}
		rdma_ack_cm_event(ev);
		on_event(ctx, &copy);
	}
}

