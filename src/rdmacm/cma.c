// SPDX-License-Identifier: MIT
/*
 * The RDMA connection manager (<rdma/rdma_cma.h>) without a kernel.
 *
 * An rdma_cm_id is a TCP socket plus a state machine.  rdma_bind_addr binds
 * the socket (port 0 gives an ephemeral port), rdma_listen listens on it,
 * rdma_resolve_addr asks the namespace's routing table for the source
 * address (a connected UDP socket) and binds the socket there, and
 * rdma_connect connects it and sends a REQ.  The passive side answers with a
 * REP (rdma_accept) or a REJ (rdma_reject), the active side completes with
 * an RTU, and either side ends the connection with a DREQ (rdma_disconnect)
 * or by closing the socket (its process died).  The messages carry what
 * RC QPs need (QPN, PSN, GID = the socket's IP address, responder resources,
 * initiator depth, retry counts) and the applications' private data; the
 * library moves QPs it created (rdma_create_qp) through INIT, RTR and RTS.
 *
 * Threads and locks: one mutex (cma_lock) guards every id, channel and event
 * queue.  The CM thread, started with the first channel, waits in epoll on
 * the ids' sockets and handles them under cma_lock; application threads take
 * the lock in each call and drop it before they block (in rdma_get_cm_event,
 * or waiting for events to be acknowledged).  An event channel's fd is an
 * eventfd that is readable exactly while its queue is not empty.
 *
 * This file: ids, event channels and events, the CM thread, destruction.
 * cma_addr.c: binding and resolution; cma_qp.c: the ids' QPs; cma_conn.c:
 * the CM protocol, both sides; cma_ep.c: the <rdma/rdma_verbs.h> helpers,
 * options, what is not supported; cma_priv.h: what they share.
 */
#include "rdmacm/cma_priv.h"
#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

pthread_mutex_t cma_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t cma_cond = PTHREAD_COND_INITIALIZER;
struct list_head cma_ids = LIST_HEAD_INIT(cma_ids);
static uint64_t cma_next_handle = 1;
int cma_epfd = -1, cma_wakefd = -1;
struct ibv_context *cma_ctx;
struct ibv_pd *cma_pd;
struct ibv_device_attr cma_dev_attr;
enum ibv_mtu cma_mtu = IBV_MTU_1024;
/* urdma's libibverbs beyond the verbs API (core/cm_link.h), or NULL. */
const struct verbs_ex_private *cma_link(void)
{
	struct ibv_context *ctx = __atomic_load_n(&cma_ctx, __ATOMIC_ACQUIRE);
	struct verbs_context *v = ctx ? verbs_get_ctx(ctx) : NULL;

	if (!v || !v->priv || v->priv->magic != URDMA_CM_LINK_MAGIC)
		return NULL;
	return v->priv;
}

/* libibverbs' stops of the threads so far (core/cm_link.h); 0 without a
 * urdma device. */
uint32_t cma_stop_seq(void)
{
	const struct verbs_ex_private *link = cma_link();

	return link ? link->stop_seq() : 0;
}

bool cma_cut_by_stop(uint32_t stops)
{
	return errno == EINTR && cma_stop_seq() != stops;
}

/* The application sets up a connection: what its QPs hold back for their
 * next message goes now (core/cm_link.h). */
void cma_release_held(void)
{
	const struct verbs_ex_private *link = cma_link();

	if (link)
		link->release_held();
}

/* ---- initialisation and the CM thread ----------------------------------- */

/*
 * Ids by handle: the CM thread looks one up for every socket event, so a
 * hash (handles count up: consecutive ones go to consecutive buckets).
 */
#define CMA_HASH 4096
static struct cma_id *cma_hash[CMA_HASH];

struct cma_id *cma_find(uint64_t handle)
{
	struct cma_id *cid = cma_hash[handle % CMA_HASH];

	while (cid && cid->handle != handle)
		cid = cid->hnext;
	return cid;
}

