// SPDX-License-Identifier: MIT
/*
 * What the transports share: which one a QP uses, copies between spans,
 * and the responder's side of a delivery (checks, receive WRs, events).
 *
 * Which transport a QP uses is decided when it connects (INIT->RTR).
 *
 * URDMA_TRANSPORT=shm or =tcp forces one (set it the same on both sides);
 * otherwise ("auto"): a peer addressed by LID only, or by a GID that is an
 * address of this network namespace, is on this host; it gets shared
 * memory if it is a QP of our own user (its record is in our host
 * directory, core/host.c), TCP over loopback (or that local address)
 * otherwise: processes of two users never share memory.  Any other GID is
 * another host and gets TCP.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/transport.h"
#include "util/log.h"

bool urdma_gid_is_local(const struct urdma_context *uctx, const void *gid)
{
	if (IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)gid) ||
	    (IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)gid) &&
	     ((const uint8_t *)gid)[12] == 127))
		return true;
	for (int i = 0; i < uctx->num_gids; i++)
		if (!memcmp(uctx->gids[i].gid.raw, gid, 16))
			return true;
	return false;
}

const struct urdma_transport_ops *const urdma_ud_transports[] = {
	&urdma_ud_transport,
	NULL,
};

const struct urdma_transport_ops *const urdma_transports[] = {
	&urdma_tcp_transport,
	&urdma_shm_transport,
	NULL,
};

const struct urdma_transport_ops *urdma_pick_transport(struct urdma_qp *qp,
						       const struct ibv_qp_attr *a)
{
	const char *e = getenv("URDMA_TRANSPORT");
	const struct urdma_transport_ops *tr;
	struct urdma_qp_rec rec;

	/* A UD QP's datagrams each go where their WR says, on this host. */
	if (qp->ibqp.qp_type == IBV_QPT_UD)
		return &urdma_ud_transport;
	/* Another network namespace's LID is another host's, which nothing
	 * routes to by LID (unless a GID came with it before: ud.c, and the
	 * address is global now): refused here, not sent to a QP of that
	 * number on this host (ah_check says the same of address handles). */
	if (!a->ah_attr.is_global && a->ah_attr.dlid &&
	    a->ah_attr.dlid != qp->uctx->lid) {
		urdma_warn("qp %#x: LID %u is not this host's (%u), and no "
			   "address has told its GID: another host is "
			   "reached by its GID (is_global)",
			   qp->ibqp.qp_num, a->ah_attr.dlid, qp->uctx->lid);
		return NULL;
	}
	if (e && !strcmp(e, "shm"))
		tr = &urdma_shm_transport;
	else if (e && !strcmp(e, "tcp"))
		tr = &urdma_tcp_transport;
	else if (a->ah_attr.is_global &&
		 !urdma_gid_is_local(qp->uctx, a->ah_attr.grh.dgid.raw))
		tr = &urdma_tcp_transport;
	else if (!urdma_host_rec_live("qp", a->dest_qp_num, &rec)) {
		tr = &urdma_shm_transport;
		/* shm_attach starts from this record: no second read */
		qp->peer_ctx = rec.ctx_id;
		qp->peer_va = rec.va;
		qp->peer_size = rec.size;
		qp->peer_rec_read = true;
	} else {
		urdma_info("qp %#x: QP %#x on this host is not one of this "
			   "user's: TCP over %s", qp->ibqp.qp_num,
			   a->dest_qp_num,
			   a->ah_attr.is_global ? "its address" : "loopback");
		tr = &urdma_tcp_transport;
	}
	if (tr->qpn_reserve && qp->qpn_tr != tr) {
		urdma_warn("qp %#x: needs %s, and its number was not made by "
			   "it (see earlier messages)", qp->ibqp.qp_num,
			   tr->name);
		return NULL;
	}
	urdma_dbg("qp %#x: transport %s", qp->ibqp.qp_num, tr->name);
	return tr;
}

void *urdma_space_ptr(struct urdma_peer *peer, uint64_t va, uint64_t *avail)
{
	return peer ? urdma_peer_ptr(peer, va, avail) : urdma_self_ptr(va, avail);
}

/*
 * Copy n bytes storing each destination byte exactly once.  glibc's memcpy
 * stores some bytes twice (overlapping vector stores at the ends); a target
 * that polls a byte of its buffer, sees it arrive and writes it again could
 * then see it change back, which an RNIC never does.  A loop of 16-byte
 * stores, then words, then bytes, takes 0.5-1.5 times memcpy's time here,
 * cache-hot, best of 5 (8 B 1.4 vs 2.8 ns, 4 KiB 77 vs 51 ns, 1 MiB 26.7
 * vs 22.9 us); rep movsb, the other candidate, took 6-12 times as long.
 */
