// SPDX-License-Identifier: MIT
/*
 * Protection domains and memory regions.  An MR is an entry of the
 * context's shared MR table (core/shared.h): peers check rkeys against it
 * without asking us.  Keys carry 18 random bits, so they can't be guessed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"

#define PAGE_DOWN(x) ((x) & ~4095ULL)
#define PAGE_UP(x) (((x) + 4095ULL) & ~4095ULL)

static _Atomic uint32_t next_pd_id = 1;

struct ibv_pd *urdma_alloc_pd(struct ibv_context *context)
{
	struct urdma_pd *pd = urdma_zalloc(sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->ibpd.context = context;
	pd->id = atomic_fetch_add(&next_pd_id, 1);
	pd->ibpd.handle = pd->id;
	return &pd->ibpd;
}

int urdma_dealloc_pd(struct ibv_pd *ibpd)
{
	struct urdma_pd *pd = to_upd(ibpd);

	if (atomic_load(&pd->usecnt))
		return EBUSY;
	if (pd->pd) /* a parent domain lets go of its PD and TD */
		atomic_fetch_sub(&pd->pd->usecnt, 1);
	if (pd->td)
		atomic_fetch_sub(&pd->td->usecnt, 1);
	urdma_free(pd);
	return 0;
}

struct ibv_td *urdma_alloc_td(struct ibv_context *context,
			      struct ibv_td_init_attr *attr)
{
	struct urdma_td *td;

	if (attr->comp_mask) {
		errno = EINVAL;
		return NULL;
	}
	td = urdma_zalloc(sizeof(*td));
	if (!td) {
		errno = ENOMEM;
		return NULL;
	}
	td->ibtd.context = context;
	return &td->ibtd;
}

int urdma_dealloc_td(struct ibv_td *ibtd)
{
	struct urdma_td *td = container_of(ibtd, struct urdma_td, ibtd);

	if (atomic_load(&td->usecnt))
		return EBUSY; /* a parent domain uses it */
	urdma_free(td);
	return 0;
}

/*
 * A parent domain: a PD to use wherever its PD would be, whose objects
 * belong to that PD (same id).  Custom allocators are refused: urdma's
 * buffers are its own memory (rings that grow, shared blocks), and no
 * resource type outside a provider's own (mlx5dv) names them.
 */
struct ibv_pd *urdma_alloc_parent_domain(struct ibv_context *context,
					 struct ibv_parent_domain_init_attr *a)
{
	struct urdma_pd *pd, *base;

	if (!a->pd || a->pd->context != context ||
	    (a->td && a->td->context != context) ||
	    (a->comp_mask & ~(uint32_t)(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
				      IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT))) {
		errno = EINVAL;
		return NULL;
	}
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	base = to_upd(a->pd);
	if (base->pd) { /* a parent domain of a parent domain */
		errno = EINVAL;
		return NULL;
	}
	pd = urdma_zalloc(sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->ibpd.context = context;
	pd->ibpd.handle = base->id;
	pd->id = base->id;
	pd->pd = base;
	atomic_fetch_add(&base->usecnt, 1);
	if (a->td) {
		pd->td = container_of(a->td, struct urdma_td, ibtd);
		atomic_fetch_add(&pd->td->usecnt, 1);
	}
	return &pd->ibpd;
}

/* Access bits we honour; the optional range (relaxed ordering...) is
 * ignored, as rdma-core does for devices that lack them. */
#define MR_ACCESS_KNOWN                                                        \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |                   \
	 IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND |   \
	 IBV_ACCESS_HUGETLB)