/*
 * Deadlines: the ids waiting for their socket to connect or for a REQ are
 * on cma_timers, earliest first (every deadline is now + CMA_*_TIMEOUT_MS,
 * so a new one almost always goes last), so that the CM thread's timeout
 * and its expiry pass look at the first alone.  Under cma_lock.
 */
static struct list_head cma_timers = LIST_HEAD_INIT(cma_timers);
/* When the CM thread looks at the deadlines next, by its epoll timeout
 * (0: only when something wakes it). */
static uint64_t cma_wake_ns;

static struct cma_id *cma_first_timer(void)
{
	return list_empty(&cma_timers) ?
		       NULL :
		       list_entry(cma_timers.next, struct cma_id, tnode);
}

/* Give cid a deadline ms from now, or none (0).  True if the CM thread
 * must be woken (cma_kick) to wait less: it would look after the
 * deadline (at most once per CMA_*_TIMEOUT_MS, however fast ids come and
 * go). */
bool cma_deadline(struct cma_id *cid, unsigned int ms)
{
	struct list_head *at = &cma_timers; /* cid goes before it */

	if (cid->deadline_ns) {
		list_del(&cid->tnode);
		cid->deadline_ns = 0;
	}
	if (!ms)
		return false;
	cid->deadline_ns = urdma_now_ns() + ms * 1000000ull;
	while (at->prev != &cma_timers &&
	       list_entry(at->prev, struct cma_id, tnode)->deadline_ns >
		       cid->deadline_ns)
		at = at->prev;
	list_add_tail(&cid->tnode, at);
	return !cma_wake_ns || cid->deadline_ns < cma_wake_ns;
}

void cma_expire(uint64_t now)
{
	struct cma_id *cid;

	while ((cid = cma_first_timer()) && cid->deadline_ns <= now) {
		cma_deadline(cid, 0);
		cma_closed(cid, -ETIMEDOUT);
	}
}

/* The CM thread's epoll timeout, which sets cma_wake_ns. */
static int cma_next_timeout_ms(void)
{
	struct cma_id *first = cma_first_timer();
	uint64_t now = urdma_now_ns();
	int ms;

	if (!first) {
		cma_wake_ns = 0;
		return -1;
	}
	ms = first->deadline_ns <= now ?
		     0 :
		     (int)((first->deadline_ns - now) / 1000000 + 1);
	cma_wake_ns = now + (uint64_t)ms * 1000000ull;
	return ms;
}

static void *cma_thread(void *arg)
{
	struct epoll_event evs[16];
	int timeout;

	(void)arg;
	pthread_mutex_lock(&cma_lock);
	for (;;) {
		timeout = cma_next_timeout_ms();
		pthread_mutex_unlock(&cma_lock);
		int n = epoll_wait(cma_epfd, evs, 16, timeout);
		pthread_mutex_lock(&cma_lock);
		for (int i = 0; i < n; i++) {
			struct cma_id *cid;
			uint64_t v;

			if (!evs[i].data.u64) {
				if (read(cma_wakefd, &v, sizeof(v)) < 0)
					(void)0;
				continue;
			}
			cid = cma_find(evs[i].data.u64);
			if (cid)
				cma_handle_io(cid);
		}
		cma_expire(urdma_now_ns());
	}
	return NULL;
}

/* Wake the CM thread so that it recomputes its timeout. */
void cma_kick(void)
{
	uint64_t one = 1;

	if (write(cma_wakefd, &one, sizeof(one)) < 0)
		(void)0;
}