typedef uint64_t copy_vec __attribute__((vector_size(16)));

static inline void copy_once(uint8_t *d, const uint8_t *s, uint64_t n)
{
	for (; n >= 32; n -= 32, d += 32, s += 32) {
		copy_vec a, b;

		memcpy(&a, s, 16);
		memcpy(&b, s + 16, 16);
		memcpy(d, &a, 16);
		memcpy(d + 16, &b, 16);
	}
	for (; n >= 8; n -= 8, d += 8, s += 8) {
		uint64_t v;

		memcpy(&v, s, 8);
		memcpy(d, &v, 8);
	}
	while (n--)
		*d++ = *s++;
}

/* Byte off of span sp of peer's memory (this process's if peer is NULL):
 * a pointer (NULL if out of reach) and how many bytes are contiguous
 * there; *far when it is an address in the peer process (a direct MR
 * there), for urdma_peer_vm. */
static uint8_t *piece(struct urdma_peer *peer, const struct urdma_span *sp,
		      uint64_t off, uint64_t *avail, bool *far)
{
	*far = false;
	if (sp->ptr) {
		*avail = sp->len - off;
		return sp->ptr + off;
	}
	if (!sp->direct)
		return urdma_space_ptr(peer, sp->va + off, avail);
	*far = !urdma_peer_is_self(peer);
	*avail = sp->len - off;
	return (uint8_t *)(uintptr_t)(sp->va + off);
}

uint8_t *urdma_span_ptr(const struct urdma_span *sp, uint64_t off,
			uint64_t *avail)
{
	bool far;

	return piece(NULL, sp, off, avail, &far);
}

/* n bytes from sp to dp where one (or both) is in another process. */
static int copy_far(struct urdma_peer *dpeer, uint8_t *dp, bool dfar,
		    struct urdma_peer *speer, uint8_t *sp, bool sfar,
		    uint64_t n)
{
	uint8_t bounce[4096];

	if (!sfar)
		return urdma_peer_vm(dpeer, true, sp, (uintptr_t)dp, n);
	if (!dfar)
		return urdma_peer_vm(speer, false, dp, (uintptr_t)sp, n);
	for (uint64_t k; n; n -= k, dp += k, sp += k) {
		int ret;

		k = n < sizeof(bounce) ? n : sizeof(bounce);
		ret = urdma_peer_vm(speer, false, bounce, (uintptr_t)sp, k);
		if (!ret)
			ret = urdma_peer_vm(dpeer, true, bounce, (uintptr_t)dp,
					    k);
		if (ret)
			return ret;
	}
	return 0;
}

int urdma_copy_spans(struct urdma_peer *dpeer, const struct urdma_span *d,
		     int nd, struct urdma_peer *speer,
		     const struct urdma_span *s, int ns, uint64_t len)
{
	uint64_t doff = 0, soff = 0;
	int di = 0, si = 0;

	while (len) {
		uint64_t davail, savail, n;
		uint8_t *dp, *sp;
		bool dfar, sfar;

		while (di < nd && doff == d[di].len)
			di++, doff = 0;
		while (si < ns && soff == s[si].len)
			si++, soff = 0;
		if (di == nd || si == ns)
			return -ERANGE;
		dp = piece(dpeer, &d[di], doff, &davail, &dfar);
		sp = piece(speer, &s[si], soff, &savail, &sfar);
		if (!dp || !sp)
			return -EFAULT;
		n = len;
		if (n > d[di].len - doff)
			n = d[di].len - doff;
		if (n > s[si].len - soff)
			n = s[si].len - soff;
		if (n > davail)
			n = davail;
		if (n > savail)
			n = savail;
		if (!dfar && !sfar)
			copy_once(dp, sp, n);
		else if (copy_far(dpeer, dp, dfar, speer, sp, sfar, n))
			return -EFAULT;
		doff += n;
		soff += n;
		len -= n;
	}
	return 0;
}

int urdma_remote_lookup(const struct urdma_shm_ctx *ctx, uint32_t qp_access,
			uint32_t pd_id, uint32_t qpn, uint32_t key,
			uint64_t addr, uint64_t len, uint32_t access,
			struct urdma_span *sp)
{
	*sp = (struct urdma_span){ .len = len };
	if (!len) /* nothing is touched: nothing to check */
		return 0;
	if ((qp_access & access) != access)
		return -EACCES; /* the responder QP does not allow it */
	return urdma_mr_lookup(ctx, key, addr, len, access, pd_id, qpn,
			       &sp->va, &sp->direct);
}

