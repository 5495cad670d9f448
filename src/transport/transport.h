/* SPDX-License-Identifier: MIT */
/*
 * The transport interface.  The core keeps every queue and runs the QP state
 * machine; a transport reaches the peer QP.  One table per transport, chosen
 * when the QP connects (INIT->RTR).
 */
#ifndef URDMA_TRANSPORT_H
#define URDMA_TRANSPORT_H

#include "core/urdma.h"

/* What ibv_poll_cq knows of a QP's stream as it enters tr->poll: the CQ's
 * readiness set (urdma_cq_watch_fd) named it (READY), or watches it and
 * did not (IDLE: nothing to read when the set was asked), or does not
 * watch it (LOOK: the transport looks itself). */
enum urdma_poll_hint { URDMA_POLL_LOOK, URDMA_POLL_READY, URDMA_POLL_IDLE };

enum urdma_tx {
	URDMA_TX_DONE,	    /* finished; *status tells how */
	URDMA_TX_RNR,	    /* the responder has no receive posted yet */
	URDMA_TX_NOT_READY, /* the responder can't be reached or isn't ready */
	/* The way to the responder is still being set up, and set-ups are
	 * moving: the retry budget does not run yet */
	URDMA_TX_SETTING_UP,
	URDMA_TX_POSTED,    /* sent; urdma_qp_wr_mark() + _kick() report it later */
	URDMA_TX_WAIT,	    /* our own limit (outstanding READs): retry, no timer */
};

struct urdma_transport_ops {
	const char *name;
	/* INIT->RTR with the peer's address; 0 or -errno. */
	int (*connect)(struct urdma_qp *qp, const struct ibv_qp_attr *attr);
	void (*disconnect)(struct urdma_qp *qp);
	/* Run one send WR against the peer, under qp->sq_lock. */
	enum urdma_tx (*execute)(struct urdma_qp *qp, struct urdma_swqe *wqe,
				 enum ibv_wc_status *status);
	/* Optional.  Progress thread: connection upkeep and receive; returns
	 * whether it wants to be called again soon. */
	bool (*maintain)(struct urdma_qp *qp);
	/* Optional.  ibv_poll_cq: take what has arrived, without waiting;
	 * hint: what the CQ's readiness set says of the QP's stream. */
	void (*poll)(struct urdma_qp *qp, enum urdma_poll_hint hint);
	/* Optional.  The QP is about to be destroyed: take what has arrived
	 * and answer what waits for an answer, as a NIC acknowledges the
	 * messages it received whether or not the application polls them.
	 * In the destroying thread, before the QP leaves its state. */
	void (*drain)(struct urdma_qp *qp);
	/* Optional.  ibv_post_recv (or ibv_post_srq_recv) added receives. */
	void (*recv_posted)(struct urdma_qp *qp);
	/* Optional.  Does the QP's receive path still hold a receive WR of
	 * its SRQ (a Send half placed)?  The QP's LAST_WQE_REACHED waits. */
	bool (*srq_held)(struct urdma_qp *qp);
	/* Optional.  ibv_req_notify_cq armed a CQ of the QP (its receive
	 * CQ, or its send CQ if that is another): the application may go to
	 * sleep.  Under that CQ's lock. */
	void (*armed)(struct urdma_qp *qp);
	/* Optional.  The engine stops running WRs: what execute held back
	 * for the WRs it said would follow goes now (TCP: MSG_MORE).  Under
	 * qp->sq_lock. */
	void (*flush)(struct urdma_qp *qp);
	/* Optional.  A WR the transport took (URDMA_TX_POSTED) is about to
	 * complete in error or flushed, and its memory may go once polled:
	 * the transport stops reading it.  Under qp->sq_lock, before the
	 * completion is reported. */
	void (*quiesce)(struct urdma_qp *qp);
	/* Optional.  The application turned to other things: send what was
	 * held back for its next message on this QP.  Under qp->sq_lock, in
	 * the application's thread. */
	void (*release)(struct urdma_qp *qp);
	/* Optional: for a transport whose peers find a QP by its number
	 * (TCP: the number names a listening port).  Make a number when a QP
	 * is created (0 and *qpn, or -errno: the core asks the next
	 * transport, or picks one itself); qpn_bind hands over the QP once it
	 * is whole, qpn_release says it is gone.  A QP can only connect
	 * through such a transport with a number it made. */
	int (*qpn_reserve)(uint32_t *qpn);
	void (*qpn_bind)(struct urdma_qp *qp);
	/* Optional: the QP is being destroyed; what arrives for it from now
	 * on finds nobody (its number stays taken until qpn_release). */
	void (*qpn_unbind)(struct urdma_qp *qp);
	void (*qpn_release)(uint32_t qpn);
	/* Optional.  Progress thread, once per pass, before the QPs': upkeep
	 * of what belongs to no QP. */
	void (*tick)(void);
};

