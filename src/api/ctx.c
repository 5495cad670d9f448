// SPDX-License-Identifier: MIT
/*
 * liburdma: contexts, the context's file descriptor, urdma_poll and the
 * event queue, the completion queue.
 *
 * The fd is an epoll set over the CQ's completion channel, the CM event
 * channel, an eventfd (set while events wait in our queue, so that a
 * level-triggered loop never strands them) and a timerfd (connect and
 * close deadlines).  urdma_poll makes all the progress there is (CM
 * events, completions, credits, queued sends, deadlines), then hands out
 * events.
 *
 * Arming: a completion on an armed CQ costs its sender a wake-up (a system
 * call) and us the channel's read, so the CQ is armed only when someone is
 * to sleep on the fd: a blocking call about to sleep, and any call on its
 * way out once the application has asked for the fd (urdma_ctx_fd).  Each
 * arm is followed by one more look at the CQ, so no completion is missed.
 * A blocking call first polls the CQ for up to spin_us, so a peer that
 * answers within it costs no system call on either side.  Adaptive: after
 * eight waits in a row that each took over SPIN_LONG_NS, it sleeps at once,
 * until a sleep ends within that or a probe spin (one wait in 16, then
 * ever fewer) meets its event.  With spin_us left at 0 the spin also
 * stretches to waits that outlast 30 us, up to SPIN_AUTO_MAX_NS: one and a
 * half times the recent waits that slept (spin_learn).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"

#define DEF_QUEUE_DEPTH 64
#define DEF_BUF_SIZE 8192
#define DEF_BUF_COUNT 16384
#define DEF_INLINE 128
#define DEF_CONNECT_MS 5000
#define DEF_OP_MS 2000
#define CQ_BATCH 32
#define CQ_PER_POLL 512 /* completions one urdma_poll takes at most */
#define DEF_SPIN_US 30
#define SPIN_MISSES 8	/* waits in a row over SPIN_LONG_NS: sleep at once */
/* A wait longer than this is a miss: shorter ones still gain from the
 * spin (it keeps the stream polled), even when they outlast it. */
#define SPIN_LONG_NS 1000000ull
#define PROBE_MIN 16	/* then one wait in this many spins anyway, */
#define PROBE_MAX 1024	/* one in twice as many after each that missed */
#define FD_LOOK_NS 50000ull /* see progress() */
/* The longest spin_auto stretches a spin to.  A 64 KiB echo over TCP
 * takes 50-60 us a round trip here: each wait outlasted the fixed 30 us,
 * then slept, and its wake-up (the progress thread receiving, an eventfd
 * write, epoll_wait) came on top, on both sides. */
#define SPIN_AUTO_MAX_NS 250000ull

static int cfg_check(urdma_cfg *c)
{
	for (size_t i = 0; i < sizeof(c->reserved) / sizeof(c->reserved[0]); i++)
		if (c->reserved[i])
			return -EINVAL;
	if (c->flags & ~(uint32_t)URDMA_CFG_THREADSAFE)
		return -EINVAL;
	if (c->connect_timeout_ms < 0 || c->op_timeout_ms < 0 ||
	    c->spin_us < -1 || c->spin_us > 1000000)
		return -EINVAL;
	if (!c->queue_depth)
		c->queue_depth = DEF_QUEUE_DEPTH;
	if (!c->buf_size)
		c->buf_size = DEF_BUF_SIZE;
	if (!c->buf_count)
		c->buf_count = DEF_BUF_COUNT;
	if (!c->inline_max) /* (a device may take less: conn.c) */
		c->inline_max = c->buf_size && c->buf_size < DEF_INLINE ?
					c->buf_size : DEF_INLINE;
	if (!c->connect_timeout_ms)
		c->connect_timeout_ms = DEF_CONNECT_MS;
	if (!c->op_timeout_ms)
		c->op_timeout_ms = DEF_OP_MS;
	/* Credits (conn.c): the last one is kept for updates, and an update
	 * goes when half the depth is owed; below 4 that could ping-pong. */
	if (c->queue_depth < 4 || c->queue_depth > 8192 ||
	    c->buf_size < 64 || c->buf_size > (1u << 30) ||
	    c->inline_max > c->buf_size || c->buf_count < c->queue_depth)
		return -EINVAL;
	c->buf_size = (c->buf_size + 63) & ~63u;
	return 0;
}

static struct ibv_context *pick_device(urdma_ctx *ctx, const char *name)
{
	struct ibv_context **list = rdma_get_devices(NULL), *v = NULL;

