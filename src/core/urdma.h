/* SPDX-License-Identifier: MIT */
/*
 * Internal objects of the software RNIC.  Each embeds the public verbs object
 * first and is recovered with a to_u*() helper.
 *
 * Locks (outer to inner): urdma_proc.lock > context.lock > qp.sq_lock >
 * qp.rq_lock > cq.lock > channel.lock.  The data path takes at most one
 * sq_lock and one cq lock.  Shared-memory rings need no lock across
 * processes: each index has one writer (see core/shared.h).
 */
#ifndef URDMA_H
#define URDMA_H

#include <dirent.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/shared.h"
#include "util/clock.h"
#include "util/list.h"

#define URDMA_DEV_NAME "urdma0"
#define URDMA_VENDOR_ID 0xffffff /* not an IEEE OUI of any real vendor */
#define URDMA_VENDOR_PART 0x5552
#define URDMA_MAX_QP_WR 16384
#define URDMA_MAX_SGE 32
#define URDMA_MAX_CQE (1 << 20)
#define URDMA_MAX_SRQ 65536
#define URDMA_MAX_SRQ_WR 16384
#define URDMA_MAX_INLINE 1024
#define URDMA_MAX_RD_ATOM 16
#define URDMA_MAX_QP (1 << 16)
#define URDMA_MAX_PD (1 << 16)
#define URDMA_MAX_GID 16
#define URDMA_MAX_MR_SIZE (1ULL << 40)

/* The pre-port_cap_flags2 ibv_port_attr the exported ibv_query_port and the
 * legacy ops slot fill: 48 bytes, without port_cap_flags2. */
#define URDMA_COMPAT_PORT_ATTR_SIZE offsetof(struct ibv_port_attr, port_cap_flags2)

/* One read of a value another process may change at any moment. */
#define READ_ONCE(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

#define container_of(ptr, type, member)                                        \
	((type *)((char *)(ptr) - offsetof(type, member)))

struct urdma_device {
	struct ibv_device ibdev;
	/* The verbs_device ops slot: provider libraries (libmlx5, libefa)
	 * compare it with their own ops and so leave our device alone. */
	const void *ops;
	uint64_t guid;
};

struct urdma_gid {
	union ibv_gid gid;
	uint32_t ifindex;
};

struct urdma_async_event {
	struct ibv_async_event ev;
};

struct urdma_context {
	struct verbs_context vctx; /* must be first: the ABI layout */
	pthread_mutex_t lock;
	struct list_head node; /* in the progress thread's list */
	struct list_head qps;
	_Atomic int nqps; /* QPs created and not destroyed: max_qp at most */
	struct list_head srqs;
	/* Memory windows' state, innermost of all locks (sq_lock, CQ locks
	 * are outer): mrs[] is written under lock and mw_lock both, so
	 * either reads it. */
	pthread_mutex_t mw_lock;
	uint32_t ctx_id;
	struct urdma_shm_ctx *shm; /* our MR table, read-only to peers */
	struct urdma_host_ctx *host; /* socket and peers (host.c) */
	struct urdma_mr **mrs; /* by MR index */
	int num_mrs;
	struct urdma_gid gids[URDMA_MAX_GID];
	int num_gids;
	uint16_t lid;
	uint8_t link_layer; /* IBV_LINK_LAYER_*: URDMA_LINK_LAYER */
	/* other hosts' LIDs, with the GIDs that came with them (ud.c) */
	pthread_mutex_t lid_lock;
	struct urdma_lid_gid {
		uint16_t lid;
		uint8_t sgid_index;
		union ibv_gid gid;
	} *lids;
	unsigned int nlids, lid_cap;
	/* async events */
	pthread_mutex_t ev_lock;
	struct ibv_async_event *events;
	unsigned int ev_head, ev_count, ev_cap;
};

struct urdma_pd {
	struct ibv_pd ibpd;
	uint32_t id; /* a parent domain has its PD's: objects made with it
		      * belong to that PD */
	_Atomic int usecnt;
	struct urdma_pd *pd;	/* a parent domain: the PD it stands for */
	struct urdma_td *td;	/* and its thread domain, or NULL */
};

/* A thread domain: a promise of one thread, which urdma does not need. */
struct urdma_td {
	struct ibv_td ibtd;
	_Atomic int usecnt;
};

struct urdma_mr {
	struct ibv_mr ibmr;
	struct urdma_shm_mr *shm;
	uint64_t iova;
	uint64_t length;
	uint64_t va;
	uint32_t access;
	bool direct; /* not backed: URDMA_MR_F_DIRECT */
	/* A memory window's entry (mw.c): URDMA_MR_F_MW, and the QP a type 2
	 * one is bound to; an MR counts the windows bound to it. */
	uint32_t mw_flags;
	uint32_t qpn;
	_Atomic int num_mw;
};

/* A memory window: an entry of the MR table of its own (slot). */
struct urdma_mw {
	struct ibv_mw ibmw;
	struct urdma_mr slot;
	struct urdma_mr *bound; /* the MR it is bound to, or NULL */
};

struct urdma_channel {
	struct ibv_comp_channel ch;
	pthread_mutex_t lock;
	struct urdma_cq **q; /* CQs that fired, FIFO */
	unsigned int head, count, cap;
	/* Signaled WRs of the XRC send QPs whose send CQ is on this
	 * channel: given to the transport, and completed (or forgotten with
	 * their QP).  An XRC SRQ's receive event on the channel waits for
	 * those taken before it (srq.c: xrc_event_waits). */
	_Atomic uint32_t xrc_taken, xrc_done;
};

struct urdma_cqe {
	struct ibv_wc wc;
	struct urdma_qp *qp;
	uint32_t retire; /* send WRs this completion retires */
	uint64_t ts;     /* when pushed, if the CQ stamps (cq->stamp) */
};

