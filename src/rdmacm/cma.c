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
 */
#include "core/cm_link.h"
#include "rdmacm/cma.h"
#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- CM messages (network byte order) ---------------------------------- */

#define CMA_MAGIC 0x55434d31u /* "UCM1" */
#define CMA_CONNECT_TIMEOUT_MS 10000
#define CMA_REQ_TIMEOUT_MS 10000
#define CMA_REJ_CONSUMER 28 /* IB_CM_REJ_CONSUMER_DEFINED */

enum cma_msg_type {
	CMA_REQ = 1,
	CMA_REP,
	CMA_RTU,
	CMA_REJ,
	CMA_DREQ,
};

struct cma_msg {
	uint32_t magic;
	uint8_t type;
	uint8_t pdata_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t flow_control;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t srq;
	uint32_t qpn;
	uint32_t psn;
	uint8_t gid[16];
	uint32_t reason;
} __attribute__((packed));

_Static_assert(sizeof(struct cma_msg) == 40, "CM message header is 40 bytes");

/* ---- objects ------------------------------------------------------------ */

enum cma_state {
	CS_IDLE,
	CS_BOUND,
	CS_ADDR_RESOLVED,
	CS_ROUTE_RESOLVED,
	CS_LISTEN,
	CS_CONNECTING,  /* active: TCP connect in progress */
	CS_REQ_SENT,    /* active: waiting for REP or REJ */
	CS_REP_RCVD,    /* active, no QP of ours: waiting for rdma_establish */
	CS_ACCEPT_WAIT, /* passive child: socket accepted, REQ not read yet */
	CS_REQ_RCVD,    /* passive: CONNECT_REQUEST reported */
	CS_REP_SENT,    /* passive: waiting for RTU */
	CS_ESTABLISHED,
	CS_DISCONNECTED,
	CS_REJECTED,    /* rdma_accept then says EINVAL, not ECONNRESET */
	CS_FAILED,
};

struct cma_channel {
	struct rdma_event_channel ch;
	struct list_head events;
	int nids;
	int waiters;   /* threads inside rdma_get_cm_event */
	bool closed;   /* destroyed while waiters were inside */
	bool readable; /* the eventfd's count is 1 */
	bool sync;     /* private to one synchronous id */
};

struct cma_event {
	struct rdma_cm_event ev;
	struct list_head node;
	struct cma_id *owner; /* whose outstanding count it holds */
	/* The peer ended the connection: the id's QP goes to ERR when the
	 * application takes the event, in its own thread (never from the CM
	 * thread, which cannot know whether the QP still exists). */
	bool qp_err;
	uint8_t pdata[CMA_MAX_PDATA];
};

struct cma_id {
	struct rdma_cm_id id;
	struct list_head node;
	uint64_t handle; /* epoll key: ids are looked up, never trusted */
	enum cma_state state;
	int fd;
	bool sync;
	int outstanding; /* events handed out and not acknowledged */
	struct cma_id *listen;
	uint64_t deadline_ns;
	/* connection parameters: ours, and the peer's from its REQ/REP */
	uint32_t psn, qp_num;
	uint8_t responder_resources, initiator_depth, retry_count, rnr_retry;
	uint8_t ack_timeout, tos;
	bool afonly;
	struct cma_msg peer;
	/* a message being received */
	uint8_t rbuf[sizeof(struct cma_msg) + CMA_MAX_PDATA];
	size_t rlen;
	/* what rdma_create_qp made for the application; the QP by context
	 * and handle too, as id.qp may dangle (cma_qp_error) */
	bool own_cqs;
	struct ibv_qp *qp_made;
	struct ibv_context *qp_ctx;
	uint32_t handle_made;
	struct ibv_sa_path_rec path;
	/* rdma_create_ep on a listener: the QP each request gets */
	bool has_qp_init;
	struct ibv_qp_init_attr qp_init;
	struct ibv_pd *ep_pd;
};

static pthread_mutex_t cma_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cma_cond = PTHREAD_COND_INITIALIZER;
static struct list_head cma_ids = LIST_HEAD_INIT(cma_ids);
static uint64_t cma_next_handle = 1;
static int cma_epfd = -1, cma_wakefd = -1;
static struct ibv_context *cma_ctx;
static struct ibv_pd *cma_pd;
static struct ibv_device_attr cma_dev_attr;
static enum ibv_mtu cma_mtu = IBV_MTU_1024;

static struct cma_id *to_cid(struct rdma_cm_id *id)
{
	return container_of(id, struct cma_id, id);
}

static struct cma_channel *to_cch(struct rdma_event_channel *ch)
{
	return container_of(ch, struct cma_channel, ch);
}

/* urdma's libibverbs beyond the verbs API (core/cm_link.h), or NULL. */
static const struct verbs_ex_private *cma_link(void)
{
	struct ibv_context *ctx = __atomic_load_n(&cma_ctx, __ATOMIC_ACQUIRE);
	struct verbs_context *v = ctx ? verbs_get_ctx(ctx) : NULL;

	if (!v || !v->priv || v->priv->magic != URDMA_CM_LINK_MAGIC)
		return NULL;
	return v->priv;
}

/* The application sets up a connection: what its QPs hold back for their
 * next message goes now (core/cm_link.h). */
static void cma_release_held(void)
{
	const struct verbs_ex_private *link = cma_link();

	if (link)
		link->release_held();
}

/* ---- initialisation and the CM thread ----------------------------------- */

static void cma_handle_io(struct cma_id *cid);
static void cma_expire(uint64_t now);
static void cma_closed(struct cma_id *cid, int e);
static void cma_qp_error(struct cma_id *cid);
static void cma_id_free(struct cma_id *cid);

