/* SPDX-License-Identifier: MIT */
/*
 * What the rsockets files share: limits, struct rsocket and its helpers.
 * rsocket.c has the overview (identity, set-up, the data path, waiting).
 */
#ifndef URDMA_RSOCKET_PRIV_H
#define URDMA_RSOCKET_PRIV_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "util/clock.h"

#define RS_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ */
/* Limits and defaults                                                */
/* ------------------------------------------------------------------ */

#define RS_CONN_MAGIC	0x75727331u	/* "urs1" */
#define RS_PROTO_VERSION 1

#define RS_DEF_SQSIZE	256
#define RS_DEF_RQSIZE	256
#define RS_MIN_QSIZE	8
#define RS_MAX_QSIZE	16384
#define RS_DEF_INLINE	64
#define RS_DEF_BUF	(256u << 10)
#define RS_MIN_BUF	4096u
#define RS_MAX_BUF	(256u << 20)
#define RS_MAX_CHUNK	(64u << 10)	/* bytes per data WR */
#define RS_SLOT		64		/* control message slot */
#define RS_MAX_IOMAP	4096
#define RS_WAKE_MS	100		/* cap of one sleep */
#define RS_RESOLVE_MS	2000
#define RS_CLOSE_MS	5000		/* rclose: wait for in-flight data */
#define RS_CM_CHECK_NS	10000000ull	/* connected: CM events every 10 ms */
#define RS_DEF_SPIN_US	30
#define RS_MSS		4096

/* wr_id of a receive: RS_WR_RECV | slot.  Of a signalled send: how many
 * WRs (it and the unsignalled ones before it) and how many send buffer
 * bytes its completion retires. */
#define RS_WR_RECV	(1ull << 63)
#define RS_WR_BYTES(w)	((w) & ((1ull << 40) - 1))
#define RS_WR_COUNT(w)	(((w) >> 40) & ((1ull << 22) - 1))

enum rs_msg_type {
	RS_MSG_CREDIT = 1,
	RS_MSG_SHUTDOWN = 2,
	RS_MSG_IOMAP = 3,
};

/* Private data of the connect request and of the accept. */
struct rs_conn_data {
	uint32_t magic;		/* RS_CONN_MAGIC */
	uint8_t version;	/* RS_PROTO_VERSION */
	uint8_t flags;		/* 0 */
	uint16_t iomap_size;	/* iomaps of the peer the sender can hold */
	uint32_t credits;	/* receives posted */
	uint32_t rbuf_rkey;
	uint64_t rbuf_addr;
	uint32_t rbuf_size;
	uint32_t reserved;
} __attribute__((packed));
_Static_assert(sizeof(struct rs_conn_data) == 32, "rs_conn_data is 32 bytes");

/* A control message (SEND into a receive slot), all fields big-endian. */
struct rs_msg {
	uint8_t type;		/* enum rs_msg_type */
	uint8_t version;
	uint16_t index;		/* IOMAP: entry */
	uint32_t rkey;		/* IOMAP */
	uint64_t freed;		/* sender's receive ring: bytes consumed */
	uint64_t granted;	/* sender's receives posted */
	uint64_t offset;	/* IOMAP */
	uint64_t addr;		/* IOMAP */
	uint64_t len;		/* IOMAP; 0 = unmapped */
};
_Static_assert(sizeof(struct rs_msg) <= RS_SLOT, "control message fits a slot");

enum rs_state {
	RS_IDLE,		/* created, maybe bound */
	RS_LISTENING,
	RS_ADDR_QUERY,		/* rdma_resolve_addr issued */
	RS_ROUTE_QUERY,		/* rdma_resolve_route issued */
	RS_CONNECTING,		/* rdma_connect issued */
	RS_CONNECTED,		/* data path up (maybe dead since: conn_dead) */
	RS_FAILED,		/* connect failed */
};

/* A connect request waiting for raccept. */
struct rs_req {
	struct rdma_cm_id *id;
	struct rs_conn_data cd;
	bool dead;
	struct rs_req *next;
};