struct urdma_cq {
	union { /* ibv_cq_ex begins as ibv_cq does */
		struct ibv_cq ibcq;
		struct ibv_cq_ex ibcq_ex;
	};
	pthread_mutex_t lock;
	struct urdma_cqe *ring;
	uint32_t size; /* power of two */
	uint32_t head, tail;
	struct list_head node; /* in the process's list (progress.c) */
	struct list_head send_qps, recv_qps;
	/* Of recv_qps, those with a receive ring of their own (not on an
	 * SRQ): what a poll harvests (qp->ring_node).  And the SRQs the
	 * others receive from, each once (struct urdma_cq_srq).  A poll
	 * walks neither the QPs on an SRQ nor an SRQ once per QP. */
	struct list_head ring_qps, srqs;
	/* The CQ's shared block (struct urdma_shm_bell, shared.h), for its
	 * life: the notify word deliverers claim, and the bell they ring. */
	struct urdma_shm_bell *shm;
	uint64_t shm_va;
	_Atomic bool shm_busy_left; /* a QP of it was: shm never reused */
	/* The bell (core/bell.c): from URDMA_BELL_MIN ring QPs on, a poll
	 * harvests only the QPs whose slots deliverers rang, and those in
	 * carry (without a slot).  Under lock, but for bell_sweep and
	 * bell_swept_ns (the progress thread's, which reads bell_on too). */
	_Atomic bool bell_on; /* off: ring_qps is walked */
	_Atomic bool bell_sweep;   /* every ring QP's slot rung at the next look */
	uint64_t bell_swept_ns;    /* when the progress thread last asked */
	uint32_t nring;		   /* in ring_qps */
	struct urdma_qp **slot_qp; /* by slot: slot_cap, slot_next used */
	uint32_t bell_turn;	   /* the slot a harvest starts at */
	uint32_t bell_quiet;	   /* polls in a row that found nothing */
	bool carry_first;	   /* carry before the scan, this poll */
	uint32_t *slot_free, nfree, slot_cap, slot_next;
	struct list_head carry;	   /* qp->carry_node */
	int armed; /* URDMA_NOTIFY_* */
	uint32_t arm_no; /* ibv_req_notify_cq calls, in notify (shared.h) */
	_Atomic int sq_pending; /* a send QP has WRs waiting to be retried */
	_Atomic int polled_qps; /* QPs whose transport receives in poll_cq */
	int watch_epfd; /* their sockets' readiness set, or -1 (cq_watch.c) */
	_Atomic int armed_qps;	/* its QPs whose transport has tr->armed */
	_Atomic int srq_qps;	/* receive QPs on an SRQ */
	/* CQ moderation (ibv_modify_cq): an armed CQ's event waits for
	 * mod_count completions or mod_period_ns after the first, under
	 * lock; mod_due: when the progress thread fires it, 0 if none */
	uint32_t mod_count;
	uint64_t mod_period_ns;
	_Atomic uint64_t mod_due;
	bool recv_turn;		/* cq_take harvests first, under lock */
	struct list_head xrc_srqs; /* XRC SRQs completing here, under lock */
	struct urdma_channel *chan;
	_Atomic int usecnt;
	uint32_t events_reported; /* by ibv_get_cq_event, under ibcq.mutex */
	uint32_t async_reported;  /* by ibv_get_async_event, under ev_lock */
	bool async_gone;          /* being destroyed: no more events (ev_lock) */
	/* ibv_create_cq_ex: the completion that ibv_start_poll/ibv_next_poll
	 * took, read by the ibv_wc_read_* calls (cq_ex.c) */
	bool stamp;      /* IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK) */
	bool ex_locked;  /* start_poll..end_poll under ex_lock */
	pthread_mutex_t ex_lock;
	struct ibv_wc cur;
	uint64_t cur_ts; /* CLOCK_MONOTONIC ns, the device's clock */
};

/* An SRQ that receive QPs of a CQ use: how many (in cq->srqs, under the
 * CQ's lock). */
struct urdma_cq_srq {
	struct list_head node;
	struct urdma_srq *srq;
	uint32_t nqps;
};

/* A send WR copied at post time. */
/* Where a UD datagram goes: an address handle's attributes, copied into
 * each WR that names it (ud.c). */
struct urdma_av {
	uint8_t dgid[16];
	uint32_t flow_label;
	uint16_t dlid;
	uint8_t sl, is_global, sgid_index, hop_limit, tclass;
};

struct urdma_ah {
	struct ibv_ah ibah;
	struct urdma_av av;
};

struct urdma_swqe {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint64_t first_try_ns;
	/* Where its retry budget counts from (sq_retry_exceeded): its first
	 * try, or its first look once the set-ups it waited on stopped. */
	uint64_t budget_from_ns;
	uint32_t opcode; /* enum ibv_wr_opcode */
	uint32_t send_flags;
	uint32_t num_sge;
	uint32_t imm_data;
	uint32_t rkey;
	uint32_t byte_len;
	uint32_t rnr_tries;
	uint32_t inline_len;
	uint32_t xrc_srqn; /* an XRC send QP's: the target SRQ */
	_Atomic uint32_t done; /* 0, or the completion status + 1 */
	bool sig_counted; /* in its channel's xrc_taken (sq.c) */
	/* A UD QP's: the destination QP, its Q_Key and address */
	uint32_t ud_qpn, ud_qkey;
	struct urdma_av av;
	struct ibv_sge sge[]; /* then inline data */
};

struct urdma_peer;
struct urdma_transport_ops;
struct urdma_host_ctx;

/* A receive ring's geometry, in private memory: never read back from the
 * shared block, where anyone of the user could change it. */
struct urdma_rq_geo {
	uint32_t size; /* entries, a power of two */
	uint32_t stride;
	uint32_t max_sge;
};

/* A peer QP's receive queue, as a deliverer over shared memory writes it:
 * its block and ring, and its SRQ's, checked and their geometry copied
 * when found (transport/shm/). */
struct urdma_shm_dest {
	struct urdma_shm_qp *qp;
	uint8_t *ring;
	struct urdma_rq_geo rq;
	struct urdma_shm_srq *srq; /* the SRQ it receives from, or NULL */
	uint8_t *srq_ring;
	struct urdma_rq_geo srq_rq;
	uint32_t srq_pd;
	uint32_t prod, done; /* its rq_prod as last read, our rq_done */
	uint32_t gen;	     /* the block's, when found */
	uint32_t epoch;	     /* its rq_epoch when prod was read */
	struct urdma_shm_wake *wake; /* its owner's wake block, or NULL */
	/* Its CQ's block and its slot in the bell, taken at attach from its
	 * block (urdma_dest_blocks); our own QP's (UDP's own_dest) from the
	 * QP and CQ themselves. */
	struct urdma_shm_bell *bell;
	uint64_t bell_va;
	uint32_t bell_slot;
};