	if (!list)
		return NULL;
	for (int i = 0; list[i] && !v; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]->device), name))
			v = list[i];
	rdma_free_devices(list);
	if (!v)
		errno = ENODEV;
	return v;
}

static int watch(int epfd, int fd)
{
	struct epoll_event e = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e);
}

static int nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

API_EXPORT urdma_ctx *urdma_ctx_create(const urdma_cfg *cfg)
{
	urdma_ctx *ctx = calloc(1, sizeof(*ctx));
	int err;

	urdma_log_init();
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	if (cfg)
		ctx->cfg = *cfg;
	err = cfg_check(&ctx->cfg);
	if (err) {
		free(ctx);
		errno = -err;
		return NULL;
	}
	/* (not with THREADSAFE: a spin holds the context's lock, and
	 * another thread's send may be what it waits for) */
	ctx->spin_auto = !ctx->cfg.spin_us &&
			 !(ctx->cfg.flags & URDMA_CFG_THREADSAFE);
	if (ctx->spin_auto)
		ctx->cfg.spin_us = DEF_SPIN_US;
	ctx->spin_ns = ctx->cfg.spin_us > 0 ? ctx->cfg.spin_us * 1000ull : 0;
	errno = 0; /* fail: below says what the step that failed set */
	ctx->threadsafe = ctx->cfg.flags & URDMA_CFG_THREADSAFE;
	ctx->probe_every = PROBE_MIN;
	list_init(&ctx->conns);
	list_init(&ctx->timed);
	list_init(&ctx->dirty);
	list_init(&ctx->dead);
	list_init(&ctx->zombies);
	list_init(&ctx->starved);
	list_init(&ctx->accepting);
	pthread_mutex_init(&ctx->lock, NULL);
	ctx->epfd = ctx->evfd = ctx->tfd = -1;
	ctx->verbs = pick_device(ctx, ctx->cfg.device);
	if (!ctx->verbs)
		goto fail;
	ctx->cfg.device = NULL; /* not kept: the caller's string */
	if (ibv_query_device(ctx->verbs, &ctx->dattr))
		goto fail;
	/* what a connection's QP and its share of the CQ will ask for */
	if (api_sq_size(ctx->cfg.queue_depth) + 1 >
		    (uint32_t)ctx->dattr.max_qp_wr ||
	    ctx->cfg.queue_depth * 3 + 2 > (uint32_t)ctx->dattr.max_cqe ||
	    ctx->cfg.buf_size > ctx->dattr.max_mr_size) {
		errno = EINVAL;
		goto fail;
	}
	ctx->pd = ibv_alloc_pd(ctx->verbs);
	ctx->cch = ctx->pd ? ibv_create_comp_channel(ctx->verbs) : NULL;
	if (!ctx->cch || nonblock(ctx->cch->fd))
		goto fail;
	ctx->cq_size = ctx->dattr.max_cqe < 1024 ? ctx->dattr.max_cqe : 1024;
	ctx->cq = ibv_create_cq(ctx->verbs, ctx->cq_size, ctx, ctx->cch, 0);
	ctx->cm = ctx->cq ? rdma_create_event_channel() : NULL;
	if (!ctx->cm || nonblock(ctx->cm->fd))
		goto fail;
	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	ctx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ctx->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (ctx->epfd < 0 || ctx->evfd < 0 || ctx->tfd < 0 ||
	    watch(ctx->epfd, ctx->cch->fd) || watch(ctx->epfd, ctx->cm->fd) ||
	    watch(ctx->epfd, ctx->evfd) || watch(ctx->epfd, ctx->tfd))
		goto fail;
	if (ibv_req_notify_cq(ctx->cq, 0))
		goto fail;
	ctx->armed = true;
	err = api_pool_init(ctx);
	if (err) {
		errno = -err;
		goto fail;
	}
	return ctx;
fail:
	err = errno ? errno : EIO;
	urdma_info("%s", strerror(err));
	urdma_ctx_destroy(ctx);
	errno = err;
	return NULL;
}

API_EXPORT int urdma_ctx_fd(urdma_ctx *ctx)
{
	if (!ctx)
		return -EINVAL;
	/* From now on the application may sleep on the fd: the CQ is armed
	 * whenever a call returns (ctx_create armed it for the first time). */
	api_lock(ctx);
	ctx->fd_given = true;
	api_unlock(ctx);
	return ctx->epfd;
}

/* ---- the event queue ---- */

