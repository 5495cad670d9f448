// SPDX-License-Identifier: MIT
/*
 * Memory windows.  A window is an entry of the context's MR table of its
 * own (mw->slot), flagged URDMA_MR_F_MW: peers check its rkey as they
 * check an MR's (urdma_mr_lookup), but it is never a local key, and a
 * type 2 window is reached only through the QP it was bound to (the
 * entry's qpn).  Unbound or invalidated, its entry has key 0.
 *
 * Binding and local invalidation are work requests, run in send queue
 * order by the engine (urdma_mw_execute from sq_run); ibv_bind_mw posts
 * one for a type 1 window.  The rkey's low byte is the program's to
 * choose for a type 2 bind (ibv_inc_rkey); the index above it (the MR
 * table layout, shared.h) stays.
 */
#include <errno.h>
#include <string.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"

#define MW_ACCESS                                                              \
	(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |                    \
	 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED)

static inline struct urdma_mw *to_umw(struct ibv_mw *m)
{
	return container_of(m, struct urdma_mw, ibmw);
}

/* One PD, whether named by itself or by a parent domain of it. */
static bool same_pd(struct ibv_pd *a, struct ibv_pd *b)
{
	return to_upd(a)->id == to_upd(b)->id;
}

struct ibv_mw *urdma_alloc_mw(struct ibv_pd *ibpd, enum ibv_mw_type type)
{
	struct urdma_context *uctx = to_uctx(ibpd->context);
	struct urdma_mw *mw;
	int idx;

	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return NULL;
	}
	mw = urdma_zalloc(sizeof(*mw));
	if (!mw) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&uctx->lock);
	idx = urdma_mr_slot_find(uctx);
	if (idx < 0) {
		pthread_mutex_unlock(&uctx->lock);
		urdma_free(mw);
		errno = ENOMEM;
		return NULL;
	}
	/* Not published: the entry's key stays 0 until a bind. */
	mw->slot.shm = &uctx->shm->mr[idx];
	mw->slot.mw_flags = URDMA_MR_F_MW;
	mw->slot.ibmr.context = ibpd->context;
	mw->slot.ibmr.pd = ibpd;
	pthread_mutex_lock(&uctx->mw_lock);
	uctx->mrs[idx] = &mw->slot;
	pthread_mutex_unlock(&uctx->mw_lock);
	uctx->num_mrs = idx + 1;
	pthread_mutex_unlock(&uctx->lock);
	mw->ibmw.context = ibpd->context;
	mw->ibmw.pd = ibpd;
	mw->ibmw.type = type;
	mw->ibmw.handle = (uint32_t)idx;
	mw->ibmw.rkey = urdma_mr_new_key((uint32_t)idx);
	atomic_fetch_add(&to_upd(ibpd)->usecnt, 1);
	return &mw->ibmw;
}

/* Let go of the MR it is bound to, and clear its entry.  Under
 * uctx->mw_lock. */
static void mw_unbind_locked(struct urdma_mw *mw)
{
	atomic_store_explicit(&mw->slot.shm->key, 0, memory_order_release);
	mw->slot.length = 0;
	mw->slot.va = 0;
	if (mw->bound)
		atomic_fetch_sub(&mw->bound->num_mw, 1);
	mw->bound = NULL;
}

int urdma_dealloc_mw(struct ibv_mw *ibmw)
{
	struct urdma_context *uctx = to_uctx(ibmw->context);
	struct urdma_mw *mw = to_umw(ibmw);

	pthread_mutex_lock(&uctx->lock);
	pthread_mutex_lock(&uctx->mw_lock);
	mw_unbind_locked(mw);
	uctx->mrs[URDMA_MR_IDX(ibmw->rkey)] = NULL;
	pthread_mutex_unlock(&uctx->mw_lock);
	pthread_mutex_unlock(&uctx->lock);
	atomic_fetch_sub(&to_upd(ibmw->pd)->usecnt, 1);
	urdma_free(mw);
	return 0;
}

/* ibv_bind_mw: a type 1 window's bind, as a WR on qp (its completion is
 * IBV_WC_BIND_MW if signaled); the window's new rkey at once. */
int urdma_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *ibmw,
		  struct ibv_mw_bind *bind)
{
	struct ibv_send_wr wr = {
		.wr_id = bind->wr_id,
		.opcode = IBV_WR_BIND_MW,
		.send_flags = bind->send_flags,
		.bind_mw = { .mw = ibmw, .rkey = ibv_inc_rkey(ibmw->rkey),
			     .bind_info = bind->bind_info },
	};
	int ret;

	if (ibqp->context != ibmw->context)
		return EINVAL;
	ret = urdma_post_send_all(to_uqp(ibqp), &wr, 1);
	if (!ret)
		ibmw->rkey = wr.bind_mw.rkey;
	return ret;
}

/* The window of rkey's entry.  Under uctx->mw_lock. */
static struct urdma_mw *mw_of_key(struct urdma_context *uctx, uint32_t rkey)
{
	struct urdma_mr *slot = uctx->mrs[URDMA_MR_IDX(rkey)];

	if (!slot || !(slot->mw_flags & URDMA_MR_F_MW))
		return NULL;
	return container_of(slot, struct urdma_mw, slot);
}