/* What the owner posted in a receive slot: the shared ring has the SGEs
 * for the deliverer; the WR id and length the owner reports come from here. */
struct urdma_rq_wr {
	uint64_t wr_id;
	uint64_t len;
	/* The first SGE, where an inline payload goes (URDMA_RQE_INLINE):
	 * an address in its MR's IOVA space, resolved through the MR. */
	uint64_t addr0;
	uint32_t len0, lkey0;
	/* A Send with Invalidate that our own receive path (TCP) placed
	 * and invalidated already; never read from the shared ring, where
	 * a peer could claim it to keep its window alive. */
	bool inv_done;
};

/* An XRC domain (xrc.c): the XRC SRQs and target QPs of every process of
 * the user that opened it through the same file (or this one alone). */
struct urdma_xrcd {
	struct ibv_xrcd ibxrcd;
	struct list_head node; /* in the process's list, under its lock */
	uint64_t id;	       /* the file's device and inode, or random */
	int lock_fd;	       /* held shared while open (xrcd-<id>), or -1 */
	_Atomic int usecnt;    /* XRC SRQs and QPs made in it */
};

/* A shared receive queue (srq.c); its ring is shared like a QP's. */
struct urdma_srq {
	struct ibv_srq ibsrq;
	struct urdma_context *uctx;
	uint32_t async_reported;   /* by ibv_get_async_event, under ev_lock */
	bool async_gone;           /* being destroyed: no more events (ev_lock) */
	struct list_head ctx_node; /* in context.srqs */
	pthread_mutex_t lock;	   /* posting, taking, qps */
	struct list_head qps;	   /* QPs on it (qp->srq_node) */
	/* The same by number, for each completion taken (srq.c): chains
	 * through qp->srq_hnext, hsize buckets (a power of two, 0: none). */
	struct urdma_qp **htab;
	uint32_t hsize, nqps;
	struct urdma_shm_srq *shm;
	size_t shm_size;
	uint64_t va; /* of shm in the identity memfd */
	struct urdma_rq_geo rq;
	uint8_t *ring;
	struct urdma_rq_wr *rq_wr; /* by slot */
	uint32_t prod, poll;	   /* posted; next to take */
	uint32_t limit;		   /* armed srq_limit, 0: none */
	uint32_t srqn;
	/* An XRC SRQ: its domain, and the CQ it completes into itself
	 * (in cq->xrc_srqs); srqn is then published (srq-<srqn>). */
	struct urdma_xrcd *xrcd;
	struct urdma_cq *cq;
	struct list_head cq_node;
	struct list_head xrc_node; /* in the process's list (xrc.c) */
	bool bad; /* a deliverer wrote nonsense: nothing more is taken */
	uint32_t stuck_idx;
	uint64_t stuck_ns;    /* since when poll has waited for its entry */
	_Atomic int drainers; /* pollers using it without a lock */
	/* An XRC SRQ's event held for its channel's sends (progress thread):
	 * since when, and the count of completions it waits for. */
	uint64_t xrc_hold_ns;
	uint32_t xrc_hold_to;
};

/* An XRC SRQ of this user found by its number (srq-<srqn>), of whichever
 * process: its context (a reference) and its block there, checked, the
 * geometry copied (transport.c: urdma_xsrq_ref_find). */
struct urdma_xsrq_ref {
	uint32_t srqn; /* 0: none */
	uint32_t pd_id;
	uint64_t xrcd_id;
	struct urdma_peer *peer;
	struct urdma_shm_srq *shm;
	uint8_t *ring;
	struct urdma_rq_geo rq;
};

struct urdma_wr_batch;

