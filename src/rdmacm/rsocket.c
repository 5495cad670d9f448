/* SPDX-License-Identifier: MIT */
/*
 * rsockets: the socket-like API of <rdma/rsocket.h> (rsocket, rsend, rrecv,
 * rpoll, riowrite, ...) over RC queue pairs set up by the RDMA connection
 * manager.  Written only against the public <rdma/rdma_cma.h>,
 * <rdma/rdma_verbs.h> and <infiniband/verbs.h>: nothing here knows urdma's
 * internals.  Both ends run this file; the wire protocol is ours (it does
 * not interoperate with rdma-core's rsockets).
 *
 * Identity
 * --------
 * Every rsocket owns an rdma_event_channel, and the channel's fd (a real fd,
 * so it never collides with the application's) is the rsocket number.  A
 * two-level table maps fd -> struct rsocket (lock-free lookup); rpoll()
 * treats any fd not in the table as a normal fd.  An accepted connection
 * gets a fresh channel and its cm_id is moved there with rdma_migrate_id().
 *
 * Connection set-up
 * -----------------
 * rconnect: rdma_resolve_addr -> rdma_resolve_route -> create the endpoint
 * (PD, one CQ with a completion channel, the RC QP, buffers, every receive
 * posted) -> rdma_connect with struct rs_conn_data as private data ->
 * ESTABLISHED carries the peer's rs_conn_data.  rlisten/raccept: each
 * CONNECT_REQUEST is queued on the listener (up to the backlog; bad private
 * data is rejected); raccept moves it to its own channel, creates the
 * endpoint and rdma_accept()s with its own rs_conn_data.  The connection is
 * usable as soon as rdma_accept returns.  A non-blocking rconnect returns
 * EINPROGRESS; the state machine then advances in rpoll (POLLOUT when done,
 * POLLERR|POLLHUP and SO_ERROR on failure) or in any later call.
 *
 * rs_conn_data (32 bytes, big-endian): magic, version, the number of
 * receives posted (initial credits), the receive ring (address, rkey, size)
 * and how many iomapped buffers the sender accepts from its peer.
 *
 * Data path
 * ---------
 * Each side exposes a receive ring (SO_RCVBUF bytes, REMOTE_WRITE).  The
 * sender knows where the next byte goes (both sides count bytes from 0), so
 * a data message is one RDMA WRITE WITH IMMEDIATE of up to 64 KiB into the
 * peer's ring at (bytes sent mod ring size), never crossing the ring's end;
 * the immediate is the length.  Its source is the application buffer with
 * IBV_SEND_INLINE when the chunk is at most RDMA_INLINE bytes, otherwise a
 * copy in the registered send buffer (SO_SNDBUF bytes, a byte ring freed in
 * order by send completions; WRs are signalled now and then, see rs_sign).
 * The receiver learns of data from the receive completion (the write landed
 * before it, RC order) and rrecv copies it out of the ring.
 *
 * Control messages (credit update, shutdown, iomap update) are 48-byte SENDs
 * into 64-byte receive slots.  Every one of them carries two absolute
 * counters: the bytes of the peer's stream consumed so far (ring space) and
 * the receives posted so far (message credits).
 *
 * Flow control: the sender writes only into ring space the receiver has
 * reported free, and sends a message (data or control) only while it holds
 * a credit (a receive posted at the peer).  Data, shutdown and iomap
 * messages need two credits: the last one is kept for a credit update, so
 * two sides can never both be stuck without credits.  The receiver reports
 * (a credit update message) when a quarter of its ring has been consumed
 * since the last report, or when the peer's remaining credits fall to half
 * of the receive queue.  Receives are re-posted as their completions are
 * polled.
 *
 * Shutdown and errors: rshutdown(SHUT_WR) (and rclose) sends a SHUTDOWN
 * message after all data; the peer's rrecv returns 0 once it has read
 * everything before it.  rclose then waits (bounded, SO_LINGER) until all
 * its sends completed, so nothing in flight is lost, and disconnects.  A
 * connection that ends without SHUTDOWN (peer killed, abortive close with
 * SO_LINGER 0, a failed completion, DISCONNECTED) gives ECONNRESET once the
 * data already received has been read, then EOF; sends give ECONNRESET then
 * EPIPE.  SIGPIPE is never raised.
 *
 * Direct placement (riomap/riowrite): riomap(PROT_WRITE) registers the
 * buffer for remote writes and sends an IOMAP control message {index,
 * offset, address, length, rkey}; the peer keeps a table of RDMA_IOMAPSIZE
 * entries (set on the peer before it connects; by default 0: riomap with
 * PROT_WRITE then fails with ENOMEM).  riowrite is a plain RDMA WRITE into
 * the peer's mapping (no credit, no receive consumed; the receiver is not
 * told) through the same send buffer, ordered with the stream on the QP.
 * riounmap sends an IOMAP
 * message of length 0.
 *
 * Waiting: a blocking call (and rpoll) first polls the CQ for a short,
 * adaptive time (URDMA_RS_SPIN_US, default 30 us; shortened while waits keep
 * ending asleep), then arms the CQ and sleeps in poll() on the completion
 * channel fd and the CM channel fd (rpoll adds the application's normal fds).
 * A sleep is capped at 100 ms so that two threads sharing one rsocket can
 * never lose a wake-up for ever.
 *
 * Locking: one mutex per rsocket, released while sleeping; rpoll takes one
 * rsocket lock at a time.  fork() is not supported; SOCK_DGRAM is not
 * supported yet (EOPNOTSUPP).
 */

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

#include "rdmacm/cma.h"
#include "util/alloc.h"

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

	/* adaptive spinning */
	_Atomic int spin_miss; /* a hint, also read and written by rpoll without rs->lock */
};

/* ------------------------------------------------------------------ */
/* Small helpers                                                      */
/* ------------------------------------------------------------------ */

static int rs_spin_us = -1;
static pthread_once_t rs_once = PTHREAD_ONCE_INIT;

static void rs_global_init(void)
{
	const char *s = getenv("URDMA_RS_SPIN_US");

	rs_spin_us = RS_DEF_SPIN_US;
	if (s && *s) {
		long v = strtol(s, NULL, 10);

		if (v >= 0 && v <= 100000)
			rs_spin_us = (int)v;
	}
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

static uint32_t clamp_u32(uint64_t v, uint32_t lo, uint32_t hi)
{
	return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) & ~(pg - 1);
}

/* ------------------------------------------------------------------ */
/* fd -> rsocket table                                                */
/* ------------------------------------------------------------------ */

#define RS_IDX_LEAF_BITS 10
#define RS_IDX_LEAF	(1 << RS_IDX_LEAF_BITS)
#define RS_IDX_ROOT	(1 << 12)	/* fds below 4 Mi */

static _Atomic(struct rsocket *) *rs_index[RS_IDX_ROOT];
static pthread_mutex_t rs_index_lock = PTHREAD_MUTEX_INITIALIZER;

static struct rsocket *rs_lookup(int fd)
{
	_Atomic(struct rsocket *) *leaf;

	if (fd < 0 || fd >= RS_IDX_ROOT * RS_IDX_LEAF)
		return NULL;
	leaf = __atomic_load_n(&rs_index[fd >> RS_IDX_LEAF_BITS], __ATOMIC_ACQUIRE);
	if (!leaf)
		return NULL;
	return atomic_load_explicit(&leaf[fd & (RS_IDX_LEAF - 1)],
				    memory_order_acquire);
}

static int rs_index_insert(struct rsocket *rs)
{
	int fd = rs->fd, r = fd >> RS_IDX_LEAF_BITS;
	_Atomic(struct rsocket *) *leaf;

	if (fd < 0 || fd >= RS_IDX_ROOT * RS_IDX_LEAF)
		return -EMFILE;
	pthread_mutex_lock(&rs_index_lock);
	leaf = rs_index[r];
	if (!leaf) {
		leaf = urdma_zalloc_array(RS_IDX_LEAF, sizeof(*leaf));
		if (!leaf) {
			pthread_mutex_unlock(&rs_index_lock);
			return -ENOMEM;
		}
		__atomic_store_n(&rs_index[r], leaf, __ATOMIC_RELEASE);
	}
	atomic_store_explicit(&leaf[fd & (RS_IDX_LEAF - 1)], rs,
			      memory_order_release);
	pthread_mutex_unlock(&rs_index_lock);
	return 0;
}

static void rs_index_remove(struct rsocket *rs)
{
	_Atomic(struct rsocket *) *leaf;

	pthread_mutex_lock(&rs_index_lock);
	leaf = rs_index[rs->fd >> RS_IDX_LEAF_BITS];
	if (leaf && atomic_load(&leaf[rs->fd & (RS_IDX_LEAF - 1)]) == rs)
		atomic_store(&leaf[rs->fd & (RS_IDX_LEAF - 1)], NULL);
	pthread_mutex_unlock(&rs_index_lock);
}

/* The rsocket of fd, or NULL with errno: EBADF for no open fd, ENOTSOCK
 * for an fd that is not an rsocket. */
static struct rsocket *rs_get(int fd)
{
	struct rsocket *rs = rs_lookup(fd);

	if (!rs)
		errno = (fd >= 0 && fcntl(fd, F_GETFD) >= 0) ? ENOTSOCK : EBADF;
	return rs;
}

/* ------------------------------------------------------------------ */
/* Allocation                                                         */
/* ------------------------------------------------------------------ */

static struct rsocket *rs_alloc(const struct rsocket *from, int domain)
{
	struct rsocket *rs = urdma_zalloc(sizeof(*rs));

	if (!rs)
		return NULL;
	pthread_once(&rs_once, rs_global_init);
	pthread_mutex_init(&rs->lock, NULL);
	rs->fd = -1;
	rs->domain = domain;
	rs->state = RS_IDLE;
	if (from) {
		/* accepted sockets inherit the listener's options, as TCP's do
		 * (O_NONBLOCK is not inherited, as on Linux) */
		rs->sq_size = from->sq_size;
		rs->rq_size = from->rq_size;
		rs->sq_inline = from->sq_inline;
		rs->iomap_size = from->iomap_size;
		rs->sbuf_size = from->sbuf_size;
		rs->rbuf_size = from->rbuf_size;
		rs->reuseaddr = from->reuseaddr;
		rs->keepalive = from->keepalive;
		rs->keepidle = from->keepidle;
		rs->keepintvl = from->keepintvl;
		rs->keepcnt = from->keepcnt;
		rs->nodelay = from->nodelay;
		rs->maxseg = from->maxseg;
		rs->oobinline = from->oobinline;
		rs->v6only = from->v6only;
		rs->linger = from->linger;
	} else {
		rs->sq_size = RS_DEF_SQSIZE;
		rs->rq_size = RS_DEF_RQSIZE;
		rs->sq_inline = RS_DEF_INLINE;
		rs->sbuf_size = RS_DEF_BUF;
		rs->rbuf_size = RS_DEF_BUF;
		rs->keepidle = 7200;
		rs->keepintvl = 75;
		rs->keepcnt = 9;
	}
	return rs;
}