/*
 * Room: every live connection may still need two events (ACCEPTED or
 * CONNECTED, and its CLOSED), and those always fit: api_evq_reserve makes
 * the room when the connection is made, where a failure can be returned.
 * The queue grows ahead of need; any other event fails with -ENOMEM only
 * when it cannot grow and that reserve is all that is left (the caller
 * then fails its connection, which reports it).
 */
static int evq_grow(struct api_evq *q)
{
	uint32_t cap = q->cap ? q->cap * 2 : 64;
	urdma_event *ev = malloc(cap * sizeof(*ev));

	if (!ev)
		return -ENOMEM;
	for (uint32_t i = 0; i < q->tail - q->head; i++)
		ev[i] = q->ev[(q->head + i) & (q->cap - 1)];
	q->tail -= q->head;
	q->head = 0;
	free(q->ev);
	q->ev = ev;
	q->cap = cap;
	return 0;
}

static uint32_t evq_room(const struct api_evq *q)
{
	return q->cap - (q->tail - q->head);
}

int api_evq_reserve(urdma_ctx *ctx)
{
	while (evq_room(&ctx->q) < 2 * (ctx->nconns + 1) + 1)
		if (evq_grow(&ctx->q))
			return -ENOMEM;
	ctx->nconns++;
	return 0;
}

void api_evq_release(urdma_ctx *ctx)
{
	ctx->nconns--;
}

int api_push(urdma_ctx *ctx, int type, int status, urdma_conn *c, void *user,
	     void *buf, size_t len, uint64_t value)
{
	struct api_evq *q = &ctx->q;
	bool conn_ev = type == URDMA_EV_ACCEPTED ||
		       type == URDMA_EV_CONNECTED || type == URDMA_EV_CLOSED;
	uint32_t keep = conn_ev ? 0 : 2 * ctx->nconns;

	if (evq_room(q) <= keep + q->cap / 4)
		evq_grow(q); /* early; a failure leaves the room there is */
	if (evq_room(q) <= keep)
		return -ENOMEM;
	q->ev[q->tail++ & (q->cap - 1)] = (urdma_event){
		.type = type, .status = status, .conn = c, .user = user,
		.buf = buf, .len = len, .value = value,
	};
	/* Outside urdma_poll (a call that failed a connection, closed a
	 * listener): the fd must say there is something to take. */
	if (!ctx->in_progress)
		api_kick(ctx);
	return 0;
}

/* An event leaves the queue for the application. */
static void popped(urdma_ctx *ctx, const urdma_event *ev)
{
	urdma_conn *c = ev->conn;

	/* The handle stays valid until the next urdma_poll. */
	if (ev->type == URDMA_EV_CLOSED && c && c->state == ST_DEAD)
		list_add_tail(&c->rnode, &ctx->dead);
}

/* Make the fd readable: for an application that sleeps on it, or
 * another thread asleep in urdma_poll. */
void api_kick(urdma_ctx *ctx)
{
	if (!ctx->kicked && (ctx->fd_given || ctx->threadsafe)) {
		uint64_t one = 1;

		ctx->kicked = write(ctx->evfd, &one, sizeof(one)) == sizeof(one);
	}
}

static void unkick(urdma_ctx *ctx)
{
	uint64_t v;

	if (ctx->kicked && read(ctx->evfd, &v, sizeof(v)) >= 0)
		ctx->kicked = false;
}

/* ---- the completion queue ---- */

int api_cq_grow(urdma_ctx *ctx, int more)
{
	int need = ctx->cq_need + more, size = ctx->cq_size;

	if (more <= 0 || need <= ctx->cq_size) {
		ctx->cq_need = need;
		return 0;
	}
	if (need > ctx->dattr.max_cqe)
		return -ENOBUFS;
	while (size < need)
		size = size * 2 > ctx->dattr.max_cqe ? ctx->dattr.max_cqe :
						       size * 2;
	if (ibv_resize_cq(ctx->cq, size))
		return api_errno();
	ctx->cq_size = size;
	ctx->cq_need = need;
	return 0;
}

int api_wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECANCELED;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -ETIMEDOUT;
	case IBV_WC_LOC_PROT_ERR:
		return -EFAULT;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -EMSGSIZE;
	case IBV_WC_REM_OP_ERR:
		return -EREMOTEIO;
	default:
		return -EIO;
	}
}

/* Take what the CQ has (at most CQ_PER_POLL), then flush the connections
 * that made dirty (credits to grant, queued sends, receives to re-post);
 * true if the CQ may hold more. */