int urdma_rqe_spans(const struct urdma_shm_ctx *ctx, uint32_t pd_id,
		    uint32_t max_sge, const struct urdma_shm_rqe *e,
		    struct urdma_span *sp, int *n, uint64_t *room)
{
	uint32_t nsge = READ_ONCE(e->num_sge);

	if (nsge > max_sge)
		nsge = max_sge;
	*n = 0;
	*room = 0;
	for (uint32_t i = 0; i < nsge; i++) {
		uint64_t addr = READ_ONCE(e->sge[i].addr);
		uint32_t length = READ_ONCE(e->sge[i].length);
		uint32_t lkey = READ_ONCE(e->sge[i].lkey);
		struct urdma_span *d = &sp[*n];

		if (!length)
			continue;
		if (urdma_mr_lookup(ctx, lkey, addr, length,
				    IBV_ACCESS_LOCAL_WRITE, pd_id,
				    URDMA_VIA_LOCAL, &d->va, &d->direct))
			return -1;
		d->len = length;
		d->ptr = NULL;
		*room += length;
		(*n)++;
	}
	return 0;
}

/* A receive ring's geometry as a shared block's header gives it (read once
 * each), checked: a power-of-two size up to max_size, a stride for its
 * SGEs, right after the header of hdr bytes, inside the block. */
static int ring_geo(uint32_t size, uint32_t stride, uint32_t max_sge,
		    uint32_t off, size_t hdr, uint64_t bytes, uint32_t max_size,
		    struct urdma_rq_geo *g)
{
	if (!size || (size & (size - 1)) || size > max_size || !max_sge ||
	    max_sge > URDMA_MAX_SGE || stride != urdma_rq_stride(max_sge) ||
	    off != hdr || (uint64_t)size * stride > bytes - off)
		return -EINVAL;
	*g = (struct urdma_rq_geo){ .size = size, .stride = stride,
				    .max_sge = max_sge };
	return 0;
}

int urdma_shm_qp_check(const struct urdma_shm_qp *h, uint64_t bytes,
		       uint32_t qpn, uint32_t ctx_id, struct urdma_rq_geo *g)
{
	if (bytes < sizeof(*h) || READ_ONCE(h->magic) != URDMA_SHM_MAGIC ||
	    READ_ONCE(h->version) != URDMA_SHM_VERSION ||
	    READ_ONCE(h->qpn) != qpn || READ_ONCE(h->ctx_id) != ctx_id)
		return -EINVAL;
	return ring_geo(READ_ONCE(h->rq_size), READ_ONCE(h->rq_stride),
			READ_ONCE(h->rq_max_sge), READ_ONCE(h->rq_offset),
			sizeof(*h), bytes, URDMA_MAX_QP_WR, g);
}

int urdma_shm_srq_check(const struct urdma_shm_srq *h, uint64_t bytes,
			uint32_t srqn, uint64_t xrcd_id, uint32_t ctx_id,
			struct urdma_rq_geo *g, uint32_t *pd_id)
{
	if (bytes < sizeof(*h) || READ_ONCE(h->magic) != URDMA_SHM_MAGIC ||
	    READ_ONCE(h->version) != URDMA_SHM_VERSION ||
	    READ_ONCE(h->srqn) != srqn || READ_ONCE(h->xrcd_id) != xrcd_id ||
	    READ_ONCE(h->ctx_id) != ctx_id)
		return -EINVAL;
	*pd_id = READ_ONCE(h->pd_id);
	return ring_geo(READ_ONCE(h->rq_size), READ_ONCE(h->rq_stride),
			READ_ONCE(h->rq_max_sge), READ_ONCE(h->rq_offset),
			sizeof(*h), bytes, URDMA_MAX_SRQ_WR, g);
}