static int rs_set_chan_flags(struct rdma_event_channel *chan)
{
	int fl = fcntl(chan->fd, F_GETFL);

	if (fl < 0 || fcntl(chan->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

/* Tear down the data path (QP, CQ, buffers).  Lock held. */
static void rs_free_ep(struct rsocket *rs)
{
	struct rs_iomap_local *m, *mn;
	struct rs_iomap_msg *q, *qn;

	for (m = rs->iomaps; m; m = mn) {
		mn = m->next;
		if (m->mr)
			ibv_dereg_mr(m->mr);
		urdma_free(m);
	}
	rs->iomaps = NULL;
	for (q = rs->iomap_q; q; q = qn) {
		qn = q->next;
		urdma_free(q);
	}
	rs->iomap_q = rs->iomap_q_tail = NULL;
	urdma_free(rs->peer_iomap);
	rs->peer_iomap = NULL;

	if (rs->qp && rs->id) {
		rdma_destroy_qp(rs->id);
		rs->qp = NULL;
	}
	if (rs->cq) {
		if (rs->cq_events)
			ibv_ack_cq_events(rs->cq, (unsigned)rs->cq_events);
		rs->cq_events = 0;
		ibv_destroy_cq(rs->cq);
		rs->cq = NULL;
	}
	if (rs->cq_chan) {
		ibv_destroy_comp_channel(rs->cq_chan);
		rs->cq_chan = NULL;
	}
	if (rs->lmr) {
		ibv_dereg_mr(rs->lmr);
		rs->lmr = NULL;
	}
	if (rs->rmr) {
		ibv_dereg_mr(rs->rmr);
		rs->rmr = NULL;
	}
	if (rs->lbuf) {
		munmap(rs->lbuf, rs->lbuf_len);
		rs->lbuf = NULL;
	}
	if (rs->rbuf) {
		munmap(rs->rbuf, rs->rbuf_map);
		rs->rbuf = NULL;
	}
	if (rs->pd) {
		ibv_dealloc_pd(rs->pd);
		rs->pd = NULL;
	}
}

/* Drop a queued connect request. */
static void rs_req_free(struct rs_req *r, bool reject)
{
	if (reject)
		rdma_reject(r->id, NULL, 0);
	rdma_destroy_id(r->id);
	urdma_free(r);
}

static void rs_free(struct rsocket *rs)
{
	struct rs_req *r, *rn;

	for (r = rs->req_head; r; r = rn) {
		rn = r->next;
		rs_req_free(r, !r->dead);
	}
	rs->req_head = rs->req_tail = NULL;
	rs_free_ep(rs);
	if (rs->id) {
		rdma_destroy_id(rs->id);
		rs->id = NULL;
	}
	if (rs->chan) {
		rdma_destroy_event_channel(rs->chan);
		rs->chan = NULL;
	}
	pthread_mutex_destroy(&rs->lock);
	urdma_free(rs);
}

/* ------------------------------------------------------------------ */
/* Endpoint                                                           */
/* ------------------------------------------------------------------ */

static int rs_post_recv_slots(struct rsocket *rs, const uint32_t *slots, int n)
{
	struct ibv_recv_wr wr[32], *bad;
	struct ibv_sge sge[32];
	int i, done = 0;

	while (done < n) {
		int k = n - done > 32 ? 32 : n - done;

		for (i = 0; i < k; i++) {
			uint32_t s = slots[done + i];

			sge[i].addr = (uintptr_t)(rs->rslots + (size_t)s * RS_SLOT);
			sge[i].length = RS_SLOT;
			sge[i].lkey = rs->lmr->lkey;
			wr[i].wr_id = RS_WR_RECV | s;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		if (ibv_post_recv(rs->qp, wr, &bad))
			return -1;
		done += k;
		rs->rx_posted += (uint64_t)k;
	}
	return 0;
}

/* Create PD, CQ, QP and buffers on rs->id (whose verbs is set) and post
 * every receive.  Lock held.  Returns 0 or -errno. */
static int rs_create_ep(struct rsocket *rs)
{
	struct ibv_qp_init_attr attr;
	struct ibv_device_attr dattr;
	struct ibv_context *ctx = rs->id->verbs;
	size_t rslots, sslots;
	uint32_t *slots = NULL;
	int ret, inl, i;

	if (!ctx)
		return -ENODEV;
	if (!ibv_query_device(ctx, &dattr)) {
		if (dattr.max_qp_wr > 0) {
			if (rs->sq_size > dattr.max_qp_wr)
				rs->sq_size = dattr.max_qp_wr;
			if (rs->rq_size > dattr.max_qp_wr)
				rs->rq_size = dattr.max_qp_wr;
		}
	}
	rs->pd = ibv_alloc_pd(ctx);
	if (!rs->pd)
		goto err;
	rs->cq_chan = ibv_create_comp_channel(ctx);
	if (!rs->cq_chan)
		goto err;
	if (fcntl(rs->cq_chan->fd, F_SETFL,
		  fcntl(rs->cq_chan->fd, F_GETFL) | O_NONBLOCK) < 0)
		goto err;
	rs->cq = ibv_create_cq(ctx, rs->sq_size + rs->rq_size, rs, rs->cq_chan, 0);
	if (!rs->cq)
		goto err;

	/* buffers: [receive slots | send slots | send buffer] and the ring */
	rslots = (size_t)rs->rq_size * RS_SLOT;
	sslots = (size_t)rs->sq_size * RS_SLOT;
	rs->lbuf_len = page_round(rslots + sslots + rs->sbuf_size);
	rs->lbuf = mmap(NULL, rs->lbuf_len, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->lbuf == MAP_FAILED) {
		rs->lbuf = NULL;
		goto err;
	}
	rs->rslots = rs->lbuf;
	rs->sslots = rs->lbuf + rslots;
	rs->sbuf = rs->lbuf + rslots + sslots;
	rs->rbuf_map = page_round(rs->rbuf_size);
	rs->rbuf = mmap(NULL, rs->rbuf_map, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->rbuf == MAP_FAILED) {
		rs->rbuf = NULL;
		goto err;
	}
	rs->lmr = ibv_reg_mr(rs->pd, rs->lbuf, rs->lbuf_len, IBV_ACCESS_LOCAL_WRITE);
	if (!rs->lmr)
		goto err;
	rs->rmr = ibv_reg_mr(rs->pd, rs->rbuf, rs->rbuf_size,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!rs->rmr)
		goto err;

	if (rs->iomap_size > 0) {
		rs->peer_iomap = urdma_zalloc_array((size_t)rs->iomap_size, sizeof(*rs->peer_iomap));
		if (!rs->peer_iomap)
			goto err;
	}

	/* the QP; an inline size the device refuses is halved until it fits */
	inl = rs->sq_inline;
	for (;;) {
		memset(&attr, 0, sizeof(attr));
		attr.qp_context = rs;
		attr.send_cq = rs->cq;
		attr.recv_cq = rs->cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = (uint32_t)rs->sq_size;
		attr.cap.max_recv_wr = (uint32_t)rs->rq_size;
		attr.cap.max_send_sge = 2;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = (uint32_t)inl;
		if (!rdma_create_qp(rs->id, rs->pd, &attr))
			break;
		if (inl == 0)
			goto err;
		inl /= 2;
	}
	rs->qp = rs->id->qp;
	rs->max_inline = rs->sq_inline < (int)attr.cap.max_inline_data ?
			 rs->sq_inline : (int)attr.cap.max_inline_data;
	if (rs->max_inline < 0)
		rs->max_inline = 0;

	slots = malloc(sizeof(*slots) * (size_t)rs->rq_size);
	if (!slots)
		goto err;
	for (i = 0; i < rs->rq_size; i++)
		slots[i] = (uint32_t)i;
	if (rs_post_recv_slots(rs, slots, rs->rq_size))
		goto err;
	free(slots);
	rs->rx_granted_reported = rs->rx_posted;
	return 0;

err:
	ret = errno ? -errno : -ENOMEM;
	free(slots);
	rs_free_ep(rs);
	return ret;
}

static void rs_format_conn_data(struct rsocket *rs, struct rs_conn_data *cd)
{
	memset(cd, 0, sizeof(*cd));
	cd->magic = htobe32(RS_CONN_MAGIC);
	cd->version = RS_PROTO_VERSION;
	cd->iomap_size = htobe16((uint16_t)rs->iomap_size);
	cd->credits = htobe32((uint32_t)rs->rx_posted);
	cd->rbuf_rkey = htobe32(rs->rmr->rkey);
	cd->rbuf_addr = htobe64((uintptr_t)rs->rbuf);
	cd->rbuf_size = htobe32(rs->rbuf_size);
}

static bool rs_conn_data_ok(const void *pd, size_t len)
{
	struct rs_conn_data cd;

	if (!pd || len < sizeof(cd))
		return false;
	memcpy(&cd, pd, sizeof(cd));
	return be32toh(cd.magic) == RS_CONN_MAGIC &&
	       cd.version == RS_PROTO_VERSION && be32toh(cd.credits) >= 2 &&
	       be32toh(cd.rbuf_size) >= RS_MIN_BUF;
}

/* The peer's side of the connection, from its rs_conn_data. */
static void rs_save_conn_data(struct rsocket *rs, const struct rs_conn_data *cd)
{
	rs->tx_addr = be64toh(cd->rbuf_addr);
	rs->tx_rkey = be32toh(cd->rbuf_rkey);
	rs->tx_size = be32toh(cd->rbuf_size);
	rs->tx_granted = be32toh(cd->credits);
	rs->peer_iomap_allow = be16toh(cd->iomap_size);
	if (rs->peer_iomap_allow > RS_MAX_IOMAP)
		rs->peer_iomap_allow = RS_MAX_IOMAP;
	rs->tx_sent = rs->tx_freed = rs->tx_msgs = 0;
}

/* ------------------------------------------------------------------ */
/* Sending                                                            */
/* ------------------------------------------------------------------ */

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

/*
 * Signal a send WR only now and then: its completion retires the
 * unsignalled ones before it (RC completes in order), and over TCP every
 * signalled WR costs a confirmation.  Signalled: control messages (rclose
 * waits for the last one), every 64th WR, a WR that leaves half the send
 * queue in use, and one that brings the send buffer bytes not yet
 * signalled to an eighth of the buffer, so the buffer frees steadily (one
 * completion per 64 KiB of a 512 KiB buffer: large sends over TCP ran 2-5x
 * slower when their completions came in lumps).  A sender waiting for SQ
 * or buffer space always has a completion coming.
 */
static void rs_sign(struct rsocket *rs, struct ibv_send_wr *wr, uint64_t sbytes,
		    bool force)
{
	uint32_t cnt = rs->unsig_cnt + 1;
	uint64_t bytes = rs->unsig_bytes + sbytes;

	if (force || cnt >= 64 || rs->sq_used + 1 >= rs->sq_size / 2 ||
	    bytes >= rs->sbuf_size / 8) {
		wr->send_flags |= IBV_SEND_SIGNALED;
		wr->wr_id = ((uint64_t)cnt << 40) | bytes;
		rs->unsig_cnt = 0;
		rs->unsig_bytes = 0;
	} else {
		wr->wr_id = 0;
		rs->unsig_cnt = cnt;
		rs->unsig_bytes = bytes;
	}
}

/* The connection fails: nothing more goes over the QP.  err is reported
 * only if the peer did not end its stream cleanly. */
static void rs_conn_fail(struct rsocket *rs, int err)
{
	if (rs->conn_dead)
		return;
	rs->conn_dead = true;
	if (err && !rs->peer_shut && !rs->closing && !rs->err)
		rs->err = err;
}

/* Post a control message (credits always ride along).  Needs an SQ slot
 * and min_credits credits.  Returns 0, or -EAGAIN without resources. */
static int rs_post_ctl(struct rsocket *rs, uint8_t type, uint64_t min_credits,
		       const struct rs_iomap_msg *im)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct rs_msg *m;
	uint32_t slot;

	if (rs->conn_dead)
		return -EPIPE;
	if (!rs_sq_free(rs) || rs_credits(rs) < min_credits)
		return -EAGAIN;
	slot = rs->ctl_seq++ % (uint32_t)rs->sq_size;
	m = (struct rs_msg *)(rs->sslots + (size_t)slot * RS_SLOT);
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->version = RS_PROTO_VERSION;
	m->freed = htobe64(rs->rx_head);
	m->granted = htobe64(rs->rx_posted);
	if (im) {
		m->index = htobe16(im->index);
		m->rkey = htobe32(im->rkey);
		m->offset = htobe64(im->offset);
		m->addr = htobe64(im->addr);
		m->len = htobe64(im->len);
	}
	sge.addr = (uintptr_t)m;
	sge.length = sizeof(*m);
	sge.lkey = rs->lmr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	rs_sign(rs, &wr, 0, true);
	if (ibv_post_send(rs->qp, &wr, &bad)) {
		rs_conn_fail(rs, ECONNRESET);
		return -EPIPE;
	}
	rs->sq_used++;
	rs->tx_msgs++;
	rs->rx_reported = rs->rx_head;
	rs->rx_granted_reported = rs->rx_posted;
	return 0;
}

/* Send a credit update if the peer needs one. */
static void rs_update_credits(struct rsocket *rs)
{
	uint64_t unreported = rs->rx_head - rs->rx_reported;
	uint64_t peer_left = rs->rx_granted_reported - rs->rx_msgs;

	if (rs->conn_dead || !rs->qp)
		return;
	if (unreported >= rs->rbuf_size / 4 ||
	    (peer_left <= (uint64_t)rs->rq_size / 2 &&
	     rs->rx_posted > rs->rx_granted_reported))
		rs_post_ctl(rs, RS_MSG_CREDIT, 1, NULL);
}

/* Post queued control messages (iomap updates, then shutdown). */
static void rs_flush_ctl(struct rsocket *rs)
{
	while (rs->iomap_q && !rs->conn_dead) {
		struct rs_iomap_msg *q = rs->iomap_q;

		if (rs_post_ctl(rs, RS_MSG_IOMAP, 2, q))
			return;
		rs->iomap_q = q->next;
		if (!rs->iomap_q)
			rs->iomap_q_tail = NULL;
		urdma_free(q);
	}
	if (rs->wr_shut && !rs->shut_sent && !rs->conn_dead &&
	    !rs_post_ctl(rs, RS_MSG_SHUTDOWN, 2, NULL))
		rs->shut_sent = true;
}

/* ------------------------------------------------------------------ */
/* Completions and CM events                                          */
/* ------------------------------------------------------------------ */

static void rs_handle_ctl(struct rsocket *rs, const struct rs_msg *m,
			  uint32_t len)
{
	uint64_t freed, granted;

	if (len < sizeof(*m) || m->version != RS_PROTO_VERSION)
		return;
	freed = be64toh(m->freed);
	granted = be64toh(m->granted);
	/* counters only grow; a stale value never lowers them */
	if ((int64_t)(freed - rs->tx_freed) > 0 && (int64_t)(rs->tx_sent - freed) >= 0)
		rs->tx_freed = freed;
	if ((int64_t)(granted - rs->tx_granted) > 0)
		rs->tx_granted = granted;

	switch (m->type) {
	case RS_MSG_SHUTDOWN:
		rs->peer_shut = true;
		break;
	case RS_MSG_IOMAP: {
		uint16_t idx = be16toh(m->index);
		struct rs_iomap_peer *p;

		if (!rs->peer_iomap || idx >= rs->iomap_size)
			break;
		p = &rs->peer_iomap[idx];
		p->offset = be64toh(m->offset);
		p->addr = be64toh(m->addr);
		p->rkey = be32toh(m->rkey);
		p->len = be64toh(m->len);
		break;
	}
	default:
		break;
	}
}

/* Poll the CQ dry: data arrivals, control messages, send completions;
 * re-post the receives.  Lock held. */
static void rs_poll_cq(struct rsocket *rs)
{
	struct ibv_wc wc[32];
	uint32_t repost[64];
	int n, i, nrep = 0;

	if (!rs->cq)
		return;
	while ((n = ibv_poll_cq(rs->cq, 32, wc)) > 0) {
		for (i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];

			if (w->wr_id & RS_WR_RECV) {
				uint32_t slot = (uint32_t)(w->wr_id & 0xffffffffu);

				rs->rx_msgs++;
				if (w->status != IBV_WC_SUCCESS) {
					rs_conn_fail(rs, ECONNRESET);
					continue;
				}
				if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
					uint32_t len = be32toh(w->imm_data);

					if (len <= RS_MAX_CHUNK &&
					    rs->rx_tail + len - rs->rx_head <= rs->rbuf_size)
						rs->rx_tail += len;
					else
						rs_conn_fail(rs, EPROTO);
				} else if (w->opcode == IBV_WC_RECV) {
					rs_handle_ctl(rs, (const struct rs_msg *)
						      (rs->rslots + (size_t)slot * RS_SLOT),
						      w->byte_len);
				}
				if (!rs->conn_dead && slot < (uint32_t)rs->rq_size) {
					repost[nrep++] = slot;
					if (nrep == 64) {
						if (rs_post_recv_slots(rs, repost, nrep))
							rs_conn_fail(rs, ECONNRESET);
						nrep = 0;
					}
				}
			} else if (w->status != IBV_WC_SUCCESS) {
				/* the first failure; the rest flush after it */
				rs_conn_fail(rs, ECONNRESET);
			} else {
				rs->sq_used -= (int)RS_WR_COUNT(w->wr_id);
				rs->sb_tail += RS_WR_BYTES(w->wr_id);
			}
		}
		if (n < 32)
			break;
	}
	if (n < 0)
		rs_conn_fail(rs, EIO);
	if (nrep && !rs->conn_dead && rs_post_recv_slots(rs, repost, nrep))
		rs_conn_fail(rs, ECONNRESET);
}

static void rs_start_connect(struct rsocket *rs);

/* Map a failed connect event to an errno. */
static int rs_cm_errno(const struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_REJECTED:
		return ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:
		if (ev->status == -ETIMEDOUT || ev->status == ETIMEDOUT)
			return ETIMEDOUT;
		if (ev->status == -EHOSTUNREACH || ev->status == EHOSTUNREACH ||
		    ev->status == -ENETUNREACH || ev->status == ENETUNREACH)
			return EHOSTUNREACH;
		return ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		if (ev->status < 0 && ev->status != -ETIMEDOUT)
			return -ev->status;
		return EHOSTUNREACH;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return ECONNREFUSED;
	default:
		return ECONNRESET;
	}
}

