/* SPDX-License-Identifier: MIT */
/*
 * What the connection manager's files share: the CM messages, the ids,
 * channels and events, the one lock (cma_lock) and the CM thread's state.
 * cma.c has the overview.
 */
#ifndef URDMA_CMA_PRIV_H
#define URDMA_CMA_PRIV_H

#include "core/cm_link.h"
#include "rdmacm/cma.h"
#include "util/list.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- CM messages (network byte order) ---------------------------------- */

#define CMA_MAGIC 0x55434d31u /* "UCM1" */
#define CMA_CONNECT_TIMEOUT_MS 10000
#define CMA_REQ_TIMEOUT_MS 10000
#define CMA_REJ_CONSUMER 28 /* IB_CM_REJ_CONSUMER_DEFINED */
#define CMA_REJ_INVALID_SID 8 /* IB_CM_REJ_INVALID_SERVICE_ID */
#define CMA_SIDR_REJECT 2     /* IB_SIDR_REJECT: a UD request refused */

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
	CS_UD_DONE,     /* UD: the service ID exchange is over (socket closed) */
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
	int nchildren;		/* ids whose listen is this one */
	struct cma_id *hnext;	/* in its handle's bucket */
	uint64_t deadline_ns;	/* cma_deadline: 0, or in cma_timers */
	struct list_head tnode;
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
	/* UD: the multicast groups joined (cma_mc.c) */
#define CMA_MC_MAX 8
	struct cma_mc {
		struct sockaddr_storage addr;
		union ibv_gid mgid;
		bool attached; /* the id's QP is, by rdma_join_multicast */
		int ip_fd;     /* a socket holding the IP group, or -1 */
	} mc[CMA_MC_MAX];
	int nmc;
};

static inline struct cma_id *to_cid(struct rdma_cm_id *id)
{
	return container_of(id, struct cma_id, id);
}

static inline struct cma_channel *to_cch(struct rdma_event_channel *ch)
{
	return container_of(ch, struct cma_channel, ch);
}

/* cma.c */
extern pthread_mutex_t cma_lock;
extern pthread_cond_t cma_cond;
extern struct list_head cma_ids;
extern int cma_epfd, cma_wakefd;
extern struct ibv_context *cma_ctx;
extern struct ibv_pd *cma_pd;
extern struct ibv_device_attr cma_dev_attr;

/* An id bound to the device: its context, and the device's PD unless the
 * program gave one (rdma_create_qp). */
static inline void cma_set_device(struct rdma_cm_id *id)
{
	id->verbs = cma_ctx;
	if (!id->pd)
		id->pd = cma_pd;
}
extern enum ibv_mtu cma_mtu;
const struct verbs_ex_private *cma_link(void);
void cma_release_held(void);
/* The stops of the threads so far (core/cm_link.h), read before a wait;
 * after it, whether the wait's EINTR (errno) came from a stop's signal,
 * not the application's: then it waits again, as read() would. */
uint32_t cma_stop_seq(void);
bool cma_cut_by_stop(uint32_t stops);
struct cma_id *cma_find(uint64_t handle);
void cma_kick(void);
int cma_init(void);
struct cma_channel *cma_channel_new(bool sync);
void cma_channel_sync(struct cma_channel *c);
void cma_channel_free(struct cma_channel *c);
struct cma_event *cma_post(struct cma_id *cid,
			   enum rdma_cm_event_type type, int status,
			   const struct cma_msg *m);
struct cma_id *cma_id_new(struct cma_channel *c, void *context,
			  enum rdma_port_space ps);
void cma_id_unlink(struct cma_id *cid);
bool cma_deadline(struct cma_id *cid, unsigned int ms);
void cma_expire(uint64_t now);
void cma_close_fd(struct cma_id *cid);
int cma_send(struct cma_id *cid, enum cma_msg_type type,
	     const void *pdata, uint8_t len, uint32_t reason);
int cma_sync_wait(struct cma_id *cid, enum rdma_cm_event_type want);

/* cma_addr.c */
socklen_t sa_len(const struct sockaddr *sa);
/* The GID of an address: IPv4-mapped, or the IPv6 address. */
void sa_to_gid(const struct sockaddr *sa, union ibv_gid *gid);
uint16_t sa_port(const struct sockaddr *sa);
bool sa_is_any(const struct sockaddr *sa);
uint8_t cma_gid_index(const union ibv_gid *gid);
int cma_gid_find(const union ibv_gid *gid);
void cma_set_route(struct cma_id *cid, bool peer);
int cma_socket(struct cma_id *cid, int family);
int cma_bind_locked(struct cma_id *cid, const struct sockaddr *addr);

/* cma_qp.c */
int cma_qp_connect(struct cma_id *cid);
uint32_t cma_ud_qkey(struct cma_id *cid);
void cma_ud_ah(struct cma_id *cid, const struct cma_msg *m,
	       struct ibv_ah_attr *ah);
void cma_qp_error(struct cma_id *cid);

/* cma_mc.c */
void cma_mc_qp_gone(struct cma_id *cid);
void cma_mc_free(struct cma_id *cid);
bool cma_sa_multicast(const struct sockaddr *sa);

/* cma_conn.c */
void cma_id_free(struct cma_id *cid);
void cma_closed(struct cma_id *cid, int e);
void cma_handle_io(struct cma_id *cid);

#endif