static int check_access(unsigned int access)
{
	access &= ~IBV_ACCESS_OPTIONAL_RANGE;
	if (access & ~MR_ACCESS_KNOWN)
		return EINVAL;
	/* The IB spec: remote write and atomic need local write. */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

uint32_t urdma_mr_key(uint32_t idx, uint32_t rnd)
{
	uint32_t tag = URDMA_MR_TAG(rnd);

	return tag ? idx << URDMA_MR_TAG_BITS | tag : 0;
}

uint32_t urdma_mr_new_key(uint32_t idx)
{
	uint32_t key;

	/* A tag with bits above the low byte: a window's ibv_inc_rkey
	 * never makes it 0. */
	while (!(key = urdma_mr_key(idx, urdma_random32())) ||
	       !(URDMA_MR_TAG(key) >> 8))
		;
	return key;
}

/* Fills the shared entry with key (a new one, or the MR's own on
 * ibv_rereg_mr, as rxe and mlx5 keep it: peers hold it); the key is
 * published last, and seq tells readers the entry changed under them. */
void urdma_mr_publish(struct urdma_mr *mr, uint32_t pd_id, uint32_t key)
{
	struct urdma_shm_mr *e = mr->shm;
	uint32_t seq = atomic_load_explicit(&e->seq, memory_order_relaxed);

	atomic_store_explicit(&e->key, 0, memory_order_relaxed);
	atomic_store_explicit(&e->seq, seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	e->access = mr->access;
	e->pd_id = pd_id;
	e->iova = mr->iova;
	e->length = mr->length;
	e->va = mr->va;
	e->qpn = mr->qpn;
	atomic_store_explicit(&e->flags,
			      (mr->direct ? URDMA_MR_F_DIRECT : 0) | mr->mw_flags,
			      memory_order_relaxed);
	mr->ibmr.lkey = mr->ibmr.rkey = key;
	atomic_store_explicit(&e->seq, seq + 2, memory_order_release);
	atomic_store_explicit(&e->key, key, memory_order_release);
}

/* Make [va, va+length) reachable by peers: 0 (backed), 1 (direct: the
 * context's MR table then names the lock of atomics on it), or -errno. */
static int mr_back(struct urdma_context *uctx, uint64_t va, uint64_t length,
		   unsigned int access)
{
	int ret = urdma_host_back_range(PAGE_DOWN(va),
					PAGE_UP(va + length) - PAGE_DOWN(va),
					access & IBV_ACCESS_LOCAL_WRITE);
	uint64_t lock;

	if (ret != 1 || atomic_load(&uctx->shm->atomic_lock))
		return ret;
	lock = urdma_arena_lock();
	if (!lock)
		return -ENOMEM;
	atomic_store(&uctx->shm->atomic_lock, lock);
	return 1;
}

/* A free entry of the MR table, or -1.  Under uctx->lock. */
int urdma_mr_slot_find(struct urdma_context *uctx)
{
	for (unsigned int i = 0; i < URDMA_MAX_MR; i++) {
		unsigned int j = (uctx->num_mrs + i) % URDMA_MAX_MR;

		if (!uctx->mrs[j])
			return (int)j;
	}
	return -1;
}

struct ibv_mr *urdma_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length,
			    uint64_t iova, unsigned int access)
{
	struct urdma_context *uctx = to_uctx(ibpd->context);
	struct urdma_pd *pd = to_upd(ibpd);
	uint64_t va = (uintptr_t)addr;
	struct urdma_mr *mr;
	int ret, idx = -1;

	ret = check_access(access);
	if (!ret && (!length || length > URDMA_MAX_MR_SIZE || va + length < va))
		ret = EINVAL;
	if (ret) {
		errno = ret;
		return NULL;
	}
	ret = mr_back(uctx, va, length, access);
	if (ret < 0) {
		urdma_dbg("can't register %p+%zu: %s", addr, length,
			  strerror(-ret));
		errno = -ret;
		return NULL;
	}
	mr = urdma_zalloc(sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->direct = ret;
	pthread_mutex_lock(&uctx->lock);
	idx = urdma_mr_slot_find(uctx);
	if (idx < 0) {
		pthread_mutex_unlock(&uctx->lock);
		urdma_free(mr);
		errno = ENOMEM;
		return NULL;
	}
	/* Whole before urdma_mrs_check() can see it. */
	mr->ibmr.context = ibpd->context;
	mr->ibmr.pd = ibpd;
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->ibmr.handle = idx;
	mr->shm = &uctx->shm->mr[idx];
	mr->iova = iova;
	mr->length = length;
	mr->va = va;
	mr->access = access & ~IBV_ACCESS_OPTIONAL_RANGE;
	urdma_mr_publish(mr, pd->id, urdma_mr_new_key(idx));
	pthread_mutex_lock(&uctx->mw_lock);
	uctx->mrs[idx] = mr;
	pthread_mutex_unlock(&uctx->mw_lock);
	uctx->num_mrs = idx + 1;
	pthread_mutex_unlock(&uctx->lock);
	atomic_fetch_add(&pd->usecnt, 1);
	urdma_dbg("mr %#x: [%#lx, +%zu) iova %#lx access %#x", mr->ibmr.lkey,
		  (unsigned long)va, length, (unsigned long)iova, access);
	return &mr->ibmr;
}

int urdma_dereg_mr(struct ibv_mr *ibmr)
{
	struct urdma_context *uctx = to_uctx(ibmr->context);
	struct urdma_mr *mr = to_umr(ibmr);

	pthread_mutex_lock(&uctx->lock);
	pthread_mutex_lock(&uctx->mw_lock);
	if (atomic_load(&mr->num_mw)) { /* memory windows are bound to it */
		pthread_mutex_unlock(&uctx->mw_lock);
		pthread_mutex_unlock(&uctx->lock);
		return EBUSY;
	}
	atomic_store_explicit(&mr->shm->key, 0, memory_order_release);
	uctx->mrs[URDMA_MR_IDX(ibmr->lkey)] = NULL;
	pthread_mutex_unlock(&uctx->mw_lock);
	pthread_mutex_unlock(&uctx->lock);
	atomic_fetch_sub(&to_upd(ibmr->pd)->usecnt, 1);
	urdma_free(mr);
	return 0;
}

int urdma_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *ibpd,
		   void *addr, size_t length, int access)
{
	struct urdma_context *uctx = to_uctx(ibmr->context);
	struct urdma_mr *mr = to_umr(ibmr);
	struct ibv_pd *old_pd = ibmr->pd;
	uint64_t va = (uintptr_t)addr;
	bool direct = mr->direct;
	int ret;

	/* Input rules of rdma-core's ibv_rereg_mr: nothing given that the
	 * flags don't ask to change. */
	if (!flags || flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION |
				IBV_REREG_MR_CHANGE_PD |
				IBV_REREG_MR_CHANGE_ACCESS) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) ?
		     (!addr || !length || length > URDMA_MAX_MR_SIZE ||
		      va + length < va) :
		     (addr || length)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) ||
	    ((flags & IBV_REREG_MR_CHANGE_ACCESS) && check_access(access)) ||
	    ((flags & IBV_REREG_MR_CHANGE_PD) &&
	     (!ibpd || ibpd->context != ibmr->context))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & (IBV_REREG_MR_CHANGE_TRANSLATION |
		     IBV_REREG_MR_CHANGE_ACCESS)) {
		/* The new range, or the old one with new rights. */
		uint64_t nva = flags & IBV_REREG_MR_CHANGE_TRANSLATION ? va : mr->va;
		uint64_t nlen = flags & IBV_REREG_MR_CHANGE_TRANSLATION ?
					length : mr->length;

		ret = mr_back(uctx, nva, nlen,
			      flags & IBV_REREG_MR_CHANGE_ACCESS ? (unsigned)access
								 : mr->access);
		if (ret < 0) {
			errno = -ret;
			return IBV_REREG_MR_ERR_INPUT;
		}
		direct = ret;
	}
	/* Under the lock of urdma_mrs_check(), which reads the range and
	 * flags the entry that urdma_mr_publish() rewrites. */
	pthread_mutex_lock(&uctx->lock);
	pthread_mutex_lock(&uctx->mw_lock); /* a bind reads the MR */
	mr->direct = direct;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->va = va;
		mr->iova = va;
		mr->length = length;
		ibmr->addr = addr;
		ibmr->length = length;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr->access = access & ~IBV_ACCESS_OPTIONAL_RANGE;
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		atomic_fetch_sub(&to_upd(old_pd)->usecnt, 1);
		atomic_fetch_add(&to_upd(ibpd)->usecnt, 1);
		ibmr->pd = ibpd;
	}
	urdma_mr_publish(mr, to_upd(ibmr->pd)->id, ibmr->lkey);
	pthread_mutex_unlock(&uctx->mw_lock);
	pthread_mutex_unlock(&uctx->lock);
	return 0;
}