static void rs_fail_connect(struct rsocket *rs, int err)
{
	rs->state = RS_FAILED;
	rs->err = err;
	rs->conn_dead = true;
}

/* A listener's event. */
static void rs_listener_event(struct rsocket *rs, struct rdma_cm_event *ev)
{
	struct rdma_cm_id *id = ev->id;
	struct rs_req *r;

	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && id != rs->id) {
		bool ok = rs_conn_data_ok(ev->param.conn.private_data,
					  ev->param.conn.private_data_len);
		struct rs_conn_data cd;

		if (ok)
			memcpy(&cd, ev->param.conn.private_data, sizeof(cd));
		rdma_ack_cm_event(ev);
		r = ok && rs->req_count < (rs->backlog > 0 ? rs->backlog : 1) + 8 ?
		    urdma_zalloc(sizeof(*r)) : NULL;
		if (!r) {
			rdma_reject(id, NULL, 0);
			rdma_destroy_id(id);
			return;
		}
		r->id = id;
		r->cd = cd;
		if (rs->req_tail)
			rs->req_tail->next = r;
		else
			rs->req_head = r;
		rs->req_tail = r;
		rs->req_count++;
		return;
	}
	/* an event of a request not accepted yet: it may have died */
	for (r = rs->req_head; r; r = r->next) {
		if (r->id == id &&
		    (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
		     ev->event == RDMA_CM_EVENT_REJECTED ||
		     ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
		     ev->event == RDMA_CM_EVENT_UNREACHABLE ||
		     ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		     ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT))
			r->dead = true;
	}
	rdma_ack_cm_event(ev);
}