static int cma_init_locked(void)
{
	struct ibv_device **list;
	struct ibv_port_attr pa;
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };
	pthread_attr_t ta;
	pthread_t t;
	int n;

	if (cma_ctx)
		return 0;
	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		if (list)
			ibv_free_device_list(list);
		return cma_err(ENODEV);
	}
	cma_ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!cma_ctx)
		return -1;
	/* The device's PD, which an id with a device names (id->pd), as
	 * librdmacm gives one: programs create QPs and MRs on it. */
	cma_pd = ibv_alloc_pd(cma_ctx);
	if (!cma_pd || ibv_query_device(cma_ctx, &cma_dev_attr) ||
	    ibv_query_port(cma_ctx, 1, &pa))
		goto fail;
	cma_mtu = pa.active_mtu;
	cma_epfd = epoll_create1(EPOLL_CLOEXEC);
	cma_wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (cma_epfd < 0 || cma_wakefd < 0 ||
	    epoll_ctl(cma_epfd, EPOLL_CTL_ADD, cma_wakefd, &ev))
		goto fail;
	pthread_attr_init(&ta);
	pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &ta, cma_thread, NULL)) {
		pthread_attr_destroy(&ta);
		goto fail;
	}
	pthread_attr_destroy(&ta);
	return 0;
fail:
	n = errno ? errno : ENOMEM;
	if (cma_epfd >= 0)
		close(cma_epfd);
	if (cma_wakefd >= 0)
		close(cma_wakefd);
	cma_epfd = cma_wakefd = -1;
	if (cma_pd)
		ibv_dealloc_pd(cma_pd);
	cma_pd = NULL;
	ibv_close_device(cma_ctx);
	cma_ctx = NULL;
	return cma_err(n);
}

int cma_init(void)
{
	int ret;

	pthread_mutex_lock(&cma_lock);
	ret = cma_init_locked();
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- event channels ----------------------------------------------------- */

struct cma_channel *cma_channel_new(bool sync)
{
	struct cma_channel *c = urdma_zalloc(sizeof(*c));

	if (!c)
		return NULL;
	c->ch.fd = eventfd(0, EFD_CLOEXEC);
	if (c->ch.fd < 0) {
		urdma_free(c);
		return NULL;
	}
	list_init(&c->events);
	c->sync = sync;
	return c;
}

/* The fd is readable exactly while the queue holds events: call after each
 * change of the queue.  Under cma_lock. */
void cma_channel_sync(struct cma_channel *c)
{
	uint64_t v = 1;
	bool empty = list_empty(&c->events);

	if (!empty && !c->readable) {
		if (write(c->ch.fd, &v, sizeof(v)) < 0)
			urdma_warn("event channel %d: %s", c->ch.fd, strerror(errno));
		c->readable = true;
	} else if (empty && c->readable) {
		if (read(c->ch.fd, &v, sizeof(v)) < 0)
			urdma_warn("event channel %d: %s", c->ch.fd, strerror(errno));
		c->readable = false;
	}
}

EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cma_channel *c;

	if (cma_init())
		return NULL;
	c = cma_channel_new(false);
	return c ? &c->ch : NULL;
}

void cma_channel_free(struct cma_channel *c)
{
	struct cma_event *e, *n;

	list_for_each_entry_safe(e, n, &c->events, node) {
		list_del(&e->node);
		urdma_free(e);
	}
	close(c->ch.fd);
	urdma_free(c);
}

EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct cma_channel *c;

	if (!channel)
		return;
	c = to_cch(channel);
	pthread_mutex_lock(&cma_lock);
	if (c->nids) {
		/* rdma_cm_ids still report here: freeing it would leave them
		 * pointing at freed memory. */
		urdma_warn("event channel %d still has %d ids; not destroyed",
			   c->ch.fd, c->nids);
		pthread_mutex_unlock(&cma_lock);
		return;
	}
	if (c->waiters) {
		/* A thread still waits in rdma_get_cm_event (rping's CM
		 * thread at exit does).  With the kernel's CM it would stay
		 * blocked in read() until the process ends: so here, and the
		 * channel stays allocated for it. */
		c->closed = true;
		pthread_mutex_unlock(&cma_lock);
		return;
	}
	pthread_mutex_unlock(&cma_lock);
	cma_channel_free(c);
}