struct urdma_qp {
	union { /* ibv_qp_ex begins with an ibv_qp */
		struct ibv_qp ibqp;
		struct ibv_qp_ex ibqp_ex;
	};
	uint32_t async_reported; /* by ibv_get_async_event, under ev_lock */
	bool async_gone;         /* being destroyed: no more events (ev_lock) */
	struct urdma_wr_batch *wrb; /* the wr_ calls' WRs (qp_ex.c), or NULL */
	struct urdma_srq *srq;	    /* receives from it (srq.c), or NULL */
	struct list_head srq_node;
	struct urdma_qp *srq_hnext;
	_Atomic bool last_wqe_due; /* in ERR: LAST_WQE_REACHED to report */
	struct urdma_context *uctx;
	/* What the engine uses: the public ones, or for those an XRC QP
	 * has not (NULL in ibqp), a CQ of its own that nothing reaches
	 * (own_cq); pd is NULL for an XRC target. */
	struct urdma_pd *pd;
	struct urdma_cq *scq, *rcq, *own_cq;
	/* XRC (xrc.c): the domain of a target QP; a handle of ibv_open_qp
	 * stands for xrc_real; the real one counts its handles. */
	struct urdma_xrcd *xrcd;
	struct urdma_qp *xrc_real;
	_Atomic int xrc_refs;
	struct list_head xrc_node; /* a target QP, in the process's list */
	/* An XRC send QP over shm: the domain of the target QP, and the
	 * SRQ its last WR named, whose context's memory and keys the WR
	 * uses (shm_transport.c), under sq_lock. */
	uint64_t peer_xrcd;
	struct urdma_xsrq_ref xsrq;
	struct list_head ctx_node, scq_node, rcq_node;
	struct list_head ring_node; /* in rcq->ring_qps, if ring_listed */
	bool ring_listed;
	bool carried;		     /* in rcq->carry (carry_node) */
	struct list_head carry_node;
	uint32_t bell_slot;	     /* in rcq's bell; URDMA_BELL_NONE: none */
	uint32_t bell_idle;	     /* looks that found it empty (bell.c) */
	/* A receive's event held for the send completions before it
	 * (urdma_qp_notify_recv): its CQ fires once they are retired. */
	_Atomic uint32_t fire_held;
	struct ibv_qp_attr attr; /* as last set */
	struct ibv_qp_cap cap;
	bool sq_sig_all;
	/* shared block: header + receive ring, in the identity memfd */
	struct urdma_shm_qp *shm;
	size_t shm_size;
	bool shm_busy_left; /* a deliverer never left it: don't reuse it */
	/* send queue (private) */
	pthread_mutex_t sq_lock;
	uint8_t *sq;
	uint32_t sq_size, sq_stride;
	uint32_t sq_head, sq_tail; /* free-running; execute at head */
	uint32_t sq_comp;	   /* oldest WR not yet completed */
	_Atomic int sq_async;	   /* a transport finished a posted WR */
	uint32_t unsignaled;	   /* since the last signaled WR */
	_Atomic uint32_t sq_retired;
	bool sq_pending;
	/* receive queue, owner side (rq.c) */
	pthread_mutex_t rq_lock;
	struct urdma_rq_geo rq;
	uint8_t *rq_ring;	   /* the first entry */
	struct urdma_rq_wr *rq_wr; /* by slot */
	_Atomic uint32_t rq_prod;  /* posted (written under rq_lock) */
	uint32_t rq_poll; /* next completion to harvest, under recv CQ lock */
	uint32_t rq_flush_from;	 /* completions from here on are flushes */
	_Atomic bool rq_flushed;
	_Atomic bool rq_bad; /* a deliverer wrote nonsense: to ERR */
	_Atomic bool rq_flush_wait; /* in ERR; flush when no deliverer is in */
	uint64_t rq_err_ns;  /* when the QP entered ERR */
	/* connection */
	const struct urdma_transport_ops *tr;
	void *tr_priv;	     /* the transport's connection state */
	/* the transport that made the QPN (qpn_reserve), or NULL */
	const struct urdma_transport_ops *qpn_tr;
	_Atomic int pollers; /* ibv_poll_cq threads driving tr->poll */
	_Atomic uint8_t fd_watch; /* URDMA_WATCH_*: in its CQs' readiness sets */
	/* shared memory: the peer's context, and its QP's receive queue */
	struct urdma_peer *peer;
	struct urdma_shm_dest dst;
	uint64_t peer_va, peer_size; /* from its record */
	/* rkeys of the peer's windows our Sends with Invalidate named, with
	 * their entries' seq then (shm_transport.c), under sq_lock */
#define URDMA_INV_KEYS 8
	uint32_t inv_key[URDMA_INV_KEYS], inv_seq[URDMA_INV_KEYS];
	uint32_t inv_next;
	uint32_t peer_ctx;
	bool peer_stale; /* look for the record again */
	bool peer_rec_read; /* peer_ctx, _va, _size: its record, just read */
	uint64_t peer_pause_ns, peer_retry_ns; /* shm_attach's back-off */
	uint64_t uc_lost_ns; /* UC: since when no WR has found the responder */
	/* UD over shm: the QPs datagrams went to (shm_ud.c), under sq_lock;
	 * datagrams we dropped as sender */
	struct urdma_ud_dests *ud;
	uint64_t ud_drops;
	/* UD: the multicast groups it is attached to (mcast.c), under
	 * sq_lock; whether it skips its own datagrams to them */
#define URDMA_MCG_PER_QP 16
	union ibv_gid mcg[URDMA_MCG_PER_QP];
	int nmcg;
	bool block_self_mcast;
	_Atomic bool peer_dead;
	uint64_t peer_dead_ns; /* when the progress thread saw it die */
};

static inline struct urdma_context *to_uctx(struct ibv_context *c)
{
	return container_of(c, struct urdma_context, vctx.context);
}
static inline struct urdma_pd *to_upd(struct ibv_pd *p)
{
	return container_of(p, struct urdma_pd, ibpd);
}
static inline struct urdma_mr *to_umr(struct ibv_mr *m)
{
	return container_of(m, struct urdma_mr, ibmr);
}
static inline struct urdma_cq *to_ucq(struct ibv_cq *c)
{
	return container_of(c, struct urdma_cq, ibcq);
}
static inline struct urdma_srq *to_usrq(struct ibv_srq *s)
{
	return container_of(s, struct urdma_srq, ibsrq);
}
static inline struct urdma_xrcd *to_uxrcd(struct ibv_xrcd *x)
{
	return container_of(x, struct urdma_xrcd, ibxrcd);
}
static inline struct urdma_qp *to_uqp(struct ibv_qp *q)
{
	return container_of(q, struct urdma_qp, ibqp);
}
static inline struct urdma_channel *to_uchan(struct ibv_comp_channel *c)
{
	return container_of(c, struct urdma_channel, ch);
}

static inline uint32_t roundup_pow2(uint32_t v)
{
	uint32_t r = 1;
	while (r < v)
		r <<= 1;
	return r;
}

/* 32 random bits (getrandom, else the clock, scrambled). */
uint32_t urdma_random32(void);

/* backing.c: the identity memfd, backed pages, window tables */
#define URDMA_WIN_SHIFT 30 /* 1 GiB windows */
#define URDMA_WIN_SIZE (1ULL << URDMA_WIN_SHIFT)
#define URDMA_VA_BITS 47
#define URDMA_WIN_L2_BITS 10
#define URDMA_WIN_L1_COUNT (1u << (URDMA_VA_BITS - URDMA_WIN_SHIFT - URDMA_WIN_L2_BITS))
#define URDMA_WIN_L2_COUNT (1u << URDMA_WIN_L2_BITS)

struct urdma_wintab {
	_Atomic(uint8_t *) *l1[URDMA_WIN_L1_COUNT];
};

void urdma_wintab_release(struct urdma_wintab *t);
void *urdma_wintab_ptr(struct urdma_wintab *t, pthread_mutex_t *lock,
		       int memfd, uint64_t va, uint64_t *avail);

/* host.c: the host directory, contexts' sockets, QP records */
struct urdma_proc {
	pthread_mutex_t lock; /* a leaf */
	int memfd;
	uint64_t memfd_ino;
	int dirfd; /* the host directory; -1: shared memory is off */
	char dir[256];
};
extern struct urdma_proc urdma_proc;
int urdma_host_init(void);
/* The host directory is usable: QPs of this user can share memory. */
bool urdma_host_shm_ok(void);
void urdma_host_sweep(void);
/* A context's MR table (uctx->shm), socket and id (uctx->ctx_id); _start
 * once the progress thread watches. */
int urdma_host_ctx_open(struct urdma_context *uctx);
int urdma_host_ctx_start(struct urdma_context *uctx);
void urdma_host_ctx_close(struct urdma_context *uctx);
/* qp-<qpn>: 0, -EEXIST (taken by a live QP), or -errno. */
int urdma_host_qp_publish(uint32_t qpn, uint32_t ctx_id, uint64_t va,
			  uint64_t size);