/* An event of a connecting or connected socket. */
static void rs_conn_event(struct rsocket *rs, struct rdma_cm_event *ev)
{
	enum rdma_cm_event_type type = ev->event;
	int ret;

	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		rdma_ack_cm_event(ev);
		if (rs->state != RS_ADDR_QUERY)
			return;
		if (rdma_resolve_route(rs->id, RS_RESOLVE_MS)) {
			rs_fail_connect(rs, errno ? errno : EHOSTUNREACH);
			return;
		}
		rs->state = RS_ROUTE_QUERY;
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		rdma_ack_cm_event(ev);
		if (rs->state != RS_ROUTE_QUERY)
			return;
		rs_start_connect(rs);
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (rs->state == RS_CONNECTING) {
			if (!rs_conn_data_ok(ev->param.conn.private_data,
					     ev->param.conn.private_data_len)) {
				rdma_ack_cm_event(ev);
				rdma_disconnect(rs->id);
				rs->disconnected = true;
				rs_fail_connect(rs, ECONNREFUSED);
				return;
			}
			rs_save_conn_data(rs, ev->param.conn.private_data);
			rdma_ack_cm_event(ev);
			rs->state = RS_CONNECTED;
			rs->cm_next_check = cma_now_ns() + RS_CM_CHECK_NS;
			return;
		}
		rdma_ack_cm_event(ev);
		return;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		ret = rs_cm_errno(ev);
		rdma_ack_cm_event(ev);
		if (rs->state == RS_ADDR_QUERY || rs->state == RS_ROUTE_QUERY ||
		    rs->state == RS_CONNECTING)
			rs_fail_connect(rs, ret);
		else if (rs->state == RS_CONNECTED)
			rs_conn_fail(rs, ECONNRESET);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		rdma_ack_cm_event(ev);
		if (rs->state == RS_CONNECTED) {
			/* data that arrived before the disconnect counts */
			rs_poll_cq(rs);
			rs_conn_fail(rs, ECONNRESET);
		} else if (rs->state != RS_IDLE && rs->state != RS_FAILED) {
			rs_fail_connect(rs, ECONNRESET);
		}
		return;
	default:
		rdma_ack_cm_event(ev);
		return;
	}
}

/* Drain the socket's CM channel (non-blocking).  Lock held. */
static void rs_cm_events(struct rsocket *rs)
{
	struct rdma_cm_event *ev;

	rs->cm_due = false;
	if (!rs->chan)
		return;
	while (!rdma_get_cm_event(rs->chan, &ev)) {
		if (rs->state == RS_LISTENING)
			rs_listener_event(rs, ev);
		else
			rs_conn_event(rs, ev);
	}
}

/* Everything that can be done without waiting.  Lock held. */
static void rs_progress(struct rsocket *rs)
{
	if (rs->state == RS_CONNECTED) {
		rs_poll_cq(rs);
		if (!rs->conn_dead) {
			rs_flush_ctl(rs);
			rs_update_credits(rs);
		}
		if (rs->cm_due || cma_now_ns() >= rs->cm_next_check) {
			rs_cm_events(rs);
			rs->cm_next_check = cma_now_ns() + RS_CM_CHECK_NS;
		}
	} else if (rs->state != RS_IDLE && rs->state != RS_FAILED) {
		rs_cm_events(rs);
	}
}

/* ------------------------------------------------------------------ */
/* Waiting                                                            */
/* ------------------------------------------------------------------ */

/* Consume completion events and arm the CQ.  Lock held. */
static void rs_arm(struct rsocket *rs)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!rs->cq)
		return;
	while (!ibv_get_cq_event(rs->cq_chan, &cq, &ctx))
		rs->cq_events++;
	if (rs->cq_events >= 16) {
		ibv_ack_cq_events(rs->cq, (unsigned)rs->cq_events);
		rs->cq_events = 0;
	}
	ibv_req_notify_cq(rs->cq, 0);
}

/* The fds a sleeper on rs waits for.  Lock held.  Returns how many. */
static int rs_sleep_fds(struct rsocket *rs, struct pollfd *p)
{
	int n = 0;

	if (rs->state == RS_CONNECTED && rs->cq_chan && !rs->conn_dead) {
		p[n].fd = rs->cq_chan->fd;
		p[n].events = POLLIN;
		p[n].revents = 0;
		n++;
	}
	if (rs->chan && rs->state != RS_IDLE && rs->state != RS_FAILED) {
		p[n].fd = rs->chan->fd;
		p[n].events = POLLIN;
		p[n].revents = 0;
		n++;
	}
	return n;
}

static uint64_t rs_spin_budget_ns(const struct rsocket *rs)
{
	if (rs_spin_us <= 0)
		return 0;
	if (rs->spin_miss >= 8)
		return 1000;	/* the peer is slow: a quick look only */
	return (uint64_t)rs_spin_us * 1000ull;
}

typedef bool (*rs_cond_fn)(struct rsocket *rs);

/* Wait (lock held, released while sleeping) until cond(rs).  Returns 0, or
 * -EAGAIN if nonblock and not ready, or -ETIMEDOUT after timeout_ms (<0:
 * none). */
static int rs_wait(struct rsocket *rs, rs_cond_fn cond, bool nonblock,
		   int timeout_ms)
{
	uint64_t start = cma_now_ns(), spin_end, deadline = 0;
	bool slept = false;

	if (timeout_ms >= 0)
		deadline = start + (uint64_t)timeout_ms * 1000000ull;
	spin_end = start + rs_spin_budget_ns(rs);
	for (;;) {
		struct pollfd pfd[2];
		uint64_t t;
		int n, ms;

		rs_progress(rs);
		if (cond(rs))
			break;
		if (nonblock)
			return -EAGAIN;
		t = cma_now_ns();
		if (deadline && t >= deadline)
			return -ETIMEDOUT;
		if (t < spin_end) {
			/* let another thread of the socket in; a pause is
			 * ~140 cycles on recent x86: keep the check fine */
			pthread_mutex_unlock(&rs->lock);
			cpu_relax();
			pthread_mutex_lock(&rs->lock);
			continue;
		}
		rs_arm(rs);
		rs_progress(rs);
		if (cond(rs))
			break;
		n = rs_sleep_fds(rs, pfd);
		ms = RS_WAKE_MS;
		if (deadline) {
			uint64_t left = (deadline - t + 999999) / 1000000;

			if (left < (uint64_t)ms)
				ms = (int)left;
		}
		pthread_mutex_unlock(&rs->lock);
		if (n)
			poll(pfd, (nfds_t)n, ms);
		else
			usleep(1000);
		pthread_mutex_lock(&rs->lock);
		slept = true;
		for (int i = 0; i < n; i++)
			if (pfd[i].revents && rs->chan && pfd[i].fd == rs->chan->fd)
				rs->cm_due = true;
	}
	if (!slept)
		rs->spin_miss = 0;
	else if (cma_now_ns() - start > 1000000ull)
		rs->spin_miss++;
	else
		rs->spin_miss = 0;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Socket calls                                                       */
/* ------------------------------------------------------------------ */

RS_EXPORT int rsocket(int domain, int type, int protocol)
{
	struct rsocket *rs;
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), ret;

	if (domain != AF_INET && domain != AF_INET6)
		return cma_err(EAFNOSUPPORT);
	if (base == SOCK_DGRAM)
		return cma_err(EOPNOTSUPP);	/* UD rsockets: not yet */
	if (base != SOCK_STREAM)
		return cma_err(EPROTONOSUPPORT);
	if (protocol != 0 && protocol != IPPROTO_TCP)
		return cma_err(EPROTONOSUPPORT);

	rs = rs_alloc(NULL, domain);
	if (!rs)
		return cma_err(ENOMEM);
	rs->chan = rdma_create_event_channel();
	if (!rs->chan)
		goto err;
	rs->fd = rs->chan->fd;
	if (rs_set_chan_flags(rs->chan))
		goto err;
	if (type & SOCK_CLOEXEC)
		fcntl(rs->fd, F_SETFD, FD_CLOEXEC);
	rs->nonblock = (type & SOCK_NONBLOCK) != 0;
	if (rdma_create_id(rs->chan, &rs->id, rs, RDMA_PS_TCP))
		goto err;
	ret = rs_index_insert(rs);
	if (ret) {
		errno = -ret;
		goto err;
	}
	return rs->fd;
err:
	ret = errno ? errno : ENOMEM;
	rs_free(rs);
	return cma_err(ret);
}

static int rs_check_addr(struct rsocket *rs, const struct sockaddr *addr,
			 socklen_t len)
{
	if (!addr)
		return EFAULT;
	if (len < (socklen_t)sizeof(sa_family_t))
		return EINVAL;
	if (addr->sa_family == AF_INET) {
		if (len < (socklen_t)sizeof(struct sockaddr_in))
			return EINVAL;
		if (rs->domain != AF_INET && rs->domain != AF_INET6)
			return EAFNOSUPPORT;
		return rs->domain == AF_INET6 && rs->v6only ? EAFNOSUPPORT : 0;
	}
	if (addr->sa_family == AF_INET6) {
		if (len < (socklen_t)sizeof(struct sockaddr_in6))
			return EINVAL;
		return rs->domain == AF_INET6 ? 0 : EAFNOSUPPORT;
	}
	return EAFNOSUPPORT;
}

RS_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	ret = rs_check_addr(rs, addr, addrlen);
	if (!ret && (rs->bound || rs->state != RS_IDLE))
		ret = EINVAL;
	if (!ret && rdma_bind_addr(rs->id, (struct sockaddr *)addr))
		ret = errno ? errno : EADDRINUSE;
	if (!ret)
		rs->bound = true;
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rlisten(int socket, int backlog)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	if (backlog <= 0)
		backlog = 1;
	if (backlog > 4096)
		backlog = 4096;
	if (rs->state == RS_LISTENING) {
		rs->backlog = backlog;
		goto out;
	}
	if (rs->state != RS_IDLE) {
		ret = EINVAL;
		goto out;
	}
	if (!rs->bound) {
		struct sockaddr_storage ss;

		memset(&ss, 0, sizeof(ss));
		ss.ss_family = (sa_family_t)rs->domain;
		if (rdma_bind_addr(rs->id, (struct sockaddr *)&ss)) {
			ret = errno ? errno : EADDRINUSE;
			goto out;
		}
		rs->bound = true;
	}
	if (rdma_listen(rs->id, backlog)) {
		ret = errno ? errno : EADDRINUSE;
		goto out;
	}
	rs->backlog = backlog;
	rs->state = RS_LISTENING;
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

static bool rs_has_request(struct rsocket *rs)
{
	return rs->req_head != NULL || rs->state != RS_LISTENING;
}

static void rs_copy_addr(struct sockaddr *dst, socklen_t *len,
			 const struct sockaddr *src, int domain)
{
	socklen_t sz;
	struct sockaddr_storage tmp;

	if (!dst || !len)
		return;
	memset(&tmp, 0, sizeof(tmp));
	if (src && src->sa_family == AF_INET6)
		sz = sizeof(struct sockaddr_in6);
	else if (src && src->sa_family == AF_INET)
		sz = sizeof(struct sockaddr_in);
	else {
		tmp.ss_family = (sa_family_t)domain;
		sz = domain == AF_INET6 ? sizeof(struct sockaddr_in6) :
					  sizeof(struct sockaddr_in);
		src = (struct sockaddr *)&tmp;
	}
	memcpy(dst, src, *len < sz ? *len : sz);
	*len = sz;
}

/* Accept one queued request into a new rsocket.  Listener lock held.
 * Returns the new fd or -errno. */