int urdma_xsrq_ref_find(struct urdma_xsrq_ref *r, uint32_t srqn,
			uint64_t xrcd_id)
{
	struct urdma_qp_rec rec;
	struct urdma_shm_srq *s;
	struct urdma_peer *p;
	uint64_t avail;
	int ret;

	if (r->srqn == srqn && r->shm)
		return 0;
	r->srqn = 0;
	r->shm = NULL;
	if (urdma_host_rec_find("srq", srqn, &rec) || rec.size < sizeof(*s) ||
	    rec.size > URDMA_SHM_BLOCK_MAX || (rec.va & 4095) ||
	    rec.va >> URDMA_VA_BITS)
		return -ENOENT;
	p = urdma_peer_get(rec.ctx_id);
	if (!p)
		return -ENOENT;
	urdma_peer_set(&r->peer, p);
	ret = urdma_peer_wait(p, 0);
	if (ret)
		return ret == -EAGAIN ? ret : -ENOENT;
	s = urdma_peer_ptr(p, rec.va, &avail);
	if (!s || avail < rec.size ||
	    urdma_shm_srq_check(s, rec.size, srqn, xrcd_id, rec.ctx_id, &r->rq,
				&r->pd_id))
		return -ENOENT;
	r->ring = (uint8_t *)s + sizeof(*s);
	r->shm = s;
	r->srqn = srqn;
	r->xrcd_id = xrcd_id;
	return 0;
}

bool urdma_xsrq_enter(struct urdma_xsrq_ref *r)
{
	struct urdma_shm_srq *s = r->shm;

	atomic_fetch_add(&s->busy, 1);
	/* Dekker with urdma_xsrq_teardown: our busy before its state. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&s->state, memory_order_relaxed) ==
		    URDMA_SSRQ_LIVE &&
	    READ_ONCE(s->magic) == URDMA_SHM_MAGIC &&
	    READ_ONCE(s->srqn) == r->srqn && READ_ONCE(s->xrcd_id) == r->xrcd_id &&
	    !urdma_peer_dead(r->peer))
		return true;
	atomic_fetch_sub(&s->busy, 1);
	r->srqn = 0; /* gone: looked for again, by its record */
	r->shm = NULL;
	return false;
}

void urdma_xsrq_leave(struct urdma_shm_srq *s)
{
	atomic_fetch_sub_explicit(&s->busy, 1, memory_order_release);
}

void urdma_xsrq_ref_drop(struct urdma_xsrq_ref *r)
{
	r->srqn = 0;
	r->shm = NULL;
	urdma_peer_set(&r->peer, NULL);
}

/* Our pid without a system call per message (getpid makes one); a
 * fork's child looks again. */
static uint32_t self_pid;

static void self_pid_forget(void)
{
	self_pid = 0;
}

static void self_pid_watch(void)
{
	pthread_atfork(NULL, NULL, self_pid_forget);
}

uint32_t urdma_self_pid(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	if (!self_pid) {
		pthread_once(&once, self_pid_watch);
		self_pid = (uint32_t)getpid();
	}
	return self_pid;
}

int urdma_srq_claim(struct urdma_shm_srq *s, uint8_t *ring,
		    const struct urdma_rq_geo *g, uint32_t *idx, bool *wake)
{
	uint32_t c = atomic_load_explicit(&s->claim, memory_order_relaxed);
	uint32_t p, lim;
	bool looked = false;

	for (;;) {
		p = atomic_load_explicit(&s->prod, memory_order_acquire);
		if (p - c > g->size) {
			/* c may be old: others claimed, the owner took and
			 * posted again.  Only a fresh pair that disagrees is
			 * nonsense. */
			uint32_t c2 = atomic_load_explicit(&s->claim,
							   memory_order_acquire);

			if (c2 != c) {
				c = c2;
				continue;
			}
			return -EINVAL; /* indices no owner writes */
		}
		if (c == p) {
			if (looked)
				return -EAGAIN;
			/* RNR: ask for a wake-up, then look once more. */
			atomic_store(&s->rnr_waiter, 1);
			atomic_thread_fence(memory_order_seq_cst);
			looked = true;
			c = atomic_load_explicit(&s->claim,
						 memory_order_relaxed);
			continue;
		}
		if (atomic_compare_exchange_weak_explicit(
			    &s->claim, &c, c + 1, memory_order_acquire,
			    memory_order_relaxed))
			break;
	}
	urdma_rqe_at(ring, g, c)->srq_pid = urdma_self_pid();
	*idx = c;
	lim = atomic_load_explicit(&s->limit, memory_order_relaxed);
	*wake = lim && p - (c + 1) < lim &&
		!atomic_load_explicit(&s->limit_hit, memory_order_relaxed) &&
		!atomic_exchange(&s->limit_hit, 1);
	return 0;
}

void urdma_srq_publish(struct urdma_shm_rqe *e, uint32_t idx, uint32_t qpn)
{
	e->srq_qpn = qpn;
	atomic_store_explicit(&e->tag, idx + 1, memory_order_release);
}