extern const struct urdma_transport_ops urdma_shm_transport;
extern const struct urdma_transport_ops urdma_tcp_transport;
extern const struct urdma_transport_ops urdma_ud_transport;
/* Every transport of RC, UC and XRC QPs, NULL-terminated: what the core
 * may ask for QPNs; UD's, the same for UD QPs. */
extern const struct urdma_transport_ops *const urdma_transports[];
extern const struct urdma_transport_ops *const urdma_ud_transports[];

const struct urdma_transport_ops *urdma_pick_transport(struct urdma_qp *qp,
						       const struct ibv_qp_attr *a);

/* A contiguous piece of memory: in this process (peer NULL), in a peer's
 * registered memory, or a direct pointer (inline data).  direct: va is in
 * a direct MR (core/backing.c), reached at its address in its process. */
struct urdma_span {
	uint64_t va;
	uint64_t len;
	uint8_t *ptr;
	bool direct;
};

/* Is gid (16 bytes) one of the context's GIDs, or loopback: this host? */
bool urdma_gid_is_local(const struct urdma_context *uctx, const void *gid);

/* Copy len bytes from the spans s (in speer's memory) to d (in dpeer's):
 * 0, -ERANGE (the spans are too short), or -EFAULT (memory out of reach;
 * some bytes may have been copied). */
int urdma_copy_spans(struct urdma_peer *dpeer, const struct urdma_span *d,
		     int nd, struct urdma_peer *speer,
		     const struct urdma_span *s, int ns, uint64_t len);
void *urdma_space_ptr(struct urdma_peer *peer, uint64_t va, uint64_t *avail);
/* Byte off of span sp of this process: a pointer and how many bytes are
 * contiguous there, or NULL. */
uint8_t *urdma_span_ptr(const struct urdma_span *sp, uint64_t off,
			uint64_t *avail);

/*
 * The responder's side of a delivery, shared by the transports (the shm
 * requester works in the responder's memory, the TCP receiver in its own).
 */
/* Resolve [addr, addr+len) under key in ctx's MRs for a remote access
 * through QP qpn with access flags qp_access in PD pd_id, into *sp: -EACCES
 * when the QP's flags refuse it, else as urdma_mr_lookup.  A zero-length
 * access touches nothing and is not checked. */
int urdma_remote_lookup(const struct urdma_shm_ctx *ctx, uint32_t qp_access,
			uint32_t pd_id, uint32_t qpn, uint32_t key,
			uint64_t addr, uint64_t len, uint32_t access,
			struct urdma_span *sp);
/* Receive WR e (of a QP in PD pd_id) as spans of ctx's memory, at most
 * max_sge of them whatever e says; -1 on a bad lkey. */
int urdma_rqe_spans(const struct urdma_shm_ctx *ctx, uint32_t pd_id,
		    uint32_t max_sge, const struct urdma_shm_rqe *e,
		    struct urdma_span *sp, int *n, uint64_t *room);
/* Check a peer QP's shared block h of `bytes` bytes (from its record)
 * before any use: QP qpn of context ctx_id, a ring inside the block; its
 * geometry is copied to *g.  0 or -EINVAL. */
int urdma_shm_qp_check(const struct urdma_shm_qp *h, uint64_t bytes,
		       uint32_t qpn, uint32_t ctx_id, struct urdma_rq_geo *g);
/* Check the SRQ block h of `bytes` bytes that QP block q names, of context
 * ctx_id; its geometry to *g, its PD to *pd_id.  0 or -EINVAL. */