static int rs_accept_one(struct rsocket *ls, struct rs_req *r)
{
	struct rdma_conn_param param;
	struct rs_conn_data cd;
	struct rsocket *rs;
	int ret;

	rs = rs_alloc(ls, ls->domain);
	if (!rs) {
		rs_req_free(r, true);
		return -ENOMEM;
	}
	rs->chan = rdma_create_event_channel();
	if (!rs->chan || rs_set_chan_flags(rs->chan))
		goto err_reject;
	rs->fd = rs->chan->fd;
	if (rdma_migrate_id(r->id, rs->chan))
		goto err_reject;
	rs->id = r->id;
	rs->id->context = rs;
	rs_save_conn_data(rs, &r->cd);
	r->id = NULL;
	urdma_free(r);
	r = NULL;
	rs->bound = true;

	ret = rs_create_ep(rs);
	if (ret) {
		errno = -ret;
		goto err_reject;
	}
	memset(&param, 0, sizeof(param));
	rs_format_conn_data(rs, &cd);
	param.private_data = &cd;
	param.private_data_len = sizeof(cd);
	param.rnr_retry_count = 7;
	if (rdma_accept(rs->id, &param))
		goto err_reject;
	rs->state = RS_CONNECTED;
	rs->cm_next_check = cma_now_ns() + RS_CM_CHECK_NS;
	ret = rs_index_insert(rs);
	if (ret) {
		errno = -ret;
		rdma_disconnect(rs->id);
		goto err;
	}
	return rs->fd;

err_reject:
	if (r) {
		ret = errno ? errno : ENOMEM;
		rs_req_free(r, true);
		errno = ret;
	} else if (rs->id) {
		ret = errno;
		rdma_reject(rs->id, NULL, 0);
		errno = ret;
	}
err:
	ret = errno ? -errno : -ENOMEM;
	rs_free(rs);
	return ret;
}

RS_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rsocket *ls = rs_get(socket), *rs;
	struct rs_req *r;
	int ret;

	if (!ls)
		return -1;
	pthread_mutex_lock(&ls->lock);
	for (;;) {
		if (ls->state != RS_LISTENING) {
			pthread_mutex_unlock(&ls->lock);
			return cma_err(EINVAL);
		}
		ret = rs_wait(ls, rs_has_request, ls->nonblock, -1);
		if (ret) {
			pthread_mutex_unlock(&ls->lock);
			return cma_err(-ret);
		}
		if (ls->state != RS_LISTENING)
			continue;
		r = ls->req_head;
		ls->req_head = r->next;
		if (!ls->req_head)
			ls->req_tail = NULL;
		ls->req_count--;
		r->next = NULL;
		if (r->dead) {
			rs_req_free(r, false);
			continue;
		}
		ret = rs_accept_one(ls, r);
		if (ret < 0) {
			if (ls->nonblock) {
				pthread_mutex_unlock(&ls->lock);
				return cma_err(-ret == EAGAIN ? ECONNABORTED : -ret);
			}
			continue;
		}
		rs = rs_lookup(ret);
		pthread_mutex_lock(&rs->lock);
		rs_copy_addr(addr, addrlen, rdma_get_peer_addr(rs->id), rs->domain);
		pthread_mutex_unlock(&rs->lock);
		pthread_mutex_unlock(&ls->lock);
		return ret;
	}
}

/* After the route is resolved: endpoint, then rdma_connect.  Lock held. */
static void rs_start_connect(struct rsocket *rs)
{
	struct rdma_conn_param param;
	struct rs_conn_data cd;
	int ret;

	ret = rs_create_ep(rs);
	if (ret) {
		rs_fail_connect(rs, -ret);
		return;
	}
	memset(&param, 0, sizeof(param));
	rs_format_conn_data(rs, &cd);
	param.private_data = &cd;
	param.private_data_len = sizeof(cd);
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	if (rdma_connect(rs->id, &param)) {
		rs_fail_connect(rs, errno ? errno : ECONNREFUSED);
		return;
	}
	rs->state = RS_CONNECTING;
}

static bool rs_connect_done(struct rsocket *rs)
{
	return rs->state == RS_CONNECTED || rs->state == RS_FAILED;
}

RS_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	switch (rs->state) {
	case RS_CONNECTED:
		ret = EISCONN;
		goto out;
	case RS_ADDR_QUERY:
	case RS_ROUTE_QUERY:
	case RS_CONNECTING:
		ret = EALREADY;
		goto out;
	case RS_LISTENING:
		ret = EINVAL;
		goto out;
	case RS_FAILED:
		ret = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
		goto out;
	case RS_IDLE:
		break;
	}
	ret = rs_check_addr(rs, addr, addrlen);
	if (ret)
		goto out;
	if (rdma_resolve_addr(rs->id, NULL, (struct sockaddr *)addr, RS_RESOLVE_MS)) {
		ret = errno ? errno : EHOSTUNREACH;
		goto out;
	}
	rs->state = RS_ADDR_QUERY;
	rs->err = 0;
	if (rs->nonblock) {
		rs_progress(rs);
		ret = rs->state == RS_CONNECTED ? 0 : EINPROGRESS;
		if (rs->state == RS_FAILED) {
			ret = rs->err;
			rs->err = 0;
		}
		goto out;
	}
	rs_wait(rs, rs_connect_done, false, -1);
	if (rs->state == RS_CONNECTED)
		ret = 0;
	else {
		ret = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

/* ------------------------------------------------------------------ */
/* Data transfer                                                      */
/* ------------------------------------------------------------------ */

struct rs_iter {
	const struct iovec *iov;
	int cnt;
	size_t off;	/* in iov[0] */
};

static void iter_skip_empty(struct rs_iter *it)
{
	while (it->cnt > 0 && it->off >= it->iov->iov_len) {
		it->iov++;
		it->cnt--;
		it->off = 0;
	}
}

/* Copy len bytes between buf and the iterator: out of the iovecs into buf
 * (to_buf), or from buf into them. */
static void iter_copy(struct rs_iter *it, uint8_t *buf, size_t len, bool to_buf)
{
	while (len) {
		uint8_t *at;
		size_t n;

		iter_skip_empty(it);
		n = it->iov->iov_len - it->off;
		if (n > len)
			n = len;
		at = (uint8_t *)it->iov->iov_base + it->off;
		if (to_buf)
			memcpy(buf, at, n);
		else
			memcpy(at, buf, n);
		buf += n;
		it->off += n;
		len -= n;
	}
}

/* Can len bytes at the iterator go inline (one contiguous piece)? */
static bool rs_inline_ok(const struct rsocket *rs, struct rs_iter *it, size_t len)
{
	iter_skip_empty(it);
	return (int64_t)len <= rs->max_inline && it->cnt > 0 &&
	       it->iov->iov_len - it->off >= len;
}

/* Room for a data WR now: a send slot, credits (one kept for control
 * messages), space in the peer's ring and in ours, no riowrite queued. */
static bool rs_send_room(struct rsocket *rs)
{
	return rs_sq_free(rs) && rs_credits(rs) >= 2 && rs_tx_space(rs) > 0 &&
	       rs_sbuf_free(rs) > 0 && !rs->iomap_q;
}

/* A sender would not wait: room, or nothing more will ever go. */
static bool rs_can_send(struct rsocket *rs)
{
	return rs->conn_dead || rs->wr_shut || rs_send_room(rs);
}

static bool rs_can_iowrite(struct rsocket *rs)
{
	return rs->conn_dead || rs->wr_shut ||
	       (rs_sq_free(rs) && rs_sbuf_free(rs) > 0);
}

/* Post one RDMA WRITE (with immediate if imm) of len bytes taken from the
 * iterator to raddr.  Uses inline data when it can, else the send buffer
 * (which must have len bytes free).  Lock held; resources checked. */
static int rs_post_data(struct rsocket *rs, struct rs_iter *it, size_t len,
			uint64_t raddr, uint32_t rkey, bool imm)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge[2];
	uint64_t sbytes = 0;

	memset(&wr, 0, sizeof(wr));
	if (rs_inline_ok(rs, it, len)) {
		sge[0].addr = (uintptr_t)it->iov->iov_base + it->off;
		sge[0].length = (uint32_t)len;
		sge[0].lkey = 0;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_INLINE;
		it->off += len;
	} else {
		uint64_t pos = rs->sb_head % rs->sbuf_size;
		size_t first = rs->sbuf_size - pos;

		if (first > len)
			first = len;
		iter_copy(it, rs->sbuf + pos, first, true);
		sge[0].addr = (uintptr_t)(rs->sbuf + pos);
		sge[0].length = (uint32_t)first;
		sge[0].lkey = rs->lmr->lkey;
		wr.num_sge = 1;
		if (first < len) {
			iter_copy(it, rs->sbuf, len - first, true);
			sge[1].addr = (uintptr_t)rs->sbuf;
			sge[1].length = (uint32_t)(len - first);
			sge[1].lkey = rs->lmr->lkey;
			wr.num_sge = 2;
		}
		sbytes = len;
	}
	wr.sg_list = sge;
	wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	rs_sign(rs, &wr, sbytes, false);
	if (imm)
		wr.imm_data = htobe32((uint32_t)len);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(rs->qp, &wr, &bad)) {
		rs_conn_fail(rs, ECONNRESET);
		return -EPIPE;
	}
	rs->sq_used++;
	rs->sb_head += sbytes;
	return 0;
}

/* A send or receive on a socket still connecting waits for the connection
 * (blocking) or fails with EAGAIN, as TCP does.  Lock held.  Returns 0 or
 * an errno value. */
static int rs_wait_connected(struct rsocket *rs, bool nonblock)
{
	int e;

	if (rs->state != RS_ADDR_QUERY && rs->state != RS_ROUTE_QUERY &&
	    rs->state != RS_CONNECTING && rs->state != RS_FAILED)
		return 0;
	if (rs_wait(rs, rs_connect_done, nonblock, -1) == -EAGAIN)
		return EAGAIN;
	if (rs->state == RS_FAILED) {
		e = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
		return e;
	}
	return 0;
}

/* The error a send on a socket that cannot send reports. */
static int rs_send_error(struct rsocket *rs)
{
	int e;

	if (rs->state != RS_CONNECTED)
		return ENOTCONN;
	if (rs->err) {
		e = rs->err;
		rs->err = 0;
		return e;
	}
	return EPIPE;
}

/* The arguments of a send or receive call: 0 and their total length, or
 * the errno to fail with. */
static int rs_iov_check(const struct iovec *iov, int iovcnt, int flags,
			size_t *total)
{
	*total = 0;
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return EINVAL;
	if (iovcnt && !iov)
		return EFAULT;
	if (flags & (MSG_OOB | MSG_ERRQUEUE))
		return EOPNOTSUPP;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len && !iov[i].iov_base)
			return EFAULT;
		if (iov[i].iov_len > SSIZE_MAX - *total)
			return EINVAL;
		*total += iov[i].iov_len;
	}
	return 0;
}