struct cma_event *cma_post(struct cma_id *cid,
			   enum rdma_cm_event_type type, int status,
			   const struct cma_msg *m)
{
	struct cma_channel *c = to_cch(cid->id.channel);
	struct cma_event *e = urdma_zalloc(sizeof(*e));

	if (!e) {
		urdma_err("out of memory: %s lost", rdma_event_str(type));
		return NULL;
	}
	e->ev.id = &cid->id;
	e->ev.event = type;
	e->ev.status = status;
	e->owner = cid;
	if (m && cid->id.qp_type == IBV_QPT_UD) {
		struct rdma_ud_param *u = &e->ev.param.ud;

		memcpy(e->pdata, m + 1, m->pdata_len);
		u->private_data = m->pdata_len ? e->pdata : NULL;
		u->private_data_len = m->pdata_len;
		u->qp_num = ntohl(m->qpn) & 0xffffff;
		u->qkey = ntohl(m->psn); /* (a UD message's psn is its Q_Key) */
		if (type == RDMA_CM_EVENT_ESTABLISHED)
			cma_ud_ah(cid, m, &u->ah_attr);
	} else if (m) {
		struct rdma_conn_param *p = &e->ev.param.conn;

		memcpy(e->pdata, m + 1, m->pdata_len);
		p->private_data = m->pdata_len ? e->pdata : NULL;
		p->private_data_len = m->pdata_len;
		/* Seen from here: the peer's depth is our resources. */
		p->responder_resources = m->initiator_depth;
		p->initiator_depth = m->responder_resources;
		p->flow_control = m->flow_control;
		p->retry_count = m->retry_count;
		p->rnr_retry_count = m->rnr_retry_count;
		p->srq = m->srq;
		p->qp_num = ntohl(m->qpn);
	}
	list_add_tail(&e->node, &c->events);
	cma_channel_sync(c);
	return e;
}

EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel,
			     struct rdma_cm_event **event)
{
	struct cma_channel *c;

	if (!channel || !event)
		return cma_err(EINVAL);
	c = to_cch(channel);
	pthread_mutex_lock(&cma_lock);
	for (;;) {
		struct pollfd pfd = { .fd = channel->fd, .events = POLLIN };
		uint32_t stops;
		int fl, r;

		if (!c->closed && !list_empty(&c->events)) {
			struct cma_event *e = list_entry(c->events.next,
							 struct cma_event, node);

			list_del(&e->node);
			cma_channel_sync(c);
			e->owner->outstanding++;
			if (e->qp_err)
				cma_qp_error(to_cid(e->ev.id));
			pthread_mutex_unlock(&cma_lock);
			*event = &e->ev;
			return 0;
		}
		c->waiters++;
		pthread_mutex_unlock(&cma_lock);
		stops = cma_stop_seq();
		fl = fcntl(channel->fd, F_GETFL);
		r = fl < 0 ? -1 : (fl & O_NONBLOCK) ? cma_err(EAGAIN) :
						       poll(&pfd, 1, -1);
		pthread_mutex_lock(&cma_lock);
		c->waiters--;
		if (r < 0 && cma_cut_by_stop(stops))
			continue;
		if (r < 0) {
			int e = errno;

			pthread_mutex_unlock(&cma_lock);
			return cma_err(e);
		}
	}
}

EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct cma_event *e;

	if (!event)
		return cma_err(EINVAL);
	e = container_of(event, struct cma_event, ev);
	pthread_mutex_lock(&cma_lock);
	e->owner->outstanding--;
	pthread_cond_broadcast(&cma_cond);
	pthread_mutex_unlock(&cma_lock);
	urdma_free(e);
	return 0;
}

EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};

	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "UNKNOWN EVENT";
}

/* ---- ids ---------------------------------------------------------------- */

static uint32_t cma_random_psn(void)
{
	uint32_t v = 0;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint32_t)urdma_now_ns() ^ (uint32_t)getpid() << 8;
	return v & 0xffffff;
}

/* Under cma_lock. */
struct cma_id *cma_id_new(struct cma_channel *c, void *context,
			  enum rdma_port_space ps)
{
	struct cma_id *cid = urdma_zalloc(sizeof(*cid));