void urdma_host_qp_unpublish(uint32_t qpn);
/* Read qp-<qpn>: 0, -ENOENT (none of ours), -EINVAL (malformed), -EPERM
 * (not a file of ours). */
int urdma_host_qp_find(uint32_t qpn, struct urdma_qp_rec *rec);
/* The same for the records <kind>-<num> ("qp", "srq"). */
int urdma_host_rec_publish(const char *kind, uint32_t num, uint32_t ctx_id,
			   uint64_t va, uint64_t size);
void urdma_host_rec_unpublish(const char *kind, uint32_t num);
int urdma_host_rec_find(const char *kind, uint32_t num,
			struct urdma_qp_rec *rec);
/* Read <kind>-<num> and check its context is there: 0; -ESTALE (malformed,
 * or it names a context nobody listens for); else as urdma_host_rec_find. */
int urdma_host_rec_live(const char *kind, uint32_t num,
			struct urdma_qp_rec *rec);
/* <kind>-<num> is malformed or names a context nobody listens for. */
bool urdma_host_rec_stale(const char *kind, uint32_t num);
/* The host directory, to read (NULL if shared memory is off). */
DIR *urdma_host_opendir(void);
/* Connect to our user's context socket ctx-<id>: the socket, or -errno
 * (-ENOENT: no such name; -EPERM: not a socket of our user;
 * -ECONNREFUSED: nobody listens). */
int urdma_host_ctx_connect(uint32_t ctx_id);
/* The process at the other end of Unix socket fd is of our user: *pid. */
bool urdma_host_peer_is_us(int fd, pid_t *pid);
/* The MR table of our own context ctx_id, or -1 (under urdma_proc.lock). */
int urdma_host_own_mrs(uint32_t ctx_id);
/* backing.c */
/* Back [start, start+len) (page aligned; writable mappings if write):
 * 0, 1 if it stays in place (a direct MR), or -errno: -EFAULT (a hole,
 * or protections that refuse the access). */
int urdma_host_back_range(uint64_t start, uint64_t len, bool write);
int urdma_memfd(void);
/* stop.c: run fn(arg) with every other thread of the process stopped;
 * fn's result, or -EAGAIN if a thread can't be stopped. */
int urdma_stop_world(int (*fn)(void *), void *arg);
/* From fn: has every thread left asleep stayed asleep so far? */
bool urdma_stop_intact(void);
/* Moves at each stop's start and end: a wait of the library's that
 * returned EINTR, with this moved since it began, was interrupted by a
 * stop's signal, not the application's, and waits again (as read() with
 * SA_RESTART would). */
uint32_t urdma_stop_seq(void);
/* The library's own threads: urdma_stop_coop() once, at their start;
 * urdma_stop_point() after each wait, before anything else. */
void urdma_stop_coop(void);
void urdma_stop_point(void);
/* arena.c: shared blocks in the identity memfd (zeroed, page aligned) */
void *urdma_arena_alloc(size_t size, uint64_t *va);
void urdma_arena_free(void *p, size_t size, bool quarantine);
void urdma_arena_atfork_child(void);
/* The memfd offset of this process's lock word for atomics on direct MRs
 * (made on first use), or 0 if it can't be made. */
uint64_t urdma_arena_lock(void);

/* peer.c: the contexts we share memory with.  For host.c: a fork's child
 * drops the parent's; our own context ctx_id closed (urdma_proc.lock). */
void urdma_peer_atfork_child(void);
void urdma_peer_own_closed(uint32_t ctx_id);
/* A peer context on this host: a reference, connecting or ready. */
struct urdma_peer *urdma_peer_get(uint32_t ctx_id);
void urdma_peer_put(struct urdma_peer *p);
/* A QP's peer (qp->peer) is replaced only under the QP's sq_lock, with
 * urdma_peer_set; a thread without sq_lock takes a reference to it with
 * urdma_peer_ref (or NULL), and puts it when done. */
struct urdma_peer *urdma_peer_ref(struct urdma_peer *const *slot);
void urdma_peer_set(struct urdma_peer **slot, struct urdma_peer *p);
/* Wait up to timeout_ms for the peer to be ready: 0, -EAGAIN (not yet),
 * another -errno (it failed). */
int urdma_peer_wait(struct urdma_peer *p, int timeout_ms);
bool urdma_peer_ready(struct urdma_peer *p);
bool urdma_peer_dead(struct urdma_peer *p);
/* ctx_id is one of our contexts, or a peer we are connected to and have
 * not seen die. */
bool urdma_peer_known(uint32_t ctx_id);
pid_t urdma_peer_pid(struct urdma_peer *p);
/* Check (key, addr, len) against an MR table, for an access through the
 * owner's QP `via` (URDMA_VIA_LOCAL: a local SGE, which no memory window
 * serves): 0, the owner address of addr and whether the MR is direct (not
 * in the owner's memfd), or -EINVAL (no such key), -EACCES (access, PD),
 * -ERANGE (bounds), -EFAULT (pages unmapped by the owner). */
int urdma_mr_lookup(const struct urdma_shm_ctx *shm, uint32_t key,
		    uint64_t addr, uint64_t len, uint32_t access, uint32_t pd_id,
		    uint32_t via, uint64_t *va, bool *direct);
/* Is p this process (NULL, or one of our own contexts)? */
bool urdma_peer_is_self(const struct urdma_peer *p);
/* Copy n bytes between local and the peer process's address remote (to
 * it if write), for a direct MR: 0, -EFAULT (not all of it), -ESRCH (the
 * process is gone), -EPERM (the kernel refuses). */
int urdma_peer_vm(struct urdma_peer *p, bool write, void *local,
		  uint64_t remote, uint64_t n);
/* The key of MR table entry idx with the random bits rnd: the entry's tag
 * above its index, or 0 when rnd leaves no tag (draw again).  A key is
 * never 0, which names no MR (a tag of 0 would make entry 0's key 0). */
uint32_t urdma_mr_key(uint32_t idx, uint32_t rnd);
/* pd_mr.c */
struct ibv_td *urdma_alloc_td(struct ibv_context *context,
			      struct ibv_td_init_attr *attr);