static int cma_next_timeout_ms(void)
{
	uint64_t first = 0, now = cma_now_ns();
	struct cma_id *cid;

	list_for_each_entry(cid, &cma_ids, node)
		if (cid->deadline_ns && (!first || cid->deadline_ns < first))
			first = cid->deadline_ns;
	if (!first)
		return -1;
	return first <= now ? 0 : (int)((first - now) / 1000000 + 1);
}

static struct cma_id *cma_find(uint64_t handle)
{
	struct cma_id *cid;

	list_for_each_entry(cid, &cma_ids, node)
		if (cid->handle == handle)
			return cid;
	return NULL;
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
		cma_expire(cma_now_ns());
	}
	return NULL;
}

/* Wake the CM thread so that it recomputes its timeout. */
static void cma_kick(void)
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
	if (ibv_query_device(cma_ctx, &cma_dev_attr) ||
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
	ibv_close_device(cma_ctx);
	cma_ctx = NULL;
	return cma_err(n);
}

static int cma_init(void)
{
	int ret;

	pthread_mutex_lock(&cma_lock);
	ret = cma_init_locked();
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- event channels ----------------------------------------------------- */

static struct cma_channel *cma_channel_new(bool sync)
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
static void cma_channel_sync(struct cma_channel *c)
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

static void cma_channel_free(struct cma_channel *c)
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

static struct cma_event *cma_post(struct cma_id *cid,
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
	if (m) {
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
		fl = fcntl(channel->fd, F_GETFL);
		r = fl < 0 ? -1 : (fl & O_NONBLOCK) ? cma_err(EAGAIN) :
						       poll(&pfd, 1, -1);
		pthread_mutex_lock(&cma_lock);
		c->waiters--;
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
		v = (uint32_t)cma_now_ns() ^ (uint32_t)getpid() << 8;
	return v & 0xffffff;
}

/* Under cma_lock. */
static struct cma_id *cma_id_new(struct cma_channel *c, void *context,
				 enum rdma_port_space ps)
{
	struct cma_id *cid = urdma_zalloc(sizeof(*cid));

	if (!cid)
		return NULL;
	cid->id.channel = &c->ch;
	cid->id.context = context;
	cid->id.ps = ps;
	cid->id.qp_type = IBV_QPT_RC;
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
	return cid;
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
		/* UD queue pairs do not exist yet. */
		return cma_err(EOPNOTSUPP);
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
static void cma_close_fd(struct cma_id *cid)
{
	if (cid->fd < 0)
		return;
	epoll_ctl(cma_epfd, EPOLL_CTL_DEL, cid->fd, NULL);
	close(cid->fd);
	cid->fd = -1;
	cid->deadline_ns = 0;
}

static int cma_send(struct cma_id *cid, enum cma_msg_type type,
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
	m->psn = htonl(cid->psn);
	gid = cid->id.route.addr.addr.ibaddr.sgid;
	memcpy(m->gid, gid.raw, 16);
	m->reason = htonl(reason);
	if (len)
		memcpy(m + 1, pdata, len);
	r = send(cid->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (r == (ssize_t)n)
		return 0;
	/* A CM message is far smaller than a socket buffer: a short send
	 * means the connection is gone. */
	return r < 0 ? -errno : -ECONNRESET;
}

/* ---- addresses ---------------------------------------------------------- */

static socklen_t sa_len(const struct sockaddr *sa)
{
	switch (sa->sa_family) {
	case AF_INET:
		return sizeof(struct sockaddr_in);
	case AF_INET6:
		return sizeof(struct sockaddr_in6);
	default:
		return 0;
	}
}

static void sa_to_gid(const struct sockaddr *sa, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (sa->sa_family == AF_INET) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

static bool sa_is_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr ==
		       htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

static uint16_t sa_port(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((const struct sockaddr_in6 *)sa)->sin6_port;
	return 0;
}

/* The index of gid in the device's table, or 0. */
static uint8_t cma_gid_index(const union ibv_gid *gid)
{
	struct ibv_port_attr pa;
	union ibv_gid g;

	if (ibv_query_port(cma_ctx, 1, &pa))
		return 0;
	for (int i = 0; i < pa.gid_tbl_len; i++)
		if (!ibv_query_gid(cma_ctx, 1, i, &g) && !memcmp(&g, gid, 16))
			return i;
	return 0;
}

/* Record the socket's addresses in the route and bind the id to the
 * device.  Under cma_lock. */
static void cma_set_route(struct cma_id *cid, bool peer)
{
	struct rdma_addr *a = &cid->id.route.addr;
	socklen_t l = sizeof(a->src_storage);

	getsockname(cid->fd, &a->src_addr, &l);
	if (peer) {
		l = sizeof(a->dst_storage);
		getpeername(cid->fd, &a->dst_addr, &l);
	}
	sa_to_gid(&a->src_addr, &a->addr.ibaddr.sgid);
	sa_to_gid(&a->dst_addr, &a->addr.ibaddr.dgid);
	a->addr.ibaddr.pkey = htons(0xffff);
	if (!sa_is_any(&a->src_addr)) {
		cid->id.verbs = cma_ctx;
		cid->id.port_num = 1;
	}
}

static void cma_fill_path(struct cma_id *cid)
{
	struct ibv_sa_path_rec *p = &cid->path;

	memset(p, 0, sizeof(*p));
	p->sgid = cid->id.route.addr.addr.ibaddr.sgid;
	p->dgid = cid->id.route.addr.addr.ibaddr.dgid;
	p->pkey = htons(0xffff);
	p->mtu = cma_mtu;
	p->mtu_selector = 2; /* exactly */
	p->hop_limit = 64;
	p->traffic_class = cid->tos;
	p->reversible = 1;
	p->numb_path = 1;
	p->packet_life_time = cid->ack_timeout > 0 ? cid->ack_timeout - 1 : 0;
	cid->id.route.path_rec = p;
	cid->id.route.num_paths = 1;
}

static int cma_socket(struct cma_id *cid, int family)
{
	int one = 1;

	cid->fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (cid->fd < 0)
		return -1;
	/* A server restarts on its port although connections of its last
	 * run are in TIME_WAIT.  (So two ids may both bind a port that
	 * neither listens on; a listener's port is exclusive.) */
	setsockopt(cid->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(cid->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (family == AF_INET6 && cid->afonly)
		setsockopt(cid->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (cid->tos)
		setsockopt(cid->fd, IPPROTO_IP, IP_TOS, &(int){ cid->tos },
			   sizeof(int));
	return 0;
}

static int cma_bind_locked(struct cma_id *cid, const struct sockaddr *addr)
{
	socklen_t len;
	int e;

	if (cid->state != CS_IDLE)
		return cma_err(EINVAL);
	if (addr->sa_family == AF_IB)
		return cma_err(EAFNOSUPPORT);
	len = sa_len(addr);
	if (!len)
		return cma_err(EAFNOSUPPORT);
	if (cma_socket(cid, addr->sa_family))
		return -1;
	if (bind(cid->fd, addr, len)) {
		e = errno;
		close(cid->fd);
		cid->fd = -1;
		return cma_err(e);
	}
	cma_set_route(cid, false);
	cid->state = CS_BOUND;
	return 0;
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	int ret;

	if (!id || !addr)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma_lock);
	ret = cma_bind_locked(to_cid(id), addr);
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- synchronous ids ---------------------------------------------------- */

/* Wait on a synchronous id's private channel for the event that completes an
 * operation; keep it in id->event (as rdma-core does) until the next one. */
static int cma_sync_wait(struct cma_id *cid, enum rdma_cm_event_type want)
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

/* ---- address and route resolution --------------------------------------- */

/* The source address the routing table picks for dst. */
static int cma_route_lookup(const struct sockaddr *dst, struct sockaddr_storage *src)
{
	socklen_t l = sizeof(*src);
	int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), e = 0;

	if (fd < 0)
		return -errno;
	if (connect(fd, dst, sa_len(dst)) || getsockname(fd, (struct sockaddr *)src, &l))
		e = -errno;
	close(fd);
	return e;
}

EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
			     struct sockaddr *dst_addr, int timeout_ms)
{
	struct sockaddr_storage src;
	struct cma_id *cid;
	int e;

	cma_release_held();
	if (!id || !dst_addr)
		return cma_err(EINVAL);
	if (dst_addr->sa_family == AF_IB ||
	    (src_addr && src_addr->sa_family == AF_IB))
		return cma_err(EAFNOSUPPORT);
	if (!sa_len(dst_addr) ||
	    (src_addr && src_addr->sa_family != dst_addr->sa_family &&
	     !(src_addr->sa_family == AF_INET6 && sa_is_any(src_addr))))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state == CS_IDLE && src_addr && !sa_is_any(src_addr) &&
	    cma_bind_locked(cid, src_addr)) {
		pthread_mutex_unlock(&cma_lock);
		return -1;
	}
	if (cid->state != CS_IDLE && cid->state != CS_BOUND) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	memcpy(&id->route.addr.dst_storage, dst_addr, sa_len(dst_addr));
	e = cma_route_lookup(dst_addr, &src);
	if (!e && cid->state == CS_IDLE) {
		/* A wildcard src may still name the port (same offset in v6). */
		((struct sockaddr_in *)&src)->sin_port =
			src_addr ? sa_port(src_addr) : 0;
		if (cma_bind_locked(cid, (struct sockaddr *)&src))
			e = -errno;
	}
	if (e) {
		cma_post(cid, RDMA_CM_EVENT_ADDR_ERROR, e, NULL);
	} else {
		cma_set_route(cid, false);
		/* A wildcard-bound socket: the route's source is the address. */
		if (sa_is_any(&id->route.addr.src_addr)) {
			uint16_t port = sa_port(&id->route.addr.src_addr);

			memcpy(&id->route.addr.src_storage, &src, sa_len((struct sockaddr *)&src));
			((struct sockaddr_in *)&id->route.addr.src_storage)->sin_port = port;
			sa_to_gid(&id->route.addr.src_addr, &id->route.addr.addr.ibaddr.sgid);
			id->verbs = cma_ctx;
		}
		cid->state = CS_ADDR_RESOLVED;
		cma_post(cid, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL);
	}
	pthread_mutex_unlock(&cma_lock);
	(void)timeout_ms; /* a routing lookup answers at once */
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct cma_id *cid;

	(void)timeout_ms;
	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	cma_fill_path(cid);
	cid->state = CS_ROUTE_RESOLVED;
	cma_post(cid, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL);
	pthread_mutex_unlock(&cma_lock);
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}

/* ---- queue pairs -------------------------------------------------------- */

static void cma_qp_attr_init(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	a->qp_state = IBV_QPS_INIT;
	a->pkey_index = 0;
	a->port_num = cid->id.port_num ? cid->id.port_num : 1;
	a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		IBV_QP_ACCESS_FLAGS;
}

static void cma_qp_attr_rtr(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	struct rdma_ib_addr *ib = &cid->id.route.addr.addr.ibaddr;

	a->qp_state = IBV_QPS_RTR;
	a->path_mtu = cma_mtu;
	a->dest_qp_num = ntohl(cid->peer.qpn) & 0xffffff;
	a->rq_psn = ntohl(cid->peer.psn) & 0xffffff;
	a->max_dest_rd_atomic = cid->responder_resources ? cid->responder_resources : 1;
	a->min_rnr_timer = 12;
	memset(&a->ah_attr, 0, sizeof(a->ah_attr));
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, cid->peer.gid, 16);
	a->ah_attr.grh.sgid_index = cma_gid_index(&ib->sgid);
	a->ah_attr.grh.hop_limit = 64;
	a->ah_attr.grh.traffic_class = cid->tos;
	a->ah_attr.port_num = cid->id.port_num ? cid->id.port_num : 1;
	*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

static void cma_qp_attr_rts(struct cma_id *cid, struct ibv_qp_attr *a, int *mask)
{
	a->qp_state = IBV_QPS_RTS;
	a->sq_psn = cid->psn;
	a->timeout = cid->ack_timeout;
	a->retry_cnt = cid->retry_count;
	a->rnr_retry = cid->rnr_retry;
	a->max_rd_atomic = cid->initiator_depth ? cid->initiator_depth : 1;
	*mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
		IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
}

static int cma_modify(struct cma_id *cid,
		      void (*fill)(struct cma_id *, struct ibv_qp_attr *, int *))
{
	struct ibv_qp_attr a;
	int mask, ret;

	memset(&a, 0, sizeof(a));
	fill(cid, &a, &mask);
	ret = ibv_modify_qp(cid->id.qp, &a, mask);
	return ret ? -ret : 0;
}

/* Move our QP to RTR and RTS with the peer's parameters. */
static int cma_qp_connect(struct cma_id *cid)
{
	int ret;

	if (!cid->id.qp)
		return 0;
	ret = cma_modify(cid, cma_qp_attr_rtr);
	if (!ret)
		ret = cma_modify(cid, cma_qp_attr_rts);
	return ret;
}

/* The id's QP to ERR.  The application may have destroyed the QP that
 * rdma_create_qp made with ibv_destroy_qp, leaving id.qp dangling, so that
 * one is moved by libibverbs, which finds it by address and handle if it
 * still exists (core/cm_link.h). */
static void cma_qp_error(struct cma_id *cid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	const struct verbs_ex_private *link = cma_link();

	if (!cid->id.qp)
		return;
	if (cid->id.qp == cid->qp_made && link)
		link->qp_error_if_live(cid->qp_ctx, cid->qp_made, cid->handle_made);
	else
		ibv_modify_qp(cid->id.qp, &a, IBV_QP_STATE);
}

EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr,
			     int *qp_attr_mask)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id || !qp_attr || !qp_attr_mask)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	switch (qp_attr->qp_state) {
	case IBV_QPS_INIT:
		if (!id->verbs)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_init(cid, qp_attr, qp_attr_mask);
		break;
	case IBV_QPS_RTR:
		if (!cid->peer.magic)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_rtr(cid, qp_attr, qp_attr_mask);
		break;
	case IBV_QPS_RTS:
		if (!cid->peer.magic)
			ret = cma_err(EINVAL);
		else
			cma_qp_attr_rts(cid, qp_attr, qp_attr_mask);
		break;
	default:
		ret = cma_err(EINVAL);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

static struct ibv_pd *cma_default_pd(void)
{
	if (!cma_pd)
		cma_pd = ibv_alloc_pd(cma_ctx);
	return cma_pd;
}

static void cma_free_cqs(struct cma_id *cid)
{
	struct rdma_cm_id *id = &cid->id;

	if (!cid->own_cqs)
		return;
	if (id->send_cq && id->send_cq != id->recv_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	if (id->recv_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
	cid->own_cqs = false;
}

/* CQs, each with its completion channel, for a QP created without them:
 * what <rdma/rdma_verbs.h>'s rdma_get_send_comp/rdma_get_recv_comp wait on. */
static int cma_make_cqs(struct cma_id *cid, struct ibv_context *ctx,
			uint32_t send_wr, uint32_t recv_wr)
{
	struct rdma_cm_id *id = &cid->id;

	cid->own_cqs = true;
	id->send_cq_channel = ibv_create_comp_channel(ctx);
	id->recv_cq_channel = ibv_create_comp_channel(ctx);
	if (id->send_cq_channel && id->recv_cq_channel) {
		id->send_cq = ibv_create_cq(ctx, send_wr ? send_wr : 1, id,
					    id->send_cq_channel, 0);
		id->recv_cq = ibv_create_cq(ctx, recv_wr ? recv_wr : 1, id,
					    id->recv_cq_channel, 0);
	}
	if (id->send_cq && id->recv_cq)
		return 0;
	cma_free_cqs(cid);
	return -1;
}

static int cma_qp_created(struct cma_id *cid, struct ibv_qp *qp, struct ibv_pd *pd)
{
	cid->id.qp = qp;
	cid->id.pd = pd;
	cid->qp_made = qp;
	cid->qp_ctx = qp->context;
	cid->handle_made = qp->handle;
	if (!cid->id.verbs)
		cid->id.verbs = qp->context;
	if (cma_modify(cid, cma_qp_attr_init)) {
		int e = errno;

		ibv_destroy_qp(qp);
		cid->id.qp = cid->qp_made = NULL;
		return cma_err(e);
	}
	return 0;
}

EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id,
			     struct ibv_qp_init_attr_ex *attr)
{
	struct cma_id *cid;
	struct ibv_qp *qp;
	int ret;

	if (!id || !attr || id->qp)
		return cma_err(EINVAL);
	if (attr->qp_type != IBV_QPT_RC)
		return cma_err(EOPNOTSUPP);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd ? id->pd : id->verbs ? cma_default_pd() : NULL;
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (!attr->pd || (id->verbs && attr->pd->context != id->verbs &&
			  id->verbs != cma_ctx)) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	if ((!attr->send_cq || !attr->recv_cq) &&
	    cma_make_cqs(cid, attr->pd->context, attr->cap.max_send_wr,
			 attr->cap.max_recv_wr)) {
		pthread_mutex_unlock(&cma_lock);
		return -1;
	}
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (!attr->srq && id->srq)
		attr->srq = id->srq;
	qp = ibv_create_qp_ex(attr->pd->context, attr);
	if (!qp) {
		int e = errno;

		cma_free_cqs(cid);
		pthread_mutex_unlock(&cma_lock);
		return cma_err(e);
	}
	if (!cid->own_cqs) {
		id->send_cq = attr->send_cq;
		id->recv_cq = attr->recv_cq;
	}
	ret = cma_qp_created(cid, qp, attr->pd);
	if (ret)
		cma_free_cqs(cid);
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex ax;
	int ret;

	if (!id || !qp_init_attr)
		return cma_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, qp_init_attr, sizeof(*qp_init_attr));
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd;
	ret = rdma_create_qp_ex(id, &ax);
	if (!ret) {
		qp_init_attr->send_cq = ax.send_cq;
		qp_init_attr->recv_cq = ax.recv_cq;
		qp_init_attr->cap = ax.cap;
	}
	return ret;
}

EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct cma_id *cid;

	if (!id || !id->qp)
		return;
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	ibv_destroy_qp(id->qp);
	id->qp = cid->qp_made = NULL;
	cma_free_cqs(cid);
	pthread_mutex_unlock(&cma_lock);
}

EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id,
			      struct ibv_srq_init_attr_ex *attr)
{
	struct ibv_srq *srq;

	if (!id || !attr)
		return cma_err(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		pthread_mutex_lock(&cma_lock);
		attr->pd = id->pd ? id->pd : id->verbs ? cma_default_pd() : NULL;
		pthread_mutex_unlock(&cma_lock);
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (!attr->pd)
		return cma_err(EINVAL);
	srq = ibv_create_srq_ex(attr->pd->context, attr);
	if (!srq)
		return -1;
	id->srq = srq;
	id->pd = attr->pd;
	return 0;
}

EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
			   struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex ax;
	int ret;

	if (!id || !attr)
		return cma_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	ax.srq_context = attr->srq_context;
	ax.attr = attr->attr;
	ax.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
	ax.srq_type = IBV_SRQT_BASIC;
	ax.pd = pd;
	ret = rdma_create_srq_ex(id, &ax);
	if (!ret)
		attr->attr = ax.attr;
	return ret;
}

EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
}

/* ---- listening and connecting ------------------------------------------- */

static int cma_watch(struct cma_id *cid, uint32_t events, int op)
{
	struct epoll_event ev = { .events = events, .data.u64 = cid->handle };

	return epoll_ctl(cma_epfd, op, cid->fd, &ev);
}

EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct cma_id *cid;
	int e;

	cma_release_held();
	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state == CS_IDLE) {
		struct sockaddr_in any = { .sin_family = AF_INET };

		if (cma_bind_locked(cid, (struct sockaddr *)&any))
			goto fail;
	}
	if (cid->state != CS_BOUND) {
		errno = EINVAL;
		goto fail;
	}
	if (listen(cid->fd, backlog > 0 ? backlog : SOMAXCONN) ||
	    cma_watch(cid, EPOLLIN, EPOLL_CTL_ADD))
		goto fail;
	cid->state = CS_LISTEN;
	pthread_mutex_unlock(&cma_lock);
	return 0;