void urdma_ring_publish(struct urdma_shm_qp *q, struct urdma_shm_rqe *e,
			uint32_t idx)
{
	atomic_store_explicit(&e->tag, idx + 1, memory_order_release);
	atomic_store_explicit(&q->rq_done, idx + 1, memory_order_release);
}

uint32_t urdma_notify_take(_Atomic uint32_t *notify, bool solicited)
{
	uint32_t n = atomic_load_explicit(notify, memory_order_relaxed);
	uint32_t mode = n & URDMA_NOTIFY_MODE;

	if (mode != URDMA_NOTIFY_ANY &&
	    !(mode == URDMA_NOTIFY_SOLICITED && solicited))
		return 0;
	/* (that arm only: one made meanwhile, say solicited-only, stays) */
	return atomic_compare_exchange_strong(notify, &n, URDMA_NOTIFY_NONE) ?
		       n :
		       0;
}

bool urdma_rq_notify_claim(_Atomic uint32_t *notify, bool solicited)
{
	/* Dekker with urdma_req_notify_cq: our completion must be visible
	 * before we read 'notify', or an owner that arms and then polls can
	 * miss both the completion and the event (x86 reorders a store with
	 * a later load). */
	atomic_thread_fence(memory_order_seq_cst);
	return urdma_notify_take(notify, solicited) != 0;
}

uint64_t urdma_atomic_apply(uint64_t *p, bool cas, uint64_t compare_add,
			    uint64_t swap)
{
	uint64_t old;

	if (!cas)
		return __atomic_fetch_add(p, compare_add, __ATOMIC_SEQ_CST);
	old = compare_add;
	__atomic_compare_exchange_n(p, &old, swap, false, __ATOMIC_SEQ_CST,
				    __ATOMIC_SEQ_CST);
	return old;
}

/*
 * Atomics on a direct MR can't be one instruction when its memory is in
 * another process: every executor (a peer's requester with two system
 * calls, the owner's own TCP responder with an instruction) takes the
 * owner's lock word first, so they are atomic with respect to each other,
 * as IBV_ATOMIC_HCA promises.  The word holds the holder's pid; a holder
 * that died is replaced, one that holds on for DLOCK_WAIT_NS makes the
 * operation fail.
 */
#define DLOCK_WAIT_NS 1000000000ull

static bool dlock_take(_Atomic uint64_t *w, uint64_t me)
{
	uint64_t end = 0;

	for (unsigned int i = 0;; i++) {
		uint64_t cur = 0;

		if (atomic_compare_exchange_weak(w, &cur, me))
			return true;
		if (i < 100) {
			__builtin_ia32_pause();
			continue;
		}
		if (!end)
			end = urdma_now_ns() + DLOCK_WAIT_NS;
		if (cur && (cur > INT32_MAX ||
			    (kill((pid_t)cur, 0) && errno == ESRCH)) &&
		    atomic_compare_exchange_strong(w, &cur, me))
			return true; /* its holder is gone */
		if (urdma_now_ns() > end)
			return false;
		sched_yield();
	}
}

int urdma_atomic_span(struct urdma_peer *peer, const struct urdma_shm_ctx *ctx,
		      const struct urdma_span *t, bool cas,
		      uint64_t compare_add, uint64_t swap, uint64_t *old)
{
	uint64_t avail, lock_va, v, nv, me;
	_Atomic uint64_t *w;
	bool far;
	uint8_t *p = piece(peer, t, 0, &avail, &far);
	int ret = 0;

	if (!p || avail < 8)
		return -EFAULT;
	if (!t->direct) {
		*old = urdma_atomic_apply((uint64_t *)p, cas, compare_add, swap);
		return 0;
	}
	lock_va = atomic_load_explicit(&ctx->atomic_lock, memory_order_relaxed);
	w = lock_va && !(lock_va & 7) ?
		    urdma_space_ptr(peer, lock_va, &avail) : NULL;
	if (!w || avail < 8)
		return -EFAULT;
	me = urdma_self_pid();
	if (!dlock_take(w, me))
		return -ETIMEDOUT;
	if (!far) {
		*old = urdma_atomic_apply((uint64_t *)p, cas, compare_add, swap);
	} else {
		ret = urdma_peer_vm(peer, false, &v, (uintptr_t)p, 8);
		nv = cas ? (v == compare_add ? swap : v) : v + compare_add;
		if (!ret && nv != v)
			ret = urdma_peer_vm(peer, true, &nv, (uintptr_t)p, 8);
		*old = v;
	}
	atomic_compare_exchange_strong(w, &me, 0);
	return ret;
}