static bool cq_drain(urdma_ctx *ctx)
{
	struct ibv_wc wc[CQ_BATCH];
	int total = 0, n;

	do {
		n = ibv_poll_cq(ctx->cq, CQ_BATCH, wc);
		for (int i = 0; i < n; i++)
			api_wc(ctx, &wc[i]);
		total += n > 0 ? n : 0;
	} while (n == CQ_BATCH && total < CQ_PER_POLL);
	api_flush_dirty(ctx);
	return n == CQ_BATCH;
}

/* The channel fired: one event per arm. */
static void cq_event(urdma_ctx *ctx)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (ibv_get_cq_event(ctx->cch, &cq, &cq_ctx))
		return;
	ctx->armed = false;
	if (++ctx->cq_events >= 64) {
		ibv_ack_cq_events(ctx->cq, ctx->cq_events);
		ctx->cq_events = 0;
	}
}

/* ---- deadlines ---- */

/* Arm the timer for the first deadline, if that is not what it is set
 * for already (0: not set). */
void api_timer_update(urdma_ctx *ctx)
{
	uint64_t first = 0;
	struct itimerspec its = { 0 };
	urdma_conn *c;

	list_for_each_entry(c, &ctx->timed, tnode)
		if (!first || c->deadline_ns < first)
			first = c->deadline_ns;
	if (first == ctx->timer_ns)
		return;
	its.it_value.tv_sec = (time_t)(first / 1000000000ull);
	its.it_value.tv_nsec = (long)(first % 1000000000ull);
	timerfd_settime(ctx->tfd, TFD_TIMER_ABSTIME, &its, NULL);
	ctx->timer_ns = first;
}

/* ---- progress ---- */

/*
 * Everything there is to do.  One epoll_wait says which of the fd's
 * sources have something; only those are read (a system call each), the
 * CQ is polled in memory.
 */
static void progress(urdma_ctx *ctx, uint64_t now)
{
	struct epoll_event ready[4];
	uint64_t v;
	int n;

	ctx->in_progress = true;
	/* requests the application saw in the last urdma_poll, and did not
	 * close, are accepted first */
	api_accept_pending(ctx);
	/* The fds: always for an application that sleeps on them (it called
	 * because they are readable), otherwise at most every FD_LOOK_NS
	 * while busy (and after every sleep): a blocking ping-pong then
	 * makes no system call. */
	n = 0;
	if (ctx->fd_given || now - ctx->fds_ns >= FD_LOOK_NS) {
		ctx->fds_ns = now;
		n = epoll_wait(ctx->epfd, ready, 4, 0);
	}
	for (int i = 0; i < n; i++) {
		int fd = ready[i].data.fd;

		if (fd == ctx->evfd) {
			unkick(ctx);
		} else if (fd == ctx->tfd) {
			if (read(ctx->tfd, &v, sizeof(v)) > 0)
				ctx->timer_ns = 0; /* fired: disarmed */
			api_expire(ctx, urdma_now_ns());
		} else if (fd == ctx->cm->fd) {
			api_cm_events(ctx);
		} else if (fd == ctx->cch->fd) {
			cq_event(ctx);
		}
	}
	if (cq_drain(ctx))
		api_kick(ctx);
	api_timer_update(ctx);
	ctx->in_progress = false;
}

/* Arm the CQ, then look again: a completion that came between the last
 * poll and the arm would not fire the channel.  True if that look found
 * anything (then nobody should sleep). */
static bool arm(urdma_ctx *ctx)
{
	uint32_t had = ctx->q.tail;
	bool more;

	if (ctx->armed || ibv_req_notify_cq(ctx->cq, 0))
		return false;
	ctx->armed = true;
	ctx->in_progress = true;
	more = cq_drain(ctx);
	ctx->in_progress = false;
	if (more || ctx->q.head != ctx->q.tail)
		api_kick(ctx);
	return more || ctx->q.tail != had;
}

static int take(urdma_ctx *ctx, urdma_event *ev, int max)
{
	struct api_evq *q = &ctx->q;
	int n = 0;

	while (n < max && q->head != q->tail) {
		ev[n] = q->ev[q->head++ & (q->cap - 1)];
		popped(ctx, &ev[n]);
		n++;
	}
	if (q->head != q->tail)
		api_kick(ctx);
	return n;
}

/* Sleep on the context's fd for up to timeout_ms (<0: for ever), without
 * the lock. */