/* A buffer we mapped with riomap. */
struct rs_iomap_local {
	void *buf;
	size_t len;
	uint64_t offset;
	struct ibv_mr *mr;
	int index;		/* entry in the peer's table, -1: local only */
	struct rs_iomap_local *next;
};

/* A buffer the peer mapped for us. */
struct rs_iomap_peer {
	uint64_t offset;
	uint64_t addr;
	uint64_t len;		/* 0: unused */
	uint32_t rkey;
};

/* An IOMAP message not sent yet (no credit). */
struct rs_iomap_msg {
	uint16_t index;
	uint32_t rkey;
	uint64_t offset, addr, len;
	struct rs_iomap_msg *next;
};

struct rsocket {
	int fd;				/* = cm channel fd: the rsocket number */
	pthread_mutex_t lock;
	enum rs_state state;
	int domain;
	bool nonblock;
	bool bound;
	int err;			/* pending SO_ERROR */

	/* options */
	int sq_size, rq_size, sq_inline, iomap_size;
	uint32_t sbuf_size, rbuf_size;
	int reuseaddr, keepalive, keepidle, keepintvl, keepcnt;
	int nodelay, maxseg, oobinline, v6only;
	struct linger linger;

	/* connection manager */
	struct rdma_event_channel *chan;
	struct rdma_cm_id *id;
	uint64_t cm_next_check;		/* connected: next periodic CM poll */
	bool cm_due;			/* the CM fd was seen readable */
	struct rs_req *req_head, *req_tail;
	int req_count, backlog;

	/* endpoint */
	struct ibv_pd *pd;
	struct ibv_comp_channel *cq_chan;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int cq_events;			/* got, not acked */
	uint8_t *lbuf;			/* recv slots | send slots | sbuf */
	size_t lbuf_len;
	struct ibv_mr *lmr;
	uint8_t *rbuf;			/* receive ring */
	size_t rbuf_map;
	struct ibv_mr *rmr;
	uint8_t *rslots, *sslots, *sbuf;
	uint32_t ctl_seq;
	int max_inline;			/* inline threshold in force */

	/* connection flags */
	bool conn_dead;			/* the QP can carry nothing more */
	bool rd_shut, wr_shut;		/* local rshutdown */
	bool shut_sent;			/* SHUTDOWN message posted */
	bool peer_shut;			/* SHUTDOWN received: EOF after data */
	bool closing;			/* rclose in progress */
	bool disconnected;		/* rdma_disconnect called */

	/* send side: the peer's ring and credits */
	uint64_t tx_addr;
	uint32_t tx_rkey, tx_size;
	uint64_t tx_sent, tx_freed;	/* bytes written / reported consumed */
	uint64_t tx_msgs, tx_granted;	/* messages sent / receives granted */
	int sq_used;			/* send WRs not retired, signalled or not */
	uint32_t unsig_cnt;		/* unsignalled WRs since the last signalled */
	uint64_t unsig_bytes;		/* and their send buffer bytes */
	uint64_t sb_head, sb_tail;	/* send buffer ring, absolute */

	/* receive side */
	uint64_t rx_tail, rx_head;	/* bytes arrived / consumed */
	uint64_t rx_reported;		/* rx_head last reported */
	uint64_t rx_msgs, rx_posted;	/* receives consumed / posted */
	uint64_t rx_granted_reported;	/* rx_posted last reported */

	/* iomap */
	struct rs_iomap_local *iomaps;
	int peer_iomap_allow;		/* how many PROT_WRITE maps the peer holds */
	struct rs_iomap_peer *peer_iomap;	/* iomap_size entries */
	struct rs_iomap_msg *iomap_q, *iomap_q_tail;

	struct rs_dgram *dg;		/* SOCK_DGRAM: rs_dgram.c's state */

	/* adaptive spinning */
	_Atomic int spin_miss; /* a hint, also read and written by rpoll without rs->lock */
};

static inline uint64_t rs_tx_space(const struct rsocket *rs)
{
	return rs->tx_size - (rs->tx_sent - rs->tx_freed);
}

static inline uint64_t rs_credits(const struct rsocket *rs)
{
	return rs->tx_granted - rs->tx_msgs;
}