	if (!cid)
		return NULL;
	cid->id.channel = &c->ch;
	cid->id.context = context;
	cid->id.ps = ps;
	cid->id.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD :
								   IBV_QPT_RC;
	cid->id.port_num = 1;
	cid->fd = -1;
	cid->sync = c->sync;
	cid->handle = cma_next_handle++;
	cid->psn = cma_random_psn();
	cid->retry_count = 7;
	cid->rnr_retry = 7;
	cid->ack_timeout = 14; /* 67 ms per try, the RoCE CM default */
	cid->responder_resources = cma_dev_attr.max_qp_rd_atom;
	cid->initiator_depth = cma_dev_attr.max_qp_init_rd_atom;
	c->nids++;
	list_add_tail(&cid->node, &cma_ids);
	cid->hnext = cma_hash[cid->handle % CMA_HASH];
	cma_hash[cid->handle % CMA_HASH] = cid;
	return cid;
}

/* Take cid out of the lists and tables (the last step before freeing it).
 * Under cma_lock. */
void cma_id_unlink(struct cma_id *cid)
{
	struct cma_id **pp = &cma_hash[cid->handle % CMA_HASH];

	while (*pp != cid)
		pp = &(*pp)->hnext;
	*pp = cid->hnext;
	cma_deadline(cid, 0);
	if (cid->listen)
		cid->listen->nchildren--;
	list_del(&cid->node);
	to_cch(cid->id.channel)->nids--;
}

EXPORT int rdma_create_id(struct rdma_event_channel *channel,
			  struct rdma_cm_id **id, void *context,
			  enum rdma_port_space ps)
{
	struct cma_channel *c;
	struct cma_id *cid;

	if (!id)
		return cma_err(EINVAL);
	switch (ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_IB:
		break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB:
		break;
	default:
		return cma_err(EINVAL);
	}
	if (cma_init())
		return -1;
	c = channel ? to_cch(channel) : cma_channel_new(true);
	if (!c)
		return -1;
	pthread_mutex_lock(&cma_lock);
	cid = cma_id_new(c, context, ps);
	pthread_mutex_unlock(&cma_lock);
	if (!cid) {
		if (!channel)
			cma_channel_free(c);
		return cma_err(ENOMEM);
	}
	*id = &cid->id;
	return 0;
}

/* Stop watching and close the socket.  Under cma_lock. */
void cma_close_fd(struct cma_id *cid)
{
	if (cid->fd < 0)
		return;
	epoll_ctl(cma_epfd, EPOLL_CTL_DEL, cid->fd, NULL);
	close(cid->fd);
	cid->fd = -1;
	cma_deadline(cid, 0);
}