static void sleep_fd(urdma_ctx *ctx, int timeout_ms)
{
	struct pollfd p = { .fd = ctx->epfd, .events = POLLIN };

	api_unlock(ctx);
	poll(&p, 1, timeout_ms);
	api_lock(ctx);
}

/* Open connections send what is queued and say goodbye, as urdma_close
 * has them do, for up to op_timeout_ms (the CLOSING deadline): the peer
 * sees an orderly close, not a reset. */
static void goodbye(urdma_ctx *ctx)
{
	if (!ctx->cq || !ctx->cm)
		return; /* a create that failed */
	api_lock(ctx);
	while (api_close_all(ctx)) {
		if (!arm(ctx))
			sleep_fd(ctx, 10);
		ctx->fds_ns = 0; /* the CLOSING deadlines are on the timer */
		progress(ctx, urdma_now_ns());
	}
	api_unlock(ctx);
}

API_EXPORT void urdma_ctx_destroy(urdma_ctx *ctx)
{
	if (!ctx)
		return;
	goodbye(ctx);
	while (!list_empty(&ctx->conns))
		api_conn_free(list_entry(ctx->conns.next, urdma_conn, node));
	if (ctx->cq) {
		if (ctx->cq_events)
			ibv_ack_cq_events(ctx->cq, ctx->cq_events);
		ibv_destroy_cq(ctx->cq);
		ctx->cq = NULL;
	}
	while (!list_empty(&ctx->zombies)) {
		urdma_conn *z = list_entry(ctx->zombies.next, urdma_conn, node);

		list_del(&z->node);
		free(z->srec);
		free(z->rrec);
		free(z);
	}
	while (ctx->mems)
		urdma_dereg(ctx->mems);
	api_pool_fini(ctx);
	if (ctx->cch)
		ibv_destroy_comp_channel(ctx->cch);
	if (ctx->pd)
		ibv_dealloc_pd(ctx->pd);
	if (ctx->cm)
		rdma_destroy_event_channel(ctx->cm);
	if (ctx->epfd >= 0)
		close(ctx->epfd);
	if (ctx->evfd >= 0)
		close(ctx->evfd);
	if (ctx->tfd >= 0)
		close(ctx->tfd);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx->q.ev);
	free(ctx);
}

static int remaining_ms(uint64_t end_ns)
{
	uint64_t now = urdma_now_ns();

	return now >= end_ns ? 0 : (int)((end_ns - now + 999999) / 1000000);
}

/* The index in the queue of the first event of conn (any if NULL) that is
 * of type (any if 0) or its CLOSED; -1 if none. */
static int match(const urdma_ctx *ctx, const urdma_conn *conn, int type)
{
	const struct api_evq *q = &ctx->q;

	for (uint32_t i = q->head; i != q->tail; i++) {
		const urdma_event *e = &q->ev[i & (q->cap - 1)];

		if (conn && e->conn != conn)
			continue;
		if (type && e->type != type && e->type != URDMA_EV_CLOSED)
			continue;
		return (int)(i - q->head);
	}
	return -1;
}

/* Poll the CQ (in memory) until what the caller waits for comes, for up
 * to the spin time; true if it came.  The clock is read every SPIN_TURNS
 * polls: a read costs as much as an empty poll here (kvm-clock), and was
 * 30 % of an echo client's samples. */
#define SPIN_TURNS 16
static bool spin(urdma_ctx *ctx, urdma_conn *conn, int type, uint64_t now)
{
	uint64_t end = now + ctx->spin_ns;
	unsigned int turn = 0;
	bool met;

	ctx->in_progress = true;
	do {
		cq_drain(ctx);
		met = match(ctx, conn, type) >= 0;
		if (!met)
			cpu_relax();
	} while (!met && (++turn % SPIN_TURNS || urdma_now_ns() < end));
	ctx->in_progress = false;
	return met;
}

/* Spin before sleeping?  Not after SPIN_MISSES waits in a row that a
 * spin would not have met; but now and then one does (a probe): the waits
 * may have been long only because each slept, as a wake-up can cost more
 * than spin_us, and then a sleep alone never ends within it.  A probe
 * that meets its event brings spinning back; one that misses makes the
 * next come half as often (spin_learn). */
static bool spin_first(urdma_ctx *ctx, bool *probe)
{
	if (ctx->spin_miss < SPIN_MISSES)
		return true;
	if (++ctx->probe_wait < ctx->probe_every)
		return false;
	ctx->probe_wait = 0;
	*probe = true;
	return true;
}