int urdma_dealloc_td(struct ibv_td *td);
struct ibv_pd *urdma_alloc_parent_domain(struct ibv_context *context,
					 struct ibv_parent_domain_init_attr *a);
uint32_t urdma_mr_new_key(uint32_t idx);
int urdma_mr_slot_find(struct urdma_context *uctx);
void urdma_mr_publish(struct urdma_mr *mr, uint32_t pd_id, uint32_t key);
/* mw.c */
struct ibv_mw *urdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int urdma_dealloc_mw(struct ibv_mw *mw);
int urdma_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		  struct ibv_mw_bind *bind);
enum ibv_wc_status urdma_mw_execute(struct urdma_qp *qp,
				    const struct urdma_swqe *w);
bool urdma_mw_remote_invalidate(struct urdma_qp *qp, uint32_t rkey,
				bool check_only);
const struct urdma_shm_ctx *urdma_peer_shm(struct urdma_peer *p);
void *urdma_peer_ptr(struct urdma_peer *p, uint64_t va, uint64_t *avail);
/* A block of ours in peer p's memory (shared.h: a page-aligned va, size
 * bytes, beginning with magic and URDMA_SHM_VERSION), checked, or NULL. */
void *urdma_peer_block(struct urdma_peer *p, uint64_t va, uint64_t size,
		       uint32_t magic);
int urdma_peer_wake(struct urdma_peer *p);
/* A pointer to len bytes at owner address va; NULL if the memory can't be
 * reached.  *avail is set to how many bytes are contiguous from there. */
void *urdma_self_ptr(uint64_t va, uint64_t *avail);

/* device.c */
void urdma_async_event(struct urdma_context *uctx, struct ibv_async_event *ev);
void urdma_ack_async_event(struct ibv_async_event *ev);
void urdma_async_release(struct urdma_context *uctx, void *obj,
			 const uint32_t *reported, const uint32_t *done,
			 pthread_mutex_t *mu, pthread_cond_t *cond, bool *gone);

/* pd_mr.c */
void urdma_mrs_check(struct urdma_context *uctx);

/* cq.c */
void urdma_cq_push(struct urdma_cq *cq, const struct ibv_wc *wc,
		   struct urdma_qp *qp, uint32_t retire);
/* The same; fire: whether an armed CQ fires for it here (an SRQ's
 * completion does not: its deliverer notified the CQ already). */
void urdma_cq_push_as(struct urdma_cq *cq, const struct ibv_wc *wc,
		      struct urdma_qp *qp, uint32_t retire, bool fire);
void urdma_cq_notify(struct urdma_cq *cq);
void urdma_cq_notify_left(struct urdma_cq *cq);
void urdma_cq_take_fired(struct urdma_cq *cq);
/* Armed, and neither fired nor claimed yet (URDMA_NOTIFY_*): read
 * without the lock. */
static inline uint32_t urdma_cq_armed(struct urdma_cq *cq)
{
	return atomic_load(&cq->shm->notify) & URDMA_NOTIFY_MODE;
}
int urdma_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr);
void urdma_cq_moderation_due(struct urdma_cq *cq, uint64_t now);

/* The CQ's shared block (bell.c; struct urdma_shm_bell): made with the
 * CQ (new), freed with it.  The owner's side, under cq->lock: a receive
 * QP joins or leaves the CQ (its block names the CQ's; a ring QP gets a
 * slot, and the bell goes on at URDMA_BELL_MIN of them); once it is on
 * (urdma_bell_on), the poll's harvest of the QPs rung or carried, whether
 * one holds a completion, how many they hold.  tick: the progress thread
 * asks for a sweep now and then (a ring a peer lost).  own: a receive of
 * qp completed in this process (TCP, a flush).  A deliverer that
 * published a receive of d's QP: dest_notify rings the bell and claims
 * the CQ's notify (true: armed; 'fired' set, wake the owner, or with p
 * NULL, our own QP's, fire it); dest_ring only rings (a receive with no
 * event). */
#define URDMA_BELL_MIN 16u
#define URDMA_BELL_NONE UINT32_MAX
static inline bool urdma_bell_on(struct urdma_cq *cq)
{
	return atomic_load_explicit(&cq->bell_on, memory_order_relaxed);
}
int urdma_bell_new(struct urdma_cq *cq);
void urdma_bell_add(struct urdma_cq *cq, struct urdma_qp *qp);
void urdma_bell_del(struct urdma_cq *cq, struct urdma_qp *qp);
int urdma_bell_harvest(struct urdma_cq *cq, int num, struct ibv_wc *wc);
bool urdma_bell_holds(struct urdma_cq *cq);
uint32_t urdma_bell_ready(struct urdma_cq *cq);
void urdma_bell_free(struct urdma_cq *cq);
void urdma_bell_tick(struct urdma_cq *cq, uint64_t now);
void urdma_qp_bell_own(struct urdma_qp *qp);
bool urdma_dest_notify(struct urdma_shm_dest *d, struct urdma_peer *p,
		       bool solicited);
void urdma_dest_ring(struct urdma_shm_dest *d, struct urdma_peer *p);
/* A dest found QP block h of peer p: its owner's wake block and CQ's bell
 * are looked for afresh (shm and shm UD attach). */
void urdma_dest_blocks(struct urdma_shm_dest *d, struct urdma_peer *p,
		       const struct urdma_shm_qp *h);

/* qp.c */
int urdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask);
/* sq.c: the send queue engine.  enter_error and sq_run under sq_lock. */
void urdma_qp_enter_error(struct urdma_qp *qp);
void urdma_sq_run(struct urdma_qp *qp);
void urdma_qp_progress(struct urdma_qp *qp);
void urdma_qp_release(struct urdma_qp *qp);
void urdma_qp_wr_mark(struct urdma_qp *qp, uint32_t idx,
		      enum ibv_wc_status status);
void urdma_qp_wr_kick(struct urdma_qp *qp);
void urdma_qp_notify_recv(struct urdma_qp *qp);
void urdma_progress_take_fired(void);
/* wake.c, for the progress thread: a peer marked CQs fired; fire them. */
bool urdma_wake_fired(void);
void urdma_wake_take_fired(void);