/*
 * Off the data path (progress thread): notice registered pages that the
 * application unmapped.  From then on every access to the MR completes with
 * an error, instead of reaching memory the application no longer sees.
 */
void urdma_mrs_check(struct urdma_context *uctx)
{
	pthread_mutex_lock(&uctx->lock);
	for (unsigned int i = 0; i < URDMA_MAX_MR; i++) {
		struct urdma_mr *mr = uctx->mrs[i];
		uint64_t s, e;

		/* A window's range moves under mw_lock; its MR is checked. */
		if (!mr || (mr->mw_flags & URDMA_MR_F_MW))
			continue;
		s = PAGE_DOWN(mr->va);
		e = PAGE_UP(mr->va + mr->length);
		if (msync((void *)s, e - s, MS_ASYNC) < 0 && errno == ENOMEM &&
		    !(atomic_load(&mr->shm->flags) & URDMA_MR_F_UNMAPPED)) {
			/* (legal: UCX's cache deregisters freed memory
			 * lazily; only an access would be an error) */
			urdma_info("mr %#x: its pages were unmapped; accesses "
				   "will fail", mr->ibmr.lkey);
			atomic_fetch_or(&mr->shm->flags, URDMA_MR_F_UNMAPPED);
		}
	}
	pthread_mutex_unlock(&uctx->lock);
}