static ssize_t rs_sendv(int socket, const struct iovec *iov, int iovcnt,
			int flags)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iter it = { iov, iovcnt, 0 };
	size_t total = 0, sent = 0;
	bool nonblock;
	int ret = 0;

	if (!rs)
		return -1;
	ret = rs_iov_check(iov, iovcnt, flags, &total);
	if (ret)
		return cma_err(ret);
	pthread_mutex_lock(&rs->lock);
	nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	ret = rs_wait_connected(rs, nonblock);
	if (!ret && rs->state != RS_CONNECTED)
		ret = ENOTCONN;
	if (ret)
		goto out;
	if (rs->cq)
		rs_poll_cq(rs);
	while (sent < total || total == 0) {
		uint64_t chunk, pos;

		if (rs->conn_dead || rs->wr_shut) {
			if (!sent)
				ret = rs->wr_shut ? EPIPE : rs_send_error(rs);
			break;
		}
		if (total == 0)
			break;
		if (!rs_send_room(rs)) {
			int w = rs_wait(rs, rs_can_send, nonblock, -1);

			if (w == -EAGAIN) {
				if (!sent)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		pos = rs->tx_sent % rs->tx_size;
		chunk = total - sent;
		if (chunk > RS_MAX_CHUNK)
			chunk = RS_MAX_CHUNK;
		if (chunk > rs_tx_space(rs))
			chunk = rs_tx_space(rs);
		if (chunk > rs->tx_size - pos)
			chunk = rs->tx_size - pos;
		if (!rs_inline_ok(rs, &it, chunk) && chunk > rs_sbuf_free(rs))
			chunk = rs_sbuf_free(rs);
		if (rs_post_data(rs, &it, chunk, rs->tx_addr + pos, rs->tx_rkey, true))
			continue;	/* conn_dead now */
		rs->tx_sent += chunk;
		rs->tx_msgs++;
		sent += chunk;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return cma_err(ret);
	return (ssize_t)sent;
}

RS_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	struct iovec iov = { (void *)buf, len };

	return rs_sendv(socket, &iov, 1, flags);
}

RS_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
			  const struct sockaddr *dest_addr, socklen_t addrlen)
{
	/* connection-mode socket: the address is ignored, as TCP does */
	(void)dest_addr;
	(void)addrlen;
	return rsend(socket, buf, len, flags);
}

RS_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	if (!msg)
		return cma_err(EFAULT);
	return rs_sendv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

RS_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count)
{
	return rsend(socket, buf, count, 0);
}

RS_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	return rs_sendv(socket, iov, iovcnt, 0);
}

static bool rs_readable(struct rsocket *rs)
{
	return rs->rx_tail != rs->rx_head || rs->peer_shut || rs->conn_dead ||
	       rs->rd_shut || rs->state != RS_CONNECTED;
}

static ssize_t rs_recvv(int socket, const struct iovec *iov, int iovcnt,
			int flags)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iter it = { iov, iovcnt, 0 };
	size_t total = 0, got = 0;
	bool nonblock, peek = flags & MSG_PEEK;
	int i, ret = 0;

	if (!rs)
		return -1;
	ret = rs_iov_check(iov, iovcnt, flags, &total);
	if (ret)
		return cma_err(ret);
	pthread_mutex_lock(&rs->lock);
	nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	ret = rs_wait_connected(rs, nonblock);
	if (!ret && rs->state != RS_CONNECTED)
		ret = ENOTCONN;
	if (ret)
		goto out;
	while (got < total) {
		uint64_t avail, pos, n;

		if (rs->rd_shut)
			break;
		if (rs->cq && rs->rx_tail == rs->rx_head)
			rs_poll_cq(rs);
		avail = rs->rx_tail - rs->rx_head;
		if (peek && got)
			break;
		if (!avail) {
			if (got && !(flags & MSG_WAITALL))
				break;
			if (rs->peer_shut)
				break;	/* EOF */
			if (rs->conn_dead) {
				if (!got && rs->err) {
					ret = rs->err;
					rs->err = 0;
				}
				break;
			}
			i = rs_wait(rs, rs_readable, nonblock, -1);
			if (i == -EAGAIN) {
				if (!got)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		/* copy out of the ring, in at most two pieces */
		pos = rs->rx_head % rs->rbuf_size;
		n = total - got;
		if (n > avail)
			n = avail;
		if (n > rs->rbuf_size - pos) {
			uint64_t first = rs->rbuf_size - pos;

			iter_copy(&it, rs->rbuf + pos, first, false);
			iter_copy(&it, rs->rbuf, n - first, false);
		} else {
			iter_copy(&it, rs->rbuf + pos, n, false);
		}
		got += n;
		if (!peek) {
			rs->rx_head += n;
			rs_update_credits(rs);
		} else {
			break;
		}
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return cma_err(ret);
	return (ssize_t)got;
}

RS_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	struct iovec iov = { buf, len };

	return rs_recvv(socket, &iov, 1, flags);
}

RS_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
			    struct sockaddr *src_addr, socklen_t *addrlen)
{
	ssize_t ret = rrecv(socket, buf, len, flags);

	/* a connection-mode socket returns no address, as TCP does */
	if (ret >= 0 && src_addr && addrlen)
		*addrlen = 0;
	return ret;
}

RS_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	ssize_t ret;

	if (!msg)
		return cma_err(EFAULT);
	ret = rs_recvv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
	if (ret >= 0) {
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
		msg->msg_flags = 0;
	}
	return ret;
}

RS_EXPORT ssize_t rread(int socket, void *buf, size_t count)
{
	return rrecv(socket, buf, count, 0);
}

RS_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	return rs_recvv(socket, iov, iovcnt, 0);
}

/* ------------------------------------------------------------------ */
/* Polling                                                            */
/* ------------------------------------------------------------------ */

/* The poll events of an rsocket now.  Lock held. */
static short rs_revents(struct rsocket *rs, short events)
{
	short r = 0;

	switch (rs->state) {
	case RS_IDLE:
		r = POLLOUT | POLLHUP;
		break;
	case RS_LISTENING:
		if (rs->req_head)
			r = POLLIN;
		break;
	case RS_ADDR_QUERY:
	case RS_ROUTE_QUERY:
	case RS_CONNECTING:
		break;
	case RS_FAILED:
		r = POLLOUT | POLLHUP | (rs->err ? POLLERR : 0);
		break;
	case RS_CONNECTED:
		if (rs->rx_tail != rs->rx_head || rs->peer_shut || rs->rd_shut ||
		    rs->conn_dead)
			r |= POLLIN;
		if (rs->peer_shut || rs->conn_dead)
			r |= POLLRDHUP;
		if (rs_can_send(rs))
			r |= POLLOUT;
		/* as TCP: the peer's clean end of stream is POLLIN|POLLRDHUP;
		 * POLLHUP once both directions are shut, or on a reset */
		if ((rs->conn_dead && !rs->peer_shut) ||
		    (rs->wr_shut && (rs->peer_shut || rs->rd_shut)))
			r |= POLLHUP;
		if (rs->err)
			r |= POLLERR;
		break;
	}
	return r & (events | POLLERR | POLLHUP | POLLNVAL);
}

/* Check every entry once; rsockets make progress.  Normal fds are asked
 * only with look (else their last answer stands: a system call per spin
 * would eat the spin).  Returns the number of entries with revents. */
static int rs_poll_check(struct pollfd *fds, nfds_t nfds, struct rsocket **map,
			 struct pollfd *norm, int nnorm, bool look)
{
	int cnt = 0, j = 0;

	if (look && nnorm > 0) {
		int r = poll(norm, (nfds_t)nnorm, 0);

		if (r < 0)
			return -1;
	}
	for (nfds_t i = 0; i < nfds; i++) {
		struct rsocket *rs = map[i];

		if (rs) {
			pthread_mutex_lock(&rs->lock);
			rs_progress(rs);
			fds[i].revents = rs_revents(rs, fds[i].events);
			pthread_mutex_unlock(&rs->lock);
		} else if (fds[i].fd >= 0) {
			fds[i].revents = norm[j++].revents;
		} else {
			fds[i].revents = 0;
		}
		if (fds[i].revents)
			cnt++;
	}
	return cnt;
}

RS_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	struct rsocket *map_s[16], **map = map_s;
	struct pollfd norm_s[16], *norm = norm_s, sleep_s[48], *sl = sleep_s;
	uint64_t start, deadline = 0, spin_end;
	int nrs = 0, nnorm = 0, ret, spin_miss = 0;
	bool slept = false;

	if (nfds && !fds)
		return cma_err(EFAULT);
	if (nfds > (nfds_t)INT_MAX / 3)
		return cma_err(EINVAL);
	for (nfds_t i = 0; i < nfds; i++)
		if (rs_lookup(fds[i].fd))
			nrs++;
	if (!nrs)
		return poll(fds, nfds, timeout);

	if (nfds > 16) {
		map = calloc(nfds, sizeof(*map));
		norm = calloc(nfds, sizeof(*norm));
		if (!map || !norm) {
			free(map);
			free(norm);
			return cma_err(ENOMEM);
		}
	}
	if (nfds * 3 > 48) {
		sl = calloc(nfds * 3, sizeof(*sl));
		if (!sl) {
			ret = cma_err(ENOMEM);
			goto out;
		}
	}
	for (nfds_t i = 0; i < nfds; i++) {
		map[i] = rs_lookup(fds[i].fd);
		if (map[i]) {
			if (map[i]->spin_miss > spin_miss)
				spin_miss = map[i]->spin_miss;
		} else if (fds[i].fd >= 0) {
			norm[nnorm].fd = fds[i].fd;
			norm[nnorm].events = fds[i].events;
			norm[nnorm].revents = 0;
			nnorm++;
		}
	}

	start = cma_now_ns();
	if (timeout > 0)
		deadline = start + (uint64_t)timeout * 1000000ull;
	spin_end = start + (rs_spin_us <= 0 ? 0 :
			    spin_miss >= 8 ? 1000ull : (uint64_t)rs_spin_us * 1000ull);
	for (bool look = true;;) {
		int nsl = 0, ms;
		uint64_t t;

		ret = rs_poll_check(fds, nfds, map, norm, nnorm, look);
		look = false; /* until after a sleep */
		if (ret != 0 || timeout == 0)
			break;
		t = cma_now_ns();
		if (deadline && t >= deadline)
			break;
		if (t < spin_end) {
			cpu_relax();
			continue;
		}
		/* arm every rsocket, look once more, then sleep on the fds */
		for (nfds_t i = 0; i < nfds; i++) {
			struct rsocket *rs = map[i];

			if (!rs) {
				if (fds[i].fd >= 0) {
					sl[nsl].fd = fds[i].fd;
					sl[nsl].events = fds[i].events;
					sl[nsl].revents = 0;
					nsl++;
				}
				continue;
			}
			pthread_mutex_lock(&rs->lock);
			rs_arm(rs);
			rs_progress(rs);
			fds[i].revents = rs_revents(rs, fds[i].events);
			if (fds[i].revents)
				ret++;
			nsl += rs_sleep_fds(rs, &sl[nsl]);
			pthread_mutex_unlock(&rs->lock);
		}
		if (ret) {
			/* normal fds were not looked at in this pass */
			ret = rs_poll_check(fds, nfds, map, norm, nnorm, true);
			break;
		}
		ms = RS_WAKE_MS;
		if (timeout > 0) {
			uint64_t left = (deadline - t + 999999) / 1000000;

			if (left < (uint64_t)ms)
				ms = (int)left;
		}
		ret = poll(sl, (nfds_t)nsl, ms);
		slept = true;
		look = true;
		if (ret < 0) {
			if (errno == EINTR)
				break;
			goto out;
		}
		/* CM fds that fired: the owners look at their events */
		for (int k = 0; k < nsl; k++) {
			if (!sl[k].revents)
				continue;
			for (nfds_t i = 0; i < nfds; i++) {
				struct rsocket *rs = map[i];

				if (rs && rs->fd == sl[k].fd) {
					pthread_mutex_lock(&rs->lock);
					rs->cm_due = true;
					pthread_mutex_unlock(&rs->lock);
				}
			}
		}
	}
	/* adapt: a wait that needed a long sleep means spinning was wasted */
	if (ret > 0) {
		bool long_wait = slept && cma_now_ns() - start > 1000000ull;

		for (nfds_t i = 0; i < nfds; i++) {
			struct rsocket *rs = map[i];

			if (rs && fds[i].revents) {
				if (long_wait)
					rs->spin_miss++;
				else
					rs->spin_miss = 0;
			}
		}
	}