/* wake.c */
void urdma_wake_init(void);
void urdma_wake_atfork_child(void);
uint64_t urdma_wake_va(void);
struct urdma_shm_wake *urdma_wake_map(struct urdma_peer *p, uint64_t va);
bool urdma_wake_owner(struct urdma_shm_wake *w);
void urdma_wake_local(void);
int urdma_wake_sleep(struct urdma_channel *ch);
void urdma_qp_set_error(struct urdma_qp *qp, bool fatal_event);
void urdma_qp_lost(struct urdma_qp *qp);
uint64_t urdma_qp_retry_ns(const struct urdma_qp *qp);
/* How long after its peer is known gone an idle QP goes to ERR. */
uint64_t urdma_qp_loss_grace_ns(struct urdma_qp *qp);
bool urdma_qp_maintain(struct urdma_qp *qp);
/* rq.c */
int urdma_rq_init(struct urdma_qp *qp, uint32_t max_wr, uint32_t max_sge);
void urdma_rq_destroy(struct urdma_qp *qp);
int urdma_qp_harvest(struct urdma_qp *qp, struct ibv_wc *wc, int max);
int urdma_rqe_take(const struct urdma_shm_rqe *e, uint64_t posted_len, bool ud,
		   struct ibv_wc *w);
void urdma_qp_recv_posted(struct urdma_qp *qp, bool wake);
void urdma_rqe_unpublished(struct urdma_shm_rqe *e, uint32_t idx);
void urdma_rqe_post(struct urdma_shm_rqe *e, uint32_t idx,
		    struct urdma_rq_wr *pw, const struct ibv_recv_wr *wr);
void urdma_rq_invalidate(struct urdma_qp *qp, const struct urdma_rq_wr *pw,
			 struct ibv_wc *w);
/* xrc.c */
struct ibv_xrcd *urdma_open_xrcd(struct ibv_context *context,
				 struct ibv_xrcd_init_attr *attr);
int urdma_close_xrcd(struct ibv_xrcd *xrcd);
void urdma_xrcd_let_go(int fd, uint64_t id);
int urdma_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num);
int urdma_xsrq_setup(struct urdma_srq *srq, struct urdma_xrcd *xrcd,
		     struct urdma_cq *cq);
bool urdma_xsrq_teardown(struct urdma_srq *srq);
/* The PDs (up to max) of the XRC SRQs of domain xrcd_id in context uctx;
 * urdma_xsrq_gen() changes (from 1 on) whenever an XRC SRQ comes or goes. */
#define URDMA_XRC_PDS 8
uint32_t urdma_xsrq_gen(void);
int urdma_xsrq_pds(uint64_t xrcd_id, const struct urdma_context *uctx,
		   uint32_t *pds, int max);
void urdma_xrc_tgt_add(struct urdma_qp *qp);
/* A CQ's readiness set (cq_watch.c): the sockets of the QPs a poll
 * receives for, in a CQ that polls more than URDMA_CQ_POLLERS of them
 * (transports polled per ibv_poll_cq). */
#define URDMA_CQ_POLLERS 8
#define URDMA_WATCH_RCQ 1
#define URDMA_WATCH_SCQ 2
#define URDMA_WATCH_FAILED 4 /* (epoll_ctl failed: polls look) */
void urdma_cq_watch_fd(struct urdma_qp *qp, int fd);
void urdma_cq_unwatch_fd(struct urdma_qp *qp, int fd);
int urdma_cq_ready(struct urdma_cq *cq, struct urdma_qp **qps, int max);
bool urdma_cq_watches(const struct urdma_cq *cq, struct urdma_qp *qp);

/* ibv_poll_cq on a CQ with XRC SRQs drives the streams of the targets of
 * their domains in its context (TCP): taken as cq.c takes its QPs'
 * (counted in qp->pollers), from n up to max.  urdma_xrc_polled: how
 * many targets have such a transport. */
extern _Atomic int urdma_xrc_polled;
/* XRC SRQs whose receive event waits for their channel's sends. */
extern _Atomic int urdma_xrc_held;
void urdma_sq_forget_signaled(struct urdma_qp *qp);
struct urdma_transport_ops;
int urdma_xrc_take_pollers(const struct urdma_context *uctx, uint64_t xrcd_id,
			   const struct urdma_transport_ops **trs,
			   struct urdma_qp **qps, int n, int max);
struct ibv_qp *urdma_open_qp(struct ibv_context *context,
			     struct ibv_qp_open_attr *attr);
struct urdma_qp *urdma_xrc_handle_put(struct urdma_qp *h);
/* srq.c */
struct ibv_srq *urdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *init);
struct ibv_srq *urdma_create_srq_ex(struct ibv_context *context,
				    struct ibv_srq_init_attr_ex *attr);
int urdma_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask);
int urdma_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
int urdma_destroy_srq(struct ibv_srq *srq);
int urdma_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad);
void urdma_srq_drain(struct urdma_srq *srq);
bool urdma_srq_pending(const struct urdma_srq *srq);
void urdma_srq_maintain(struct urdma_srq *srq);
int urdma_srq_attach(struct urdma_srq *srq, struct urdma_qp *qp);
void urdma_srq_detach(struct urdma_qp *qp);
void urdma_srq_last_wqe(struct urdma_qp *qp);
bool urdma_rq_quiesce(struct urdma_qp *qp, uint64_t wait_ns);
uint32_t urdma_rq_flush(struct urdma_qp *qp);
void urdma_rq_reset(struct urdma_qp *qp);
uint32_t urdma_rq_ready(struct urdma_qp *qp);
bool urdma_rq_any(struct urdma_qp *qp);

/* The stride of a receive ring of entries with max_sge SGEs. */
static inline uint32_t urdma_rq_stride(uint32_t max_sge)
{
	return (sizeof(struct urdma_shm_rqe) +
		max_sge * sizeof(struct urdma_shm_sge) + 63) & ~63u;
}

/* Entry idx of a ring (of ours, or a peer's with the geometry we checked
 * and copied). */
static inline struct urdma_shm_rqe *urdma_rqe_at(uint8_t *ring,
						 const struct urdma_rq_geo *g,
						 uint32_t idx)
{
	return (struct urdma_shm_rqe *)(ring + (size_t)(idx & (g->size - 1)) *
						       g->stride);
}

static inline struct urdma_shm_rqe *urdma_rq_entry(struct urdma_qp *qp,
						   uint32_t idx)
{
	return urdma_rqe_at(qp->rq_ring, &qp->rq, idx);
}