/* After a wait that began at start_ns: was it short enough to be worth a
 * spin?  (One that did not sleep was: no clock read then, as the caller
 * has its event.)  With spin_auto, one that slept and still ended within
 * SPIN_LONG_NS sets the next spins: 1.5 times the recent such waits, at
 * most SPIN_AUTO_MAX_NS; when those waits average more than that, a spin
 * would not meet them, and it is spin_us again.  (A spin that meets its
 * event changes nothing: it reads no clock.) */
static void spin_stretch(urdma_ctx *ctx, uint64_t took)
{
	uint64_t base = ctx->cfg.spin_us * 1000ull, want;

	ctx->wait_ns = ctx->wait_ns ? (3 * ctx->wait_ns + took) / 4 : took;
	want = ctx->wait_ns + ctx->wait_ns / 2;
	if (ctx->wait_ns > SPIN_AUTO_MAX_NS || want < base)
		want = base;
	ctx->spin_ns = want < SPIN_AUTO_MAX_NS ? want : SPIN_AUTO_MAX_NS;
}

static void spin_learn(urdma_ctx *ctx, bool slept, bool probe,
		       uint64_t start_ns)
{
	uint64_t took = slept ? urdma_now_ns() - start_ns : 0;

	if (took <= SPIN_LONG_NS) {
		ctx->spin_miss = 0;
		ctx->probe_every = PROBE_MIN;
		if (slept && ctx->spin_auto)
			spin_stretch(ctx, took);
		return;
	}
	ctx->spin_miss += ctx->spin_miss < SPIN_MISSES;
	if (probe && ctx->probe_every < PROBE_MAX)
		ctx->probe_every *= 2;
}

/* Make progress until the queue holds an event of conn and type (as
 * match), or timeout_ms (0: look once; <0: no limit) has passed. */
static void await(urdma_ctx *ctx, urdma_conn *conn, int type, int timeout_ms)
{
	uint64_t now = urdma_now_ns(), start = now;
	uint64_t end = start + timeout_ms * 1000000ull;
	bool spun = false, slept = false, probe = false;

	/* (one clock read per turn: progress, the deadline and the spin
	 * share it) */
	for (;; now = urdma_now_ns()) {
		progress(ctx, now);
		if (match(ctx, conn, type) >= 0 || !timeout_ms)
			break;
		if (timeout_ms > 0 && now >= end)
			break;
		if (!spun && ctx->cfg.spin_us > 0 && spin_first(ctx, &probe)) {
			spun = true;
			if (spin(ctx, conn, type, now))
				break;
			continue; /* the fds, once more */
		}
		if (arm(ctx))
			continue;
		sleep_fd(ctx, timeout_ms < 0 ? -1 : remaining_ms(end));
		ctx->fds_ns = 0; /* what woke us is read now */
		slept = true;
	}
	if (ctx->cfg.spin_us > 0 && timeout_ms)
		spin_learn(ctx, slept, probe, start);
	if (ctx->fd_given)
		arm(ctx);
}

API_EXPORT int urdma_poll(urdma_ctx *ctx, urdma_event *ev, int max,
			  int timeout_ms)
{
	int n;

	if (!ctx || !ev || max <= 0)
		return -EINVAL;
	api_lock(ctx);
	api_reap(ctx);
	await(ctx, NULL, 0, timeout_ms);
	n = take(ctx, ev, max);
	api_unlock(ctx);
	return n;
}

API_EXPORT int urdma_wait(urdma_ctx *ctx, urdma_conn *conn, int type,
			  urdma_event *ev, int timeout_ms)
{
	struct api_evq *q;
	int ret = -ETIMEDOUT, k;

	if (!ctx || !ev || type < 0 || type > URDMA_EV_CLOSED ||
	    (conn && conn->ctx != ctx))
		return -EINVAL;
	api_lock(ctx);
	api_reap(ctx);
	await(ctx, conn, type, timeout_ms);
	k = match(ctx, conn, type);
	if (k >= 0) {
		uint32_t i = ctx->q.head + (uint32_t)k;

		q = &ctx->q;
		*ev = q->ev[i & (q->cap - 1)];
		/* close the gap, keeping the order */
		for (uint32_t j = i; j != q->head; j--)
			q->ev[j & (q->cap - 1)] = q->ev[(j - 1) & (q->cap - 1)];
		q->head++;
		popped(ctx, ev);
		ret = 0;
	}
	if (ctx->q.head != ctx->q.tail)
		api_kick(ctx);
	api_unlock(ctx);
	return ret;
}