out:
	if (map != map_s)
		free(map);
	if (norm != norm_s)
		free(norm);
	if (sl != sleep_s)
		free(sl);
	return ret;
}

RS_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds,
		      fd_set *exceptfds, struct timeval *timeout)
{
	struct pollfd *fds;
	int n = 0, ret, timeout_ms, cnt = 0;

	if (nfds < 0 || nfds > FD_SETSIZE)
		return cma_err(EINVAL);
	if (timeout) {
		if (timeout->tv_sec < 0 || timeout->tv_usec < 0)
			return cma_err(EINVAL);
		if (timeout->tv_sec > INT_MAX / 1000 - 1)
			timeout_ms = INT_MAX;
		else
			timeout_ms = (int)(timeout->tv_sec * 1000 +
					   (timeout->tv_usec + 999) / 1000);
	} else {
		timeout_ms = -1;
	}
	fds = calloc(nfds ? (size_t)nfds : 1, sizeof(*fds));
	if (!fds)
		return cma_err(ENOMEM);
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (exceptfds && FD_ISSET(fd, exceptfds))
			ev |= POLLPRI;
		if (ev) {
			fds[n].fd = fd;
			fds[n].events = ev;
			n++;
		}
	}
	ret = rpoll(fds, (nfds_t)n, timeout_ms);
	if (ret < 0) {
		free(fds);
		return ret;
	}
	for (int i = 0; i < n; i++) {
		short r = fds[i].revents;

		if (r & POLLNVAL) {
			free(fds);
			return cma_err(EBADF);
		}
	}
	if (readfds)
		FD_ZERO(readfds);
	if (writefds)
		FD_ZERO(writefds);
	if (exceptfds)
		FD_ZERO(exceptfds);
	for (int i = 0; i < n; i++) {
		short r = fds[i].revents, ev = fds[i].events;

		if ((ev & POLLIN) && (r & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(fds[i].fd, readfds);
			cnt++;
		}
		if ((ev & POLLOUT) && (r & (POLLOUT | POLLERR))) {
			FD_SET(fds[i].fd, writefds);
			cnt++;
		}
		if ((ev & POLLPRI) && (r & POLLPRI)) {
			FD_SET(fds[i].fd, exceptfds);
			cnt++;
		}
	}
	free(fds);
	return cnt;
}

/* ------------------------------------------------------------------ */
/* Shutdown and close                                                 */
/* ------------------------------------------------------------------ */

static bool rs_ctl_sent(struct rsocket *rs)
{
	return rs->conn_dead || (rs->shut_sent && !rs->iomap_q);
}

static bool rs_sends_done(struct rsocket *rs)
{
	return rs->conn_dead || rs->sq_used == 0 ||
	       rs->sq_used == (int)rs->unsig_cnt;	/* no completion will come */
}

RS_EXPORT int rshutdown(int socket, int how)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0;

	if (!rs)
		return -1;
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return cma_err(EINVAL);
	pthread_mutex_lock(&rs->lock);
	if (rs->state != RS_CONNECTED) {
		ret = ENOTCONN;
		goto out;
	}
	if (how == SHUT_RD || how == SHUT_RDWR)
		rs->rd_shut = true;
	if ((how == SHUT_WR || how == SHUT_RDWR) && !rs->wr_shut) {
		rs->wr_shut = true;
		rs_progress(rs);	/* posts the SHUTDOWN if it can */
		if (!rs->shut_sent && !rs->conn_dead)
			rs_wait(rs, rs_ctl_sent, rs->nonblock, RS_CLOSE_MS);
	}
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rclose(int socket)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	rs_index_remove(rs);
	pthread_mutex_lock(&rs->lock);
	if (rs->state == RS_CONNECTED && !rs->conn_dead) {
		bool abort = rs->linger.l_onoff && rs->linger.l_linger == 0;
		int ms = rs->linger.l_onoff ? rs->linger.l_linger * 1000 : RS_CLOSE_MS;

		if (!abort) {
			/* end of stream first, then let what is in flight land */
			rs->wr_shut = true;
			rs_wait(rs, rs_ctl_sent, false, ms);
			rs_wait(rs, rs_sends_done, false, ms);
		}
	}
	rs->closing = true;
	if (rs->id && !rs->disconnected &&
	    (rs->state == RS_CONNECTED || rs->state == RS_CONNECTING)) {
		rdma_disconnect(rs->id);
		rs->disconnected = true;
	}
	/* events still queued must be acknowledged before the id goes */
	if (rs->chan) {
		struct rdma_cm_event *ev;

		while (!rdma_get_cm_event(rs->chan, &ev)) {
			if (rs->state == RS_LISTENING)
				rs_listener_event(rs, ev);
			else
				rdma_ack_cm_event(ev);
		}
	}
	pthread_mutex_unlock(&rs->lock);
	rs_free(rs);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Addresses                                                          */
/* ------------------------------------------------------------------ */

static int rs_getname(int socket, struct sockaddr *addr, socklen_t *addrlen,
		      bool peer)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	if (!addr || !addrlen)
		return cma_err(EFAULT);
	pthread_mutex_lock(&rs->lock);
	if (peer && rs->state != RS_CONNECTED) {
		pthread_mutex_unlock(&rs->lock);
		return cma_err(ENOTCONN);
	}
	rs_copy_addr(addr, addrlen,
		     peer ? rdma_get_peer_addr(rs->id) :
		     rs->id ? rdma_get_local_addr(rs->id) : NULL,
		     rs->domain);
	pthread_mutex_unlock(&rs->lock);
	return 0;
}

RS_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	return rs_getname(socket, addr, addrlen, true);
}

RS_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	return rs_getname(socket, addr, addrlen, false);
}

/* ------------------------------------------------------------------ */
/* Options                                                            */
/* ------------------------------------------------------------------ */

static int rs_opt_int(const void *optval, socklen_t optlen, int *v)
{
	if (!optval)
		return EFAULT;
	if (optlen < (socklen_t)sizeof(int))
		return EINVAL;
	memcpy(v, optval, sizeof(int));
	return 0;
}

/* Before the endpoint exists, queue sizes can change. */
static bool rs_configurable(const struct rsocket *rs)
{
	return rs->state == RS_IDLE || rs->state == RS_LISTENING ||
	       rs->state == RS_ADDR_QUERY;
}