static enum ibv_wc_status mw_bind(struct urdma_qp *qp, struct urdma_mw *mw,
				  const struct urdma_swqe *w)
{
	struct urdma_context *uctx = qp->uctx;
	uint32_t key = w->rkey, access = w->imm_data;
	uint64_t addr = w->sge[0].addr, len = w->compare_add;
	struct urdma_mr *mr = NULL;

	/* The window, the QP and the MR share a PD; the MR allows binding,
	 * the range is inside it, and a window that may be written (or
	 * take atomics) needs an MR the owner may write. */
	if (!same_pd(mw->ibmw.pd, qp->ibqp.pd) || (access & ~MW_ACCESS) ||
	    URDMA_MR_IDX(key) != URDMA_MR_IDX(mw->ibmw.rkey) ||
	    !URDMA_MR_TAG(key))
		return IBV_WC_MW_BIND_ERR;
	if (len) {
		mr = uctx->mrs[URDMA_MR_IDX(w->sge[0].lkey)];
		if (!mr || (mr->mw_flags & URDMA_MR_F_MW) ||
		    mr->ibmr.lkey != w->sge[0].lkey ||
		    !same_pd(mr->ibmr.pd, mw->ibmw.pd) ||
		    !(mr->access & IBV_ACCESS_MW_BIND) ||
		    addr < mr->iova || len > mr->length ||
		    addr - mr->iova > mr->length - len ||
		    ((access & (IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_ATOMIC)) &&
		     !(mr->access & IBV_ACCESS_LOCAL_WRITE)))
			return IBV_WC_MW_BIND_ERR;
	}
	/* A type 2 window binds once until invalidated. */
	if (mw->ibmw.type == IBV_MW_TYPE_2 &&
	    (mw->bound || !mr ||
	     atomic_load(&mw->slot.shm->key) != 0))
		return IBV_WC_MW_BIND_ERR;
	mw_unbind_locked(mw);
	if (!mr) /* a type 1 window bound to nothing: unbound */
		return IBV_WC_SUCCESS;
	mw->bound = mr;
	atomic_fetch_add(&mr->num_mw, 1);
	mw->slot.va = mr->va + (addr - mr->iova);
	mw->slot.iova = access & IBV_ACCESS_ZERO_BASED ? 0 : addr;
	mw->slot.length = len;
	mw->slot.access = access & ~IBV_ACCESS_ZERO_BASED;
	mw->slot.direct = mr->direct;
	mw->slot.qpn = mw->ibmw.type == IBV_MW_TYPE_2 ? qp->ibqp.qp_num : 0;
	urdma_mr_publish(&mw->slot, to_upd(mw->ibmw.pd)->id, key);
	return IBV_WC_SUCCESS;
}

/* The bound type 2 window of qp's PD whose current key is rkey (and bound
 * to qp itself if to_qp: remote invalidation), or NULL.  Under
 * uctx->mw_lock. */
static struct urdma_mw *mw_type2_of(struct urdma_qp *qp, uint32_t rkey,
				    bool to_qp)
{
	struct urdma_mw *mw = mw_of_key(qp->uctx, rkey);

	if (!mw || mw->ibmw.type != IBV_MW_TYPE_2 || !mw->bound ||
	    !same_pd(mw->ibmw.pd, qp->ibqp.pd) ||
	    atomic_load(&mw->slot.shm->key) != rkey ||
	    (to_qp && mw->slot.qpn != qp->ibqp.qp_num))
		return NULL;
	return mw;
}

/* The engine runs a BIND_MW or LOCAL_INV WR here, under sq_lock (outer to
 * mw_lock; uctx->lock is not: the progress thread holds it to take
 * sq_lock). */
enum ibv_wc_status urdma_mw_execute(struct urdma_qp *qp,
				    const struct urdma_swqe *w)
{
	struct urdma_context *uctx = qp->uctx;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	struct urdma_mw *mw;

	pthread_mutex_lock(&uctx->mw_lock);
	if (w->opcode == IBV_WR_BIND_MW) {
		/* swap: the window's key when it was posted (its index) */
		mw = mw_of_key(uctx, (uint32_t)w->swap);
		st = mw ? mw_bind(qp, mw, w) : IBV_WC_MW_BIND_ERR;
	} else if ((mw = mw_type2_of(qp, w->imm_data, false))) {
		mw_unbind_locked(mw);
	} else {
		st = IBV_WC_LOC_QP_OP_ERR;
	}
	pthread_mutex_unlock(&uctx->mw_lock);
	if (st != IBV_WC_SUCCESS)
		urdma_dbg("qp %#x: %s of rkey %#x failed", qp->ibqp.qp_num,
			  w->opcode == IBV_WR_BIND_MW ? "bind" : "invalidate",
			  w->opcode == IBV_WR_BIND_MW ? w->rkey : w->imm_data);
	return st;
}

/* A Send with Invalidate received on qp names rkey: a type 2 window bound
 * to qp (of its PD) is invalidated, or only looked for if check_only.
 * false if rkey names none.  Any thread; mw_lock is innermost (the
 * receive paths hold a CQ lock or rx_lock). */
bool urdma_mw_remote_invalidate(struct urdma_qp *qp, uint32_t rkey,
				bool check_only)
{
	struct urdma_mw *mw;

	pthread_mutex_lock(&qp->uctx->mw_lock);
	mw = mw_type2_of(qp, rkey, true);
	if (mw && !check_only)
		mw_unbind_locked(mw);
	pthread_mutex_unlock(&qp->uctx->mw_lock);
	return mw;
}