fail:
	e = errno;
	pthread_mutex_unlock(&cma_lock);
	return cma_err(e);
}

static bool cma_pdata_ok(const struct rdma_conn_param *p)
{
	return !p || (p->private_data_len <= CMA_MAX_PDATA &&
		      (!p->private_data_len || p->private_data));
}

static void cma_take_param(struct cma_id *cid, const struct rdma_conn_param *p,
			   bool passive)
{
	if (!p)
		return;
	cid->responder_resources = p->responder_resources < cma_dev_attr.max_qp_rd_atom ?
					   p->responder_resources :
					   cma_dev_attr.max_qp_rd_atom;
	cid->initiator_depth = p->initiator_depth < cma_dev_attr.max_qp_init_rd_atom ?
				       p->initiator_depth :
				       cma_dev_attr.max_qp_init_rd_atom;
	if (!passive) /* "ignored when accepting": the requester's count */
		cid->retry_count = p->retry_count > 7 ? 7 : p->retry_count;
	cid->rnr_retry = p->rnr_retry_count > 7 ? 7 : p->rnr_retry_count;
	cid->qp_num = p->qp_num & 0xffffff; /* for a QP that is not ours */
}

EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *cid;
	int e = 0;

	cma_release_held();
	if (!id || !cma_pdata_ok(conn_param))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_ROUTE_RESOLVED && cid->state != CS_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	if (!id->qp && !conn_param) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	cma_take_param(cid, conn_param, false);
	/* The REQ's private data waits in rbuf until the socket connects. */
	cid->rlen = conn_param ? conn_param->private_data_len : 0;
	if (cid->rlen)
		memcpy(cid->rbuf, conn_param->private_data, cid->rlen);
	if (connect(cid->fd, &id->route.addr.dst_addr,
		    sa_len(&id->route.addr.dst_addr)) && errno != EINPROGRESS)
		e = errno;
	cid->state = CS_CONNECTING;
	if (e) {
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, -e, NULL);
	} else if (cma_watch(cid, EPOLLOUT, EPOLL_CTL_ADD)) {
		e = errno;
		cid->state = CS_ROUTE_RESOLVED;
		pthread_mutex_unlock(&cma_lock);
		return cma_err(e);
	} else {
		cid->deadline_ns = cma_now_ns() + CMA_CONNECT_TIMEOUT_MS * 1000000ull;
		cma_kick();
	}
	pthread_mutex_unlock(&cma_lock);
	if (!cid->sync)
		return 0;
	return cma_sync_wait(cid, id->qp ? RDMA_CM_EVENT_ESTABLISHED :
					   RDMA_CM_EVENT_CONNECT_RESPONSE);
}

EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *cid;
	int ret;

	cma_release_held();
	if (!id || !cma_pdata_ok(conn_param))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REQ_RCVD || (!id->qp && !conn_param)) {
		ret = cid->state == CS_FAILED ? ECONNRESET : EINVAL;
		pthread_mutex_unlock(&cma_lock);
		return cma_err(ret);
	}
	if (conn_param) {
		cma_take_param(cid, conn_param, true);
	} else {
		/* As many as the requester can use. */
		if (cid->peer.initiator_depth < cid->responder_resources)
			cid->responder_resources = cid->peer.initiator_depth;
		if (cid->peer.responder_resources < cid->initiator_depth)
			cid->initiator_depth = cid->peer.responder_resources;
	}
	ret = cma_qp_connect(cid);
	if (!ret)
		ret = cma_send(cid, CMA_REP, conn_param ? conn_param->private_data : NULL,
			       conn_param ? conn_param->private_data_len : 0, 0);
	if (ret) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(-ret);
	}
	cid->state = CS_REP_SENT;
	pthread_mutex_unlock(&cma_lock);
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data,
		       uint8_t private_data_len)
{
	struct cma_id *cid;
	int ret;

	if (!id || private_data_len > CMA_MAX_PDATA ||
	    (private_data_len && !private_data))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REQ_RCVD) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	ret = cma_send(cid, CMA_REJ, private_data, private_data_len,
		       CMA_REJ_CONSUMER);
	cma_close_fd(cid);
	cid->state = CS_REJECTED;
	pthread_mutex_unlock(&cma_lock);
	return ret ? cma_err(-ret) : 0;
}

EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data,
			   uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct cma_id *cid;
	int ret;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REP_RCVD) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	ret = cma_send(cid, CMA_RTU, NULL, 0, 0);
	if (!ret)
		cid->state = CS_ESTABLISHED;
	pthread_mutex_unlock(&cma_lock);
	return ret ? cma_err(-ret) : 0;
}

/* The connection is over: report it once; by_peer: the QP goes to ERR as
 * the application takes the event.  Under cma_lock. */
static void cma_disconnected(struct cma_id *cid, bool by_peer)
{
	struct cma_event *e;

	cma_close_fd(cid);
	cid->state = CS_DISCONNECTED;
	e = cma_post(cid, RDMA_CM_EVENT_DISCONNECTED, 0, NULL);
	if (e)
		e->qp_err = by_peer;
}

EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	switch (cid->state) {
	case CS_ESTABLISHED:
	case CS_REP_SENT:
	case CS_REP_RCVD:
		/* Flushed first, as the peer will flush when told. */
		cma_qp_error(cid);
		cma_send(cid, CMA_DREQ, NULL, 0, 0);
		cma_disconnected(cid, false);
		break;
	case CS_DISCONNECTED: /* the peer went first: nothing more to say */
		break;
	default:
		ret = cma_err(EINVAL);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- the CM thread's side ----------------------------------------------- */

/* A new connection on a listener: a child id, unseen until its REQ. */
static void cma_accept_one(struct cma_id *lis)
{
	struct cma_channel *c;
	struct cma_id *cid;
	int fd = accept4(lis->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	int one = 1;

	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			urdma_warn("accept: %s", strerror(errno));
		return;
	}
	c = lis->sync ? cma_channel_new(true) : to_cch(lis->id.channel);
	cid = c ? cma_id_new(c, lis->id.context, lis->id.ps) : NULL;
	if (!cid) {
		if (c && c->sync)
			cma_channel_free(c);
		close(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	cid->fd = fd;
	cid->listen = lis;
	cid->state = CS_ACCEPT_WAIT;
	cid->tos = lis->tos;
	cid->ack_timeout = lis->ack_timeout;
	cma_set_route(cid, true);
	cid->deadline_ns = cma_now_ns() + CMA_REQ_TIMEOUT_MS * 1000000ull;
	if (cma_watch(cid, EPOLLIN, EPOLL_CTL_ADD))
		cma_id_free(cid);
}

/* Free an id the application never saw.  Under cma_lock. */
static void cma_id_free(struct cma_id *cid)
{
	struct cma_channel *c = to_cch(cid->id.channel);

	cma_close_fd(cid);
	list_del(&cid->node);
	c->nids--;
	if (c->sync)
		cma_channel_free(c);
	urdma_free(cid);
}

/* Read what the socket has.  1: a whole message in rbuf, 0: not yet,
 * -errno: the connection ended or sent garbage (-EPROTO). */
static int cma_recv(struct cma_id *cid)
{
	struct cma_msg *m = (struct cma_msg *)cid->rbuf;
	size_t want = sizeof(*m);

	for (;;) {
		ssize_t r;

		if (cid->rlen >= sizeof(*m)) {
			if (ntohl(m->magic) != CMA_MAGIC || m->pdata_len > CMA_MAX_PDATA ||
			    m->type < CMA_REQ || m->type > CMA_DREQ)
				return -EPROTO;
			want = sizeof(*m) + m->pdata_len;
			if (cid->rlen == want)
				return 1;
		}
		r = recv(cid->fd, cid->rbuf + cid->rlen, want - cid->rlen, 0);
		if (r > 0) {
			cid->rlen += r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		return -errno;
	}
}

static void cma_connected_out(struct cma_id *cid)
{
	int err = 0;
	socklen_t l = sizeof(err);
	uint8_t pdata[CMA_MAX_PDATA];
	size_t plen = cid->rlen;

	getsockopt(cid->fd, SOL_SOCKET, SO_ERROR, &err, &l);
	memcpy(pdata, cid->rbuf, plen);
	cid->rlen = 0;
	if (!err) {
		cma_set_route(cid, true);
		err = -cma_send(cid, CMA_REQ, pdata, plen, 0);
	}
	if (err || cma_watch(cid, EPOLLIN, EPOLL_CTL_MOD)) {
		cma_close_fd(cid);
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, -(err ? err : errno), NULL);
		return;
	}
	cid->deadline_ns = 0;
	cid->state = CS_REQ_SENT;
}

static void cma_handle_msg(struct cma_id *cid, const struct cma_msg *m)
{
	int ret;

	switch (cid->state) {
	case CS_ACCEPT_WAIT:
		if (m->type != CMA_REQ)
			break;
		cid->peer = *m;
		cid->deadline_ns = 0;
		cid->state = CS_REQ_RCVD;
		{
			struct cma_event *e = cma_post(cid, RDMA_CM_EVENT_CONNECT_REQUEST,
						       0, m);
			if (e) {
				/* Reported on the listener, which counts it. */
				e->ev.listen_id = &cid->listen->id;
				e->owner = cid->listen;
				if (cid->sync) {
					/* rdma_get_request reads the listener's
					 * channel: move it there. */
					struct cma_channel *c = to_cch(cid->id.channel);
					struct cma_channel *lc = to_cch(cid->listen->id.channel);
					list_del(&e->node);
					cma_channel_sync(c);
					list_add_tail(&e->node, &lc->events);
					cma_channel_sync(lc);
				}
			}
		}
		return;
	case CS_REQ_SENT:
		if (m->type == CMA_REJ) {
			cma_close_fd(cid);
			cid->state = CS_REJECTED;
			cma_post(cid, RDMA_CM_EVENT_REJECTED, (int)ntohl(m->reason), m);
			return;
		}
		if (m->type != CMA_REP)
			break;
		cid->peer = *m;
		if (!cid->id.qp) {
			cid->state = CS_REP_RCVD;
			cma_post(cid, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, m);
			return;
		}
		ret = cma_qp_connect(cid);
		if (!ret)
			ret = cma_send(cid, CMA_RTU, NULL, 0, 0);
		if (ret) {
			cma_qp_error(cid);
			cma_close_fd(cid);
			cid->state = CS_FAILED;
			cma_post(cid, RDMA_CM_EVENT_CONNECT_ERROR, ret, NULL);
			return;
		}
		cid->state = CS_ESTABLISHED;
		cma_post(cid, RDMA_CM_EVENT_ESTABLISHED, 0, m);
		return;
	case CS_REP_SENT:
		if (m->type == CMA_RTU) {
			cid->state = CS_ESTABLISHED;
			cma_post(cid, RDMA_CM_EVENT_ESTABLISHED, 0, NULL);
			return;
		}
		if (m->type == CMA_DREQ) {
			cma_disconnected(cid, true);
			return;
		}
		break;
	case CS_ESTABLISHED:
	case CS_REP_RCVD:
		if (m->type == CMA_DREQ) {
			cma_disconnected(cid, true);
			return;
		}
		break;
	default:
		break;
	}
	urdma_warn("cm id %p: unexpected CM message %u in state %d",
		   (void *)&cid->id, m->type, cid->state);
	cma_closed(cid, -EPROTO);
}

/* The socket ended (or broke the protocol) with error e.  Under cma_lock. */
static void cma_closed(struct cma_id *cid, int e)
{
	switch (cid->state) {
	case CS_ACCEPT_WAIT: /* nobody has seen it */
		cma_id_free(cid);
		return;
	case CS_CONNECTING:
	case CS_REQ_SENT:
		cma_close_fd(cid);
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, e, NULL);
		return;
	case CS_REQ_RCVD:
	case CS_REP_SENT: {
		struct cma_event *ev;

		cma_close_fd(cid);
		cid->state = CS_FAILED;
		ev = cma_post(cid, RDMA_CM_EVENT_CONNECT_ERROR, e, NULL);
		if (ev)
			ev->qp_err = true;
		return;
	}
	case CS_ESTABLISHED:
	case CS_REP_RCVD:
		cma_disconnected(cid, true);
		return;
	default:
		cma_close_fd(cid);
	}
}

static void cma_handle_io(struct cma_id *cid)
{
	int r;

	if (cid->state == CS_LISTEN) {
		cma_accept_one(cid);
		return;
	}
	if (cid->state == CS_CONNECTING) {
		cma_connected_out(cid);
		return;
	}
	while ((r = cma_recv(cid)) == 1) {
		uint8_t buf[sizeof(struct cma_msg) + CMA_MAX_PDATA];
		uint64_t handle = cid->handle;

		memcpy(buf, cid->rbuf, cid->rlen);
		cid->rlen = 0;
		cma_handle_msg(cid, (struct cma_msg *)buf);
		if (!cma_find(handle) || cid->fd < 0)
			return; /* closed (or freed) on the way */
	}
	if (r < 0)
		cma_closed(cid, r);
}

static void cma_expire(uint64_t now)
{
	struct cma_id *cid, *n;

	list_for_each_entry_safe(cid, n, &cma_ids, node) {
		if (!cid->deadline_ns || cid->deadline_ns > now)
			continue;
		cid->deadline_ns = 0;
		cma_closed(cid, -ETIMEDOUT);
	}
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

EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct cma_id *cid, *o, *n;
	struct cma_channel *c;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	if (cid->sync && id->event) {
		rdma_ack_cm_event(id->event);
		id->event = NULL;
	}
	pthread_mutex_lock(&cma_lock);
	while (cid->outstanding)
		pthread_cond_wait(&cma_cond, &cma_lock);
	cma_drop_events(cid);
	if (cid->state == CS_REQ_RCVD)
		cma_send(cid, CMA_REJ, NULL, 0, CMA_REJ_CONSUMER);
	/* Children whose requests were reported stay the application's;
	 * those still waiting for their REQ go with the listener. */
	list_for_each_entry_safe(o, n, &cma_ids, node) {
		if (o->listen != cid)
			continue;
		if (o->state == CS_ACCEPT_WAIT)
			cma_id_free(o);
		else
			o->listen = NULL;
	}
	cma_close_fd(cid);
	list_del(&cid->node);
	c = to_cch(id->channel);
	c->nids--;
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
	if (cid->sync && id->event) {
		rdma_ack_cm_event(id->event);
		id->event = NULL;
	}
	pthread_mutex_lock(&cma_lock);
	while (cid->outstanding)
		pthread_cond_wait(&cma_cond, &cma_lock);
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

/* ---- endpoints (the synchronous helpers of <rdma/rdma_verbs.h>) ---------- */

EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res,
			  struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cm_id;
	struct cma_id *cid;
	int ret;

	if (!id || !res)
		return cma_err(EINVAL);
	ret = rdma_create_id(NULL, &cm_id, NULL,
			     res->ai_port_space ? res->ai_port_space : RDMA_PS_TCP);
	if (ret)
		return ret;
	cid = to_cid(cm_id);
	if (qp_init_attr)
		qp_init_attr->qp_type = res->ai_qp_type ? res->ai_qp_type : IBV_QPT_RC;
	if (res->ai_flags & RAI_PASSIVE) {
		ret = res->ai_src_addr ? rdma_bind_addr(cm_id, res->ai_src_addr) :
					 cma_err(EINVAL);
		if (ret)
			goto fail;
		if (qp_init_attr) {
			cid->has_qp_init = true;
			cid->qp_init = *qp_init_attr;
			cid->ep_pd = pd;
		}
		*id = cm_id;
		return 0;
	}
	ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
	if (!ret)
		ret = rdma_resolve_route(cm_id, 2000);
	if (!ret && qp_init_attr)
		ret = rdma_create_qp(cm_id, pd, qp_init_attr);
	if (ret)
		goto fail;
	*id = cm_id;
	return 0;
fail:
	ret = errno;
	rdma_destroy_id(cm_id);
	return cma_err(ret);
}

EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct cma_id *lis;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *child;
	int ret;

	if (!listen || !id)
		return cma_err(EINVAL);
	lis = to_cid(listen);
	if (!lis->sync || lis->state != CS_LISTEN)
		return cma_err(EINVAL);
	ret = rdma_get_cm_event(listen->channel, &ev);
	if (ret)
		return ret;
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
		rdma_ack_cm_event(ev);
		return cma_err(EPROTO);
	}
	child = ev->id;
	/* The event stays readable as child->event until the next step. */
	if (lis->has_qp_init) {
		struct ibv_qp_init_attr a = lis->qp_init;

		ret = rdma_create_qp(child, lis->ep_pd, &a);
		if (ret) {
			ret = errno;
			rdma_ack_cm_event(ev);
			rdma_reject(child, NULL, 0);
			rdma_destroy_id(child);
			return cma_err(ret);
		}
	}
	pthread_mutex_lock(&cma_lock);
	/* Count it against the child from now on. */
	container_of(ev, struct cma_event, ev)->owner = to_cid(child);
	lis->outstanding--;
	to_cid(child)->outstanding++;
	pthread_cond_broadcast(&cma_cond);
	pthread_mutex_unlock(&cma_lock);
	child->event = ev;
	*id = child;
	return 0;
}