/* Entry e, of index idx, as its tag tells (shared.h): posted and not yet
 * completed, or completed. */
static inline bool urdma_rqe_posted(const struct urdma_shm_rqe *e,
				    uint32_t idx)
{
	return atomic_load_explicit(&e->tag, memory_order_acquire) == idx;
}

static inline bool urdma_rqe_done(const struct urdma_shm_rqe *e, uint32_t idx)
{
	return atomic_load_explicit(&e->tag, memory_order_acquire) == idx + 1;
}

/* progress.c */
enum { URDMA_WATCH_FN = 1 };
/* URDMA_WATCH_FN: the progress thread calls fn with the epoll events.  An
 * event fetched in a batch may name a watcher whose fd was unwatched
 * meanwhile, so a watcher is never freed directly: urdma_progress_retire()
 * unwatches its fd and the progress thread calls release between batches. */
struct urdma_watcher {
	void (*fn)(struct urdma_watcher *w, uint32_t events);
	void (*release)(struct urdma_watcher *w);
	struct urdma_watcher *next_retired;
} __attribute__((aligned(8)));
int urdma_progress_watch_events(int fd, uint32_t events, int kind, void *obj,
				bool modify);
void urdma_progress_retire(int fd, struct urdma_watcher *w);
int urdma_progress_add_ctx(struct urdma_context *uctx);
int urdma_qp_error_if_live(struct ibv_context *ctx, struct ibv_qp *ibqp,
			   uint32_t handle);
void urdma_release_held(void);
extern _Atomic int urdma_held_qps; /* qp.c */
void urdma_progress_del_ctx(struct urdma_context *uctx);
void urdma_progress_add_cq(struct urdma_cq *cq);
void urdma_progress_del_cq(struct urdma_cq *cq);
void urdma_progress_kick(void);
/* Is this the progress thread? */
bool urdma_progress_self(void);
void urdma_progress_by(uint64_t t);
int urdma_progress_watch(int fd, int kind, void *obj);
void urdma_progress_unwatch(int fd);

/* verbs entry points implemented by the core, called by the ABI layer */
int urdma_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int urdma_query_port(struct ibv_context *c, uint8_t port,
		     struct ibv_port_attr *a);
int urdma_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int urdma_cq_poll(struct urdma_cq *cq, int num, struct ibv_wc *wc,
		  uint64_t *ts);
struct urdma_cq *urdma_cq_new(struct ibv_context *context, int cqe,
			      struct ibv_comp_channel *channel,
			      uint32_t comp_vector);
int urdma_destroy_cq(struct ibv_cq *cq);
struct ibv_cq_ex *urdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr);
int urdma_query_rt_values(struct ibv_context *context,
			  struct ibv_values_ex *values);
int urdma_query_device_ex(struct ibv_context *context,
			  const struct ibv_query_device_ex_input *input,
			  struct ibv_device_attr_ex *attr, size_t attr_size);
int urdma_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int urdma_post_send_all(struct urdma_qp *qp, const struct ibv_send_wr *wr,
			uint32_t n);
struct ibv_qp *urdma_create_qp(struct ibv_pd *pd,
			       struct ibv_qp_init_attr *init);
struct ibv_qp *urdma_qp_create(struct ibv_context *context,
			       struct ibv_pd *pd,
			       struct ibv_qp_init_attr *init,
			       struct urdma_xrcd *xrcd);
int urdma_destroy_qp(struct ibv_qp *qp);
struct ibv_qp *urdma_create_qp_ex(struct ibv_context *context,
				  struct ibv_qp_init_attr_ex *attr);
struct ibv_qp_ex *urdma_qp_to_qp_ex(struct ibv_qp *qp);
void urdma_qp_ex_free(struct urdma_qp *qp);
int urdma_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad);
int urdma_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad);

/* Is GID g (16 bytes) link-local (fe80::/10)? */
static inline bool urdma_gid_is_linklocal(const uint8_t *g)
{
	return g[0] == 0xfe && (g[1] & 0xc0) == 0x80;
}

/* Is GID g (16 bytes) a multicast group's: IPv6 (ff00::/8), or an IPv4
 * group's address mapped (::ffff:224.0.0.0/100), as RoCE has them? */
static inline bool urdma_gid_is_mcast(const uint8_t *g)
{
	static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };

	return g[0] == 0xff || (!memcmp(g, v4, 12) && (g[12] & 0xf0) == 0xe0);
}

/* mcast.c: attaching UD QPs to multicast groups; the QPNs of this host's
 * QPs attached to group gid (16 bytes), at most max. */
int urdma_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
		       uint16_t lid);
int urdma_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
		       uint16_t lid);
void urdma_mcast_detach_all(struct urdma_qp *qp);
int urdma_mcast_members(const uint8_t *gid, uint32_t *qpns, int max);

/* Address handles and what UD receives carry (ud.c). */
struct ibv_ah *urdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
/* An address with another host's LID and a GID: remember the pair. */
void urdma_lid_learn(struct urdma_context *uctx, const struct ibv_ah_attr *a);
/* An address by another host's LID alone: true if a learned GID now goes
 * with it (a is made global), false if none is known. */
bool urdma_lid_route(struct urdma_context *uctx, struct ibv_ah_attr *a);
int urdma_destroy_ah(struct ibv_ah *ah);
int urdma_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
			  const struct ibv_wc *wc, const struct ibv_grh *grh,
			  struct ibv_ah_attr *ah_attr);
static inline struct urdma_ah *to_uah(struct ibv_ah *a)
{
	return container_of(a, struct urdma_ah, ibah);
}
/* The 40-byte GRH a datagram sent by uctx with av carries (av global),
 * for a payload of len bytes. */
void urdma_grh_build(const struct urdma_context *uctx,
		     const struct urdma_av *av, uint32_t len,
		     struct ibv_grh *grh);
/* The sender's fields of a receive completion in e: its QP, and for a UD
 * QP its LID, SL and whether the buffer starts with a GRH. */
void urdma_rqe_source(const struct urdma_qp *qp, const struct urdma_shm_rqe *e,
		      struct ibv_wc *w);
/* The largest UD message: the port's MTU. */
#define URDMA_UD_MTU 4096u
#define URDMA_GRH_BYTES 40u

#endif