int cma_send(struct cma_id *cid, enum cma_msg_type type,
	     const void *pdata, uint8_t len, uint32_t reason)
{
	uint8_t buf[sizeof(struct cma_msg) + CMA_MAX_PDATA];
	struct cma_msg *m = (struct cma_msg *)buf;
	size_t n = sizeof(*m) + len;
	union ibv_gid gid;
	ssize_t r;

	memset(m, 0, sizeof(*m));
	m->magic = htonl(CMA_MAGIC);
	m->type = type;
	m->pdata_len = len;
	m->responder_resources = cid->responder_resources;
	m->initiator_depth = cid->initiator_depth;
	m->retry_count = cid->retry_count;
	m->rnr_retry_count = cid->rnr_retry;
	m->qpn = htonl(cid->id.qp ? cid->id.qp->qp_num : cid->qp_num);
	m->psn = htonl(cid->id.qp_type == IBV_QPT_UD ? cma_ud_qkey(cid) : cid->psn);
	gid = cid->id.route.addr.addr.ibaddr.sgid;
	memcpy(m->gid, gid.raw, 16);
	/* A REQ says its port space (the service ID's part on IB). */
	m->reason = htonl(type == CMA_REQ ? (uint32_t)cid->id.ps : reason);
	if (len)
		memcpy(m + 1, pdata, len);
	r = send(cid->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (r == (ssize_t)n)
		return 0;
	/* A CM message is far smaller than a socket buffer: a short send
	 * means the connection is gone. */
	return r < 0 ? -errno : -ECONNRESET;
}

/* ---- synchronous ids ---------------------------------------------------- */

/* Wait on a synchronous id's private channel for the event that completes an
 * operation; keep it in id->event (as rdma-core does) until the next one. */
int cma_sync_wait(struct cma_id *cid, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	int status;

	if (rdma_get_cm_event(cid->id.channel, &ev))
		return -1;
	if (cid->id.event)
		rdma_ack_cm_event(cid->id.event);
	cid->id.event = ev;
	status = ev->status;
	if (ev->event == want && !status)
		return 0;
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		return cma_err(ECONNREFUSED);
	if (status < 0)
		return cma_err(-status);
	return cma_err(status ? status : ECONNABORTED);
}

/* ---- destruction -------------------------------------------------------- */

/* Drop the queued events that concern cid; requests that carry a child the
 * application never saw take the child with them.  Under cma_lock. */
static void cma_drop_events(struct cma_id *cid)
{
	struct cma_channel *c = to_cch(cid->id.channel);
	struct cma_event *e, *n;
again:
	list_for_each_entry_safe(e, n, &c->events, node) {
		struct cma_id *child = to_cid(e->ev.id);

		if (e->owner != cid && e->ev.id != &cid->id)
			continue;
		bool request = e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST;

		list_del(&e->node);
		urdma_free(e);
		if (request && child != cid) {
			cma_send(child, CMA_REJ, NULL, 0, CMA_REJ_CONSUMER);
			cma_drop_events(child);
			cma_id_free(child);
			goto again; /* that may have taken n */
		}
	}
	cma_channel_sync(c);
}

/* Take cma_lock once no event of cid is out with the application (a
 * synchronous id's kept event is acknowledged first). */
static void cma_lock_quiet(struct cma_id *cid)
{
	if (cid->sync && cid->id.event) {
		rdma_ack_cm_event(cid->id.event);
		cid->id.event = NULL;
	}
	pthread_mutex_lock(&cma_lock);
	while (cid->outstanding)
		pthread_cond_wait(&cma_cond, &cma_lock);
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct cma_id *cid, *o, *n;
	struct cma_channel *c;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	cma_lock_quiet(cid);
	cma_drop_events(cid);
	if (cid->state == CS_REQ_RCVD)
		cma_send(cid, CMA_REJ, NULL, 0, CMA_REJ_CONSUMER);
	/* Children whose requests were reported stay the application's;
	 * those still waiting for their REQ go with the listener. */
	list_for_each_entry_safe(o, n, &cma_ids, node) {
		if (!cid->nchildren)
			break;
		if (o->listen != cid)
			continue;
		if (o->state == CS_ACCEPT_WAIT) {
			cma_id_free(o);
		} else {
			o->listen = NULL;
			cid->nchildren--;
		}
	}
	cma_close_fd(cid);
	cma_mc_free(cid);
	cma_id_unlink(cid);
	c = to_cch(id->channel);
	pthread_mutex_unlock(&cma_lock);
	if (c->sync)
		cma_channel_free(c);
	urdma_free(cid);
	return 0;
}

EXPORT int rdma_migrate_id(struct rdma_cm_id *id,
			   struct rdma_event_channel *channel)
{
	struct cma_channel *from, *to;
	struct cma_event *e, *n;
	struct cma_id *cid;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	to = channel ? to_cch(channel) : cma_channel_new(true);
	if (!to)
		return -1;
	cma_lock_quiet(cid);
	from = to_cch(id->channel);
	if (from == to) {
		pthread_mutex_unlock(&cma_lock);
		return 0;
	}
	list_for_each_entry_safe(e, n, &from->events, node) {
		if (e->owner != cid)
			continue;
		list_del(&e->node);
		list_add_tail(&e->node, &to->events);
	}
	cma_channel_sync(from);
	cma_channel_sync(to);
	from->nids--;
	to->nids++;
	id->channel = &to->ch;
	cid->sync = to->sync;
	pthread_mutex_unlock(&cma_lock);
	if (from->sync)
		cma_channel_free(from);
	return 0;
}
