/* SPDX-License-Identifier: MIT */
/*
 * liburdma's private header: the objects behind <urdma.h> and what its
 * files share.  Only the public verbs and rdma_cm APIs are used.
 *
 * Files: ctx.c (contexts, the fd, urdma_poll and the event queue, the
 * completion queue), pool.c (the message buffer pool, registered regions),
 * conn.c (connections: the CM, the QP, closing), msg.c (receives, sending,
 * completions), rma.c (one-sided operations), strerror.c.
 *
 * Wire (between two liburdma ends): the CM private data carries struct
 * api_hello then the application's hello, 56 bytes at most (what an IB CM
 * REQ carries after rdma_cm's header).  Every message is
 * a SEND WITH IMMEDIATE; the immediate carries the receive credits the
 * sender grants (API_IMM_CREDITS) and two flags: API_IMM_UPDATE (credits
 * only, nothing for the application) and API_IMM_BYE (the sender closes:
 * what came before is all).
 */
#ifndef URDMA_API_PRIV_H
#define URDMA_API_PRIV_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "urdma.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/log.h"

#define API_EXPORT __attribute__((visibility("default")))

#define API_MAGIC 0x5552u /* "UR" */
#define API_VERSION 2
struct api_hello {
	uint16_t magic;	  /* big-endian, as the rest */
	uint8_t version;
	uint8_t hello_len;
	uint32_t credits; /* receives posted for the peer */
	uint32_t max_msg; /* the largest message they take (buf_size) */
} __attribute__((packed));
_Static_assert(sizeof(struct api_hello) + URDMA_HELLO_MAX == 56,
	       "CM private data");

#define API_IMM_CREDITS 0x00ffffffu
#define API_IMM_UPDATE 0x01000000u
#define API_IMM_BYE 0x02000000u

#define API_SLAB_BUFS 256

struct api_slab {
	struct api_slab *next;
	uint8_t *base;
	size_t bytes;
	struct ibv_mr *mr;
	uint8_t *held; /* per buffer: the application holds it */
};

struct api_buf {
	void *p;
	uint32_t lkey;
};

struct urdma_mem {
	struct urdma_mem *next;
	urdma_ctx *ctx;
	struct ibv_mr *mr;
	uint64_t addr, len;
	int access; /* IBV_ACCESS_* */
};

enum api_state {
	ST_LISTEN,
	ST_RESOLVING,	/* address, then route */
	ST_CONNECTING,	/* rdma_connect sent */
	ST_ACCEPTING,	/* ACCEPTED reported: rdma_accept at the next poll */
	ST_ACCEPT_SENT, /* waiting for ESTABLISHED */
	ST_OPEN,
	ST_CLOSING,	/* ours: sending what is queued, then BYE */
	ST_DRAINING,	/* disconnected: waiting for the QP's WRs to flush */
	ST_DEAD,	/* CLOSED reported; freed at the next poll */
	ST_ZOMBIE,	/* freed, but its drain WRs never came back: kept
			 * until the context goes, completions ignored */
};

enum api_op { OP_SEND = 1, OP_WRITE, OP_READ, OP_ATOMIC, OP_BYE, OP_DRAIN };

/* A posted send-queue WR. */
struct api_srec {
	urdma_conn *conn;
	void *buf;  /* a pool buffer to give back when done, or NULL */
	void *user;
	uint8_t op;
	bool event; /* report its completion */
	uint16_t slot; /* OP_ATOMIC: the result slot */
};

/* A posted receive. */
struct api_rrec {
	urdma_conn *conn;
	void *buf;
	uint32_t lkey;
};

/* A message waiting for credits or send-queue room. */
struct api_pending {
	void *buf; /* a pool buffer */
	uint32_t len, lkey;
	bool copy; /* ours (a copy), not lent by the application */
	void *user;
};

/* What a WRITABLE event waits for. */
enum {
	WANT_COPY = 1, /* a copy's pool buffer, or room to send inline now */
	WANT_SQ = 2,   /* send-queue room (and the atomics' result slots) */
};

struct urdma_conn {
	urdma_ctx *ctx;
	struct list_head node;	/* ctx->conns (ctx->zombies once freed) */
	struct list_head tnode; /* ctx->timed: has a deadline */
	struct list_head dnode; /* ctx->dirty: credits or queue to flush */
	struct list_head rnode; /* ctx->dead: CLOSED handed out */
	struct list_head snode; /* ctx->starved: receives short of buffers */
	struct list_head anode; /* ctx->accepting: rdma_accept at the next poll */
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	enum api_state state;
	int err;	   /* the first error: the CLOSED status */
	bool bye_rcvd;	   /* the peer closed in order */
	bool peer_gone;	   /* DISCONNECTED: a reset unless BYE came */
	bool bye_sent;
	bool closed_by_app;
	uint8_t want_writable; /* WANT_*: why a call got -EAGAIN */
	uint32_t want_len;     /* WANT_COPY: the shortest message refused */
	void *user;
	uint64_t deadline_ns; /* connect, or drain */
	/* hello: ours (listener: for each accepted conn) and the peer's */
	uint8_t hello[URDMA_HELLO_MAX];
	uint8_t hello_len;
	uint8_t peer_hello[URDMA_HELLO_MAX];
	uint8_t peer_hello_len;
	/* send queue */
	struct api_srec *srec;
	uint32_t sq_size, sq_head, sq_tail; /* posted: head - tail */
	uint32_t inline_max; /* cfg's, or less if the device takes less */
	uint32_t unsignaled;
	uint32_t credits;   /* sends the peer has receives for */
	uint32_t peer_max;  /* the largest message the peer takes; 0: not
			     * known yet (not connected) */
	uint32_t owed;	    /* receives re-posted, not yet granted */
	struct api_pending *pend; /* a ring of pend_cap (a power of 2) */
	uint32_t pend_cap, pend_head, pend_tail; /* queued: head - tail */
	uint32_t pend_copies;
	/* receive queue */
	struct api_rrec *rrec;
	uint32_t rq_size, rq_posted;
	/* atomics: 8-byte results in one pool buffer */
	uint64_t *aslots;
	uint32_t aslot_n, aslot_next, aslot_busy, aslot_lkey;
	/* a drain WR posted in each queue when disconnected (the send
	 * queue has one slot more than sq_size for it) */
	bool sdrain, rdrain;
	struct api_rrec drain_rrec;
	struct api_srec drain_srec;
};