RS_EXPORT int rsetsockopt(int socket, int level, int optname,
			  const void *optval, socklen_t optlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0, v = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	switch (level) {
	case SOL_SOCKET:
		if (optname == SO_LINGER) {
			if (!optval) {
				ret = EFAULT;
				break;
			}
			if (optlen < (socklen_t)sizeof(struct linger)) {
				ret = EINVAL;
				break;
			}
			memcpy(&rs->linger, optval, sizeof(struct linger));
			if (rs->linger.l_linger < 0)
				rs->linger.l_linger = 0;
			break;
		}
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		switch (optname) {
		case SO_REUSEADDR:
			rs->reuseaddr = v != 0;
			/* passed on to the CM; refused there only before the
			 * CM supports it, which changes nothing on one host */
			if (rs->id)
				rdma_set_option(rs->id, RDMA_OPTION_ID,
						RDMA_OPTION_ID_REUSEADDR, &v, sizeof(v));
			break;
		case SO_SNDBUF:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			if (rs_configurable(rs))
				rs->sbuf_size = clamp_u32((uint64_t)v, RS_MIN_BUF, RS_MAX_BUF);
			break;
		case SO_RCVBUF:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			if (rs_configurable(rs))
				rs->rbuf_size = clamp_u32((uint64_t)v, RS_MIN_BUF, RS_MAX_BUF);
			break;
		case SO_KEEPALIVE:	/* accepted, no effect (as rdma-core) */
			rs->keepalive = v != 0;
			break;
		case SO_OOBINLINE:
			rs->oobinline = v != 0;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_TCP:
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		switch (optname) {
		case TCP_NODELAY:	/* we never delay */
			rs->nodelay = v != 0;
			break;
		case TCP_MAXSEG:
			if (v < 88 || v > 65535) {
				ret = EINVAL;
				break;
			}
			rs->maxseg = v;
			break;
		case TCP_KEEPIDLE:
		case TCP_KEEPINTVL:
		case TCP_KEEPCNT:
			if (v < 1 || v > 32767) {
				ret = EINVAL;
				break;
			}
			if (optname == TCP_KEEPIDLE)
				rs->keepidle = v;
			else if (optname == TCP_KEEPINTVL)
				rs->keepintvl = v;
			else
				rs->keepcnt = v;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_IPV6:
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		if (optname != IPV6_V6ONLY || rs->domain != AF_INET6) {
			ret = ENOPROTOOPT;
			break;
		}
		if (rs->state != RS_IDLE || rs->bound) {
			ret = EINVAL;
			break;
		}
		rs->v6only = v != 0;
		if (rs->id)
			rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY,
					&v, sizeof(v));
		break;
	case SOL_RDMA:
		if (optname == RDMA_ROUTE) {
			/* path records: meaningless here (no IB subnet) */
			if (!optval)
				ret = EFAULT;
			else if (optlen % sizeof(struct ibv_path_data) || !optlen)
				ret = EINVAL;
			else if (!rs_configurable(rs))
				ret = EINVAL;
			break;
		}
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		if (optname != RDMA_SQSIZE && optname != RDMA_RQSIZE &&
		    optname != RDMA_INLINE && optname != RDMA_IOMAPSIZE) {
			ret = ENOPROTOOPT;
			break;
		}
		if (!rs_configurable(rs)) {
			ret = EINVAL;	/* the endpoint exists: too late */
			break;
		}
		switch (optname) {
		case RDMA_SQSIZE:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			rs->sq_size = (int)clamp_u32((uint64_t)v, RS_MIN_QSIZE, RS_MAX_QSIZE);
			break;
		case RDMA_RQSIZE:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			rs->rq_size = (int)clamp_u32((uint64_t)v, RS_MIN_QSIZE, RS_MAX_QSIZE);
			break;
		case RDMA_INLINE:
			if (v < 0) {
				ret = EINVAL;
				break;
			}
			rs->sq_inline = v > 4096 ? 4096 : v;
			break;
		case RDMA_IOMAPSIZE:
			if (v < 0) {
				ret = EINVAL;
				break;
			}
			rs->iomap_size = v > RS_MAX_IOMAP ? RS_MAX_IOMAP : v;
			break;
		}
		break;
	default:
		ret = ENOPROTOOPT;
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rgetsockopt(int socket, int level, int optname,
			  void *optval, socklen_t *optlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0, v = 0;
	bool is_int = true;

	if (!rs)
		return -1;
	if (!optval || !optlen)
		return cma_err(EFAULT);
	pthread_mutex_lock(&rs->lock);
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_ERROR:
			rs_progress(rs);
			v = rs->err;
			rs->err = 0;
			break;
		case SO_REUSEADDR:
			v = rs->reuseaddr;
			break;
		case SO_SNDBUF:
			v = (int)rs->sbuf_size;
			break;
		case SO_RCVBUF:
			v = (int)rs->rbuf_size;
			break;
		case SO_KEEPALIVE:
			v = rs->keepalive;
			break;
		case SO_OOBINLINE:
			v = rs->oobinline;
			break;
		case SO_TYPE:
			v = SOCK_STREAM;
			break;
		case SO_DOMAIN:
			v = rs->domain;
			break;
		case SO_PROTOCOL:
			v = IPPROTO_TCP;
			break;
		case SO_ACCEPTCONN:
			v = rs->state == RS_LISTENING;
			break;
		case SO_LINGER:
			is_int = false;
			if (*optlen < (socklen_t)sizeof(struct linger)) {
				ret = EINVAL;
				break;
			}
			memcpy(optval, &rs->linger, sizeof(struct linger));
			*optlen = sizeof(struct linger);
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_TCP:
		switch (optname) {
		case TCP_NODELAY:
			v = rs->nodelay;
			break;
		case TCP_MAXSEG:
			v = rs->maxseg ? rs->maxseg : RS_MSS;
			break;
		case TCP_KEEPIDLE:
			v = rs->keepidle;
			break;
		case TCP_KEEPINTVL:
			v = rs->keepintvl;
			break;
		case TCP_KEEPCNT:
			v = rs->keepcnt;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_IPV6:
		if (optname != IPV6_V6ONLY || rs->domain != AF_INET6)
			ret = ENOPROTOOPT;
		else
			v = rs->v6only;
		break;
	case SOL_RDMA:
		switch (optname) {
		case RDMA_SQSIZE:
			v = rs->sq_size;
			break;
		case RDMA_RQSIZE:
			v = rs->rq_size;
			break;
		case RDMA_INLINE:
			v = rs->qp ? rs->max_inline : rs->sq_inline;
			break;
		case RDMA_IOMAPSIZE:
			v = rs->iomap_size;
			break;
		case RDMA_ROUTE:
			is_int = false;
			*optlen = 0;	/* no path records */
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	default:
		ret = ENOPROTOOPT;
		break;
	}
	if (!ret && is_int) {
		if (*optlen < (socklen_t)sizeof(int)) {
			ret = EINVAL;
		} else {
			memcpy(optval, &v, sizeof(int));
			*optlen = sizeof(int);
		}
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rfcntl(int socket, int cmd, ... /* arg */)
{
	struct rsocket *rs = rs_get(socket);
	va_list ap;
	long arg;
	int ret = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	switch (cmd) {
	case F_GETFL:
		ret = O_RDWR | (rs->nonblock ? O_NONBLOCK : 0);
		break;
	case F_SETFL:
		va_start(ap, cmd);
		arg = va_arg(ap, long);
		va_end(ap);
		rs->nonblock = (arg & O_NONBLOCK) != 0;
		break;
	case F_GETFD:
		ret = fcntl(rs->fd, F_GETFD);
		break;
	case F_SETFD:
		va_start(ap, cmd);
		arg = va_arg(ap, long);
		va_end(ap);
		ret = fcntl(rs->fd, F_SETFD, (int)arg);
		break;
	default:
		ret = cma_err(EINVAL);
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Direct data placement                                              */
/* ------------------------------------------------------------------ */

static int rs_queue_iomap(struct rsocket *rs, const struct rs_iomap_local *m,
			  bool unmap)
{
	struct rs_iomap_msg *q = urdma_zalloc(sizeof(*q));

	if (!q)
		return -ENOMEM;
	q->index = (uint16_t)m->index;
	q->rkey = m->mr->rkey;
	q->offset = m->offset;
	q->addr = (uintptr_t)m->buf;
	q->len = unmap ? 0 : m->len;
	if (rs->iomap_q_tail)
		rs->iomap_q_tail->next = q;
	else
		rs->iomap_q = q;
	rs->iomap_q_tail = q;
	return 0;
}

RS_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags,
		       off_t offset)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iomap_local *m, *it;
	bool used[RS_MAX_IOMAP + 1];
	int ret = 0, idx = -1;

	if (!rs)
		return -1;
	if (!buf || !len || flags || (prot != PROT_WRITE && prot != PROT_NONE) ||
	    (offset < 0 && offset != -1))
		return cma_err(EINVAL);
	pthread_mutex_lock(&rs->lock);
	if (rs->state != RS_CONNECTED || !rs->pd || rs->conn_dead) {
		ret = EINVAL;
		goto out;
	}
	if (prot == PROT_WRITE) {
		memset(used, 0, sizeof(bool) * (size_t)(rs->peer_iomap_allow + 1));
		for (it = rs->iomaps; it; it = it->next)
			if (it->index >= 0 && it->index < rs->peer_iomap_allow)
				used[it->index] = true;
		for (int i = 0; i < rs->peer_iomap_allow; i++)
			if (!used[i]) {
				idx = i;
				break;
			}
		if (idx < 0) {
			ret = ENOMEM;
			goto out;
		}
	}
	m = urdma_zalloc(sizeof(*m));
	if (!m) {
		ret = ENOMEM;
		goto out;
	}
	m->mr = ibv_reg_mr(rs->pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
			   (prot == PROT_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0));
	if (!m->mr) {
		ret = errno ? errno : ENOMEM;
		urdma_free(m);
		goto out;
	}
	m->buf = buf;
	m->len = len;
	m->offset = offset == -1 ? (uint64_t)(uintptr_t)buf : (uint64_t)offset;
	m->index = idx;
	if (idx >= 0 && rs_queue_iomap(rs, m, false)) {
		ibv_dereg_mr(m->mr);
		urdma_free(m);
		ret = ENOMEM;
		goto out;
	}
	m->next = rs->iomaps;
	rs->iomaps = m;
	rs_progress(rs);	/* sends the update if it can */
	offset = (off_t)m->offset;
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : offset;
}

RS_EXPORT int riounmap(int socket, void *buf, size_t len)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iomap_local **pp, *m;
	int ret = EINVAL;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	for (pp = &rs->iomaps; (m = *pp); pp = &m->next) {
		if (m->buf != buf || m->len != len)
			continue;
		*pp = m->next;
		if (m->index >= 0 && !rs->conn_dead)
			rs_queue_iomap(rs, m, true);
		ibv_dereg_mr(m->mr);
		urdma_free(m);
		rs_progress(rs);
		ret = 0;
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset,
			  int flags)
{
	struct rsocket *rs = rs_get(socket);
	struct iovec iov = { (void *)buf, count };
	struct rs_iter it = { &iov, 1, 0 };
	size_t done = 0;
	bool nonblock;
	int ret = 0;

	if (!rs)
		return (size_t)-1;
	if ((count && !buf) || offset < 0)
		return (size_t)cma_err(count && !buf ? EFAULT : EINVAL);
	pthread_mutex_lock(&rs->lock);
	nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	if (rs->state != RS_CONNECTED) {
		ret = ENOTCONN;
		goto out;
	}
	if (rs->cq)
		rs_poll_cq(rs);
	while (done < count) {
		struct rs_iomap_peer *p = NULL;
		uint64_t off = (uint64_t)offset + done, chunk;

		if (rs->conn_dead || rs->wr_shut) {
			if (!done)
				ret = rs->wr_shut ? EPIPE : rs_send_error(rs);
			break;
		}
		for (int i = 0; rs->peer_iomap && i < rs->iomap_size; i++) {
			struct rs_iomap_peer *e = &rs->peer_iomap[i];

			if (e->len && off >= e->offset && off - e->offset < e->len) {
				p = e;
				break;
			}
		}
		if (!p) {
			if (!done)
				ret = EINVAL;	/* no mapping of the peer there */
			break;
		}
		if (!(rs_sq_free(rs) && rs_sbuf_free(rs) > 0)) {
			int w = rs_wait(rs, rs_can_iowrite, nonblock, -1);

			if (w == -EAGAIN) {
				if (!done)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		chunk = count - done;
		if (chunk > RS_MAX_CHUNK)
			chunk = RS_MAX_CHUNK;
		if (chunk > p->len - (off - p->offset))
			chunk = p->len - (off - p->offset);
		if (!rs_inline_ok(rs, &it, chunk) && chunk > rs_sbuf_free(rs))
			chunk = rs_sbuf_free(rs);
		if (rs_post_data(rs, &it, chunk, p->addr + (off - p->offset),
				 p->rkey, false))
			continue;
		done += chunk;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return (size_t)cma_err(ret);
	return done;
}