/* ---- options, ports, devices, and what is not supported ------------------ */

EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname,
			   void *optval, size_t optlen)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id || !optval)
		return cma_err(EINVAL);
	cid = to_cid(id);
	if (level == RDMA_OPTION_IB)
		return cma_err(optname == RDMA_OPTION_IB_PATH ? EOPNOTSUPP : EINVAL);
	if (level != RDMA_OPTION_ID)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma_lock);
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			ret = cma_err(EINVAL);
		else
			cid->tos = *(uint8_t *)optval;
		break;
	case RDMA_OPTION_ID_REUSEADDR:
		/* Ports are always reusable past TIME_WAIT (cma_socket). */
		if (optlen != sizeof(int))
			ret = cma_err(EINVAL);
		break;
	case RDMA_OPTION_ID_AFONLY:
		if (optlen != sizeof(int) || cid->state != CS_IDLE)
			ret = cma_err(EINVAL);
		else
			cid->afonly = *(int *)optval != 0;
		break;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t) || *(uint8_t *)optval > 31)
			ret = cma_err(EINVAL);
		else
			cid->ack_timeout = *(uint8_t *)optval;
		break;
	default:
		ret = cma_err(ENOPROTOOPT);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id ? sa_port(&id->route.addr.src_addr) : 0;
}

EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id ? sa_port(&id->route.addr.dst_addr) : 0;
}

EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list;

	if (cma_init())
		return NULL;
	list = calloc(2, sizeof(*list));
	if (!list)
		return NULL;
	list[0] = cma_ctx;
	if (num_devices)
		*num_devices = 1;
	return list;
}

EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	/* Our connections are established by the RTU, never by traffic. */
	(void)event;
	return id ? 0 : cma_err(EINVAL);
}

EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr,
			       void *context)
{
	(void)id, (void)addr, (void)context;
	return cma_err(EOPNOTSUPP); /* needs UD queue pairs */
}

EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id,
				  struct rdma_cm_join_mc_attr_ex *mc_join_attr,
				  void *context)
{
	(void)id, (void)mc_join_attr, (void)context;
	return cma_err(EOPNOTSUPP);
}

EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id, (void)addr;
	return cma_err(EOPNOTSUPP);
}

EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return cma_err(EOPNOTSUPP); /* no ECE on this device (ibv_query_ece) */
}

EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return cma_err(EOPNOTSUPP);
}