struct api_evq {
	urdma_event *ev;
	uint32_t cap, head, tail; /* queued: tail - head */
};

struct urdma_ctx {
	urdma_cfg cfg;
	bool threadsafe;
	pthread_mutex_t lock;
	struct ibv_context *verbs;
	struct ibv_device_attr dattr;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
	int cq_size, cq_need;
	bool armed;
	uint32_t cq_events; /* to acknowledge */
	struct rdma_event_channel *cm;
	int epfd, evfd, tfd;
	uint64_t timer_ns; /* what tfd is armed for; 0: nothing */
	bool kicked;
	bool in_progress; /* events pushed now are taken before returning */
	bool fd_given;	  /* urdma_ctx_fd was called: someone may sleep on it */
	uint8_t spin_miss; /* waits in a row that a spin would not have met */
	bool spin_auto;	   /* spin_us left to us: spin_ns follows the waits */
	uint64_t spin_ns;  /* how long a wait polls before it sleeps */
	uint64_t wait_ns;  /* spin_auto: recent waits that slept, averaged */
	uint16_t probe_wait, probe_every; /* ctx.c spin_first */
	uint64_t fds_ns;   /* when progress() last looked at the fds */
	/* pool */
	struct api_slab *slabs;
	struct api_buf *free_bufs;
	uint32_t nfree, nbufs;
	struct urdma_mem *mems, *last_mem;
	/* connections, and lists of some of them */
	struct list_head conns, timed, dirty, dead, zombies, starved, accepting;
	uint32_t nconns; /* live (not yet freed): room kept in q for each */
	struct api_evq q;
};

/* ctx.c */
int api_evq_reserve(urdma_ctx *ctx);
void api_evq_release(urdma_ctx *ctx);
int api_push(urdma_ctx *ctx, int type, int status, urdma_conn *c, void *user,
	     void *buf, size_t len, uint64_t value);
void api_kick(urdma_ctx *ctx);
void api_timer_update(urdma_ctx *ctx);
int api_cq_grow(urdma_ctx *ctx, int more);
int api_wc_errno(enum ibv_wc_status st);

/* pool.c */
int api_pool_init(urdma_ctx *ctx);
void api_pool_fini(urdma_ctx *ctx);
/* A free buffer and its lkey (NULL if none and the pool is full). */
void *api_buf_get(urdma_ctx *ctx, uint32_t *lkey);
void api_buf_put(urdma_ctx *ctx, void *buf);
/* The held byte of the pool buffer that starts at p (1 while the
 * application holds it: urdma_buf_alloc and RECV events hand buffers
 * over, urdma_send and urdma_buf_free take them back), and its lkey; NULL
 * if p starts no pool buffer (the application's own memory). */
uint8_t *api_buf_held(urdma_ctx *ctx, const void *p, uint32_t *lkey);
/* The lkey of [p, p+len) (pool or registered region), or -EFAULT; write:
 * the memory must be writable by the device. */
int64_t api_lkey(urdma_ctx *ctx, const void *p, size_t len, bool write);

/* conn.c */
void api_cm_events(urdma_ctx *ctx);
void api_accept_pending(urdma_ctx *ctx);
void api_expire(urdma_ctx *ctx, uint64_t now);
void api_reap(urdma_ctx *ctx);
void api_conn_fail(urdma_conn *c, int err);
void api_conn_free(urdma_conn *c);
void api_conn_disconnect(urdma_conn *c);
void api_drain_check(urdma_conn *c);
void api_mark_dirty(urdma_conn *c);
bool api_close_all(urdma_ctx *ctx);

/* msg.c */
#define RECV_TAG 1ull /* low bit of a receive's wr_id */
uint32_t api_sq_size(uint32_t depth);
void api_refill(urdma_conn *c);
uint32_t api_queued(const urdma_conn *c);
void api_flush(urdma_conn *c);
void api_flush_dirty(urdma_ctx *ctx);
void api_wc(urdma_ctx *ctx, const struct ibv_wc *wc);
int api_post_send(urdma_conn *c, struct ibv_send_wr *wr, void *buf,
		  void *user, uint8_t op, bool event, uint16_t slot);

/* A failed call's errno as a negative value (EIO if it set none). */
static inline int api_errno(void)
{
	return errno ? -errno : -EIO;
}

/* The context's lock, when it was made URDMA_CFG_THREADSAFE. */
static inline void api_lock(urdma_ctx *ctx)
{
	if (ctx->threadsafe)
		pthread_mutex_lock(&ctx->lock);
}

static inline void api_unlock(urdma_ctx *ctx)
{
	if (ctx->threadsafe)
		pthread_mutex_unlock(&ctx->lock);
}

#endif