static inline uint64_t rs_sbuf_free(const struct rsocket *rs)
{
	return rs->sbuf_size - (rs->sb_head - rs->sb_tail);
}

static inline bool rs_sq_free(const struct rsocket *rs)
{
	return rs->sq_used < rs->sq_size;
}

typedef bool (*rs_cond_fn)(struct rsocket *rs);

struct rs_iter {
	const struct iovec *iov;
	int cnt;
	size_t off;	/* in iov[0] */
};

/* rsocket.c */
extern int rs_spin_us;
size_t page_round(size_t n);
struct rsocket *rs_lookup(int fd);
int rs_index_insert(struct rsocket *rs);
struct rsocket *rs_get(int fd);
struct rsocket *rs_alloc(const struct rsocket *from, int domain);
int rs_set_chan_flags(struct rdma_event_channel *chan);
void rs_free_ep(struct rsocket *rs);
void rs_req_free(struct rs_req *r, bool reject);
void rs_free(struct rsocket *rs);

/* rs_conn.c */
int rs_post_recv_slots(struct rsocket *rs, const uint32_t *slots, int n);
bool rs_conn_data_ok(const void *pd, size_t len);
void rs_save_conn_data(struct rsocket *rs, const struct rs_conn_data *cd);
void rs_copy_addr(struct sockaddr *dst, socklen_t *len,
		  const struct sockaddr *src, int domain);
void rs_start_connect(struct rsocket *rs);
bool rs_connect_done(struct rsocket *rs);

/* rs_stream.c */
void rs_iter_copy(struct rs_iter *it, uint8_t *buf, size_t len, bool to_buf);
int rs_iov_check(const struct iovec *iov, int iovcnt, int flags, size_t *total);
void rs_conn_fail(struct rsocket *rs, int err);
void rs_update_credits(struct rsocket *rs);
void rs_flush_ctl(struct rsocket *rs);
bool rs_inline_ok(const struct rsocket *rs, struct rs_iter *it, size_t len);
bool rs_can_send(struct rsocket *rs);
bool rs_can_iowrite(struct rsocket *rs);
int rs_post_data(struct rsocket *rs, struct rs_iter *it, size_t len,
		 uint64_t raddr, uint32_t rkey, bool imm);
int rs_send_error(struct rsocket *rs);

/* rs_ctrl.c */
void rs_poll_cq(struct rsocket *rs);
void rs_fail_connect(struct rsocket *rs, int err);
void rs_listener_event(struct rsocket *rs, struct rdma_cm_event *ev);
void rs_progress(struct rsocket *rs);
void rs_arm(struct rsocket *rs);
int rs_sleep_fds(struct rsocket *rs, struct pollfd *p);
int rs_wait(struct rsocket *rs, rs_cond_fn cond, bool nonblock,
	    int timeout_ms);

/* rs_dgram.c: SOCK_DGRAM; the calls that return an int give 0 or an
 * errno, the data calls the length or -errno.  Lock held. */
int rs_dg_create(struct rsocket *rs, bool cloexec);
void rs_dg_free(struct rsocket *rs);
void rs_dg_progress(struct rsocket *rs);
short rs_dg_revents(struct rsocket *rs);
int rs_dg_sleep_fds(struct rsocket *rs, struct pollfd *p);
int rs_dg_bind(struct rsocket *rs, const struct sockaddr *addr, socklen_t len);
int rs_dg_connect(struct rsocket *rs, const struct sockaddr *addr, socklen_t len);
ssize_t rs_dg_sendv(struct rsocket *rs, const struct iovec *iov, int iovcnt,
		    int flags, const struct sockaddr *to, socklen_t tolen);
ssize_t rs_dg_recvv(struct rsocket *rs, const struct iovec *iov, int iovcnt,
		    int flags, struct sockaddr *src, socklen_t *srclen,
		    int *msg_flags);
int rs_dg_getname(struct rsocket *rs, struct sockaddr *addr,
		  socklen_t *addrlen, bool peer);
int rs_dg_shutdown(struct rsocket *rs, int how);

#endif