int urdma_shm_srq_check(const struct urdma_shm_srq *h, uint64_t bytes,
			uint32_t srqn, uint64_t xrcd_id, uint32_t ctx_id,
			struct urdma_rq_geo *g, uint32_t *pd_id);
/* The largest shared block a record may name: an arena chunk
 * (core/arena.c). */
#define URDMA_SHM_BLOCK_MAX (64ull << 20)
/* Find XRC SRQ srqn of domain xrcd_id by its record, in whichever of
 * this user's contexts has it, into r (kept while it names srqn, until
 * urdma_xsrq_enter finds it gone): 0,
 * -EAGAIN (its context has not answered yet), -ENOENT (no such SRQ in
 * the domain). */
int urdma_xsrq_ref_find(struct urdma_xsrq_ref *r, uint32_t srqn,
			uint64_t xrcd_id);
void urdma_xsrq_ref_drop(struct urdma_xsrq_ref *r);
/* Enter the SRQ r found, for one placement, until urdma_xsrq_leave(its
 * block): false (and r forgets it) if it is gone, or not what r found:
 * its owner destroyed it (and never reuses its block), or died. */
bool urdma_xsrq_enter(struct urdma_xsrq_ref *r);
void urdma_xsrq_leave(struct urdma_shm_srq *s);
/* Claim the next receive WR of SRQ s (of `size` entries) into *idx and
 * write our pid into it: 0; -EAGAIN if none is posted (rnr_waiter is set
 * and it was looked at again); -EINVAL if the indices can't be.  *wake is
 * set when the owner is to be woken (its armed limit was crossed). */
int urdma_srq_claim(struct urdma_shm_srq *s, uint8_t *ring,
		    const struct urdma_rq_geo *g, uint32_t *idx, bool *wake);
/* Publish claimed entry idx, its completion written, for QP qpn. */
void urdma_srq_publish(struct urdma_shm_rqe *e, uint32_t idx, uint32_t qpn);
/* Publish entry idx of the receive ring of q, its completion written: by
 * its tag, then rq_done (shared.h). */
void urdma_ring_publish(struct urdma_shm_qp *q, struct urdma_shm_rqe *e,
			uint32_t idx);
/* A receive completed into the CQ (or XRC SRQ) whose notify word this
 * is: true if it fires that armed CQ (the arm is consumed).  claim fences
 * first (the completion published before notify is read); take does not
 * (its caller did), and returns the word it claimed, 0 if none. */
bool urdma_rq_notify_claim(_Atomic uint32_t *notify, bool solicited);
uint32_t urdma_notify_take(_Atomic uint32_t *notify, bool solicited);
/* Fetch-and-add (compare_add is the addend) or compare-and-swap on *p;
 * returns the old value. */
uint64_t urdma_atomic_apply(uint64_t *p, bool cas, uint64_t compare_add,
			    uint64_t swap);
/* The same on the 8 bytes of span t (of peer's memory, as resolved from
 * ctx, peer's MR table; this process's if peer is NULL), whether direct or
 * not: 0 and *old, or -errno (out of reach; the owner's lock for direct
 * MRs could not be had). */
int urdma_atomic_span(struct urdma_peer *peer, const struct urdma_shm_ctx *ctx,
		      const struct urdma_span *t, bool cas,
		      uint64_t compare_add, uint64_t swap, uint64_t *old);

/* A deliverer enters t's receive ring (busy, then the caller checks the
 * state: the owner sets its state, then waits for busy to clear). */
static inline void urdma_rq_busy(struct urdma_shm_qp *t)
{
	atomic_store(&t->busy, 1);
	atomic_thread_fence(memory_order_seq_cst);
}

static inline void urdma_rq_idle(struct urdma_shm_qp *t)
{
	atomic_store_explicit(&t->busy, 0, memory_order_release);
}

/* Our pid, without getpid's system call per message (UD's ring lock,
 * direct-MR atomics, SRQ claims); a fork's child looks again. */
uint32_t urdma_self_pid(void);

/* Resolve the local SGEs of a WR into spans; LOC_PROT_ERR on a bad one. */
enum ibv_wc_status urdma_local_spans(struct urdma_qp *qp,
				     struct urdma_swqe *wqe,
				     struct urdma_span *spans, int *n,
				     uint32_t access);

#endif
