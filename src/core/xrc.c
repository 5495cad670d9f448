// SPDX-License-Identifier: MIT
/*
 * XRC: domains, XRC SRQ numbers, target QPs and the handles ibv_open_qp
 * gives to them.  The data path is the SRQ's (srq.c, the transports): an
 * XRC send QP names the SRQ of each message (wr.qp_type.xrc.remote_srqn),
 * the target QP it is connected to checks that the SRQ is of its domain,
 * and the SRQ completes into its own CQ.
 *
 * A domain opened through a file is that file's (its device and inode):
 * every process of this user that opens the same file shares it, as the
 * kernel's XRCDs are shared.  Whether it exists is whether someone holds
 * it: each open holds a shared flock on xrcd-<id> in the host directory,
 * which a process's death lets go (O_CREAT, O_EXCL are checked against
 * that).  An XRC SRQ publishes srq-<srqn>, so that a deliverer of any
 * process finds it (shm_transport.c), as QPs publish qp-<qpn>.
 *
 * Target QPs live in the context that made them: ibv_open_qp finds one of
 * that context (another handle to it, counted: the QP lives until its last
 * handle is destroyed); one of another context or process is EOPNOTSUPP.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

static pthread_mutex_t xrc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct list_head xrcds = LIST_HEAD_INIT(xrcds);
static struct list_head tgt_qps = LIST_HEAD_INIT(tgt_qps);
static struct list_head xsrqs = LIST_HEAD_INIT(xsrqs);
static _Atomic uint32_t xsrq_gen = 1; /* bumped as xsrqs changes */

uint32_t urdma_xsrq_gen(void)
{
	return atomic_load_explicit(&xsrq_gen, memory_order_acquire);
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void xrcd_name(char *name, size_t n, uint64_t id)
{
	snprintf(name, n, "xrcd-%016llx", (unsigned long long)id);
}

/* Is name (in the host directory) the file fd has open? */
static bool xrcd_same(int fd, const char *name)
{
	struct stat a, b;

	return !fstat(fd, &a) &&
	       !fstatat(urdma_proc.dirfd, name, &b, AT_SYMLINK_NOFOLLOW) &&
	       a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/* With fd locked exclusive (nobody else holds that file): remove its
 * name, if the name is still that file's.  Every remover holds the lock
 * on the file the name leads to, so a name another file took since (a
 * new domain) is never removed. */
static void xrcd_unlink(int fd, const char *name)
{
	if (xrcd_same(fd, name))
		unlinkat(urdma_proc.dirfd, name, 0);
}

/* Hold xrcd-<id> (shared flock) for as long as the domain is open here:
 * the fd, or -errno (-ENOENT: nobody has it and O_CREAT was not given,
 * -EEXIST: someone has it and O_EXCL was). */
static int xrcd_hold(uint64_t id, int oflags, bool local)
{
	char name[40];
	bool exists;
	struct stat st;
	int fd, err;

	xrcd_name(name, sizeof(name), id);
again:
	exists = local;
	fd = openat(urdma_proc.dirfd, name,
		    O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
		    0600);
	if (fd < 0)
		return -errno;
	/* Nobody else's: ours, and a plain file. */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
	    st.st_uid != geteuid()) {
		close(fd);
		return -EPERM;
	}
	/* Somebody holds it, if we can't have it alone. */
	if (!exists && flock(fd, LOCK_EX | LOCK_NB)) {
		if (errno != EWOULDBLOCK)
			goto err;
		exists = true;
	}
	if (!exists && !(oflags & O_CREAT)) {
		/* (we hold it alone: the name goes) */
		xrcd_unlink(fd, name);
		close(fd);
		return -ENOENT;
	}
	if (flock(fd, LOCK_SH)) /* from LOCK_EX, or waits out a check */
		goto err;
	/* The last holder removes the name as it lets go (urdma_close_xrcd,
	 * urdma_host_sweep), and so does a look without O_CREAT: holding a
	 * file no longer there holds nothing, and a lock we met may have
	 * been one of those (not a holder: no EEXIST for it). */
	if (!xrcd_same(fd, name)) {
		close(fd);
		goto again;
	}
	if (exists && (oflags & O_EXCL)) {
		close(fd);
		return -EEXIST;
	}
	return fd;
err:
	err = -errno;
	close(fd);
	return err;
}

struct ibv_xrcd *urdma_open_xrcd(struct ibv_context *context,
				 struct ibv_xrcd_init_attr *attr)
{
	uint32_t known = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	int oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ?
			     attr->oflags : 0;
	int fd = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) ? attr->fd : -1;
	struct urdma_xrcd *x, *o;
	bool local = false;
	uint64_t id;

	if ((attr->comp_mask & ~known) || (oflags & ~(O_CREAT | O_EXCL)) ||
	    !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD)) {
		errno = EINVAL;
		return NULL;
	}
	if (fd >= 0) {
		struct stat st;

		if (fstat(fd, &st))
			return NULL; /* EBADF */
		id = mix64((uint64_t)st.st_dev * 0x9e3779b97f4a7c15ull ^
			   mix64((uint64_t)st.st_ino));
	} else {
		/* Not tied to a file: this one alone (ibv_open_xrcd(3)). */
		if (!(oflags & O_CREAT)) {
			errno = EINVAL;
			return NULL;
		}
		id = (uint64_t)urdma_random32() << 32 | urdma_random32();
	}
	id |= 1; /* 0 names no domain (a basic SRQ's) */
	x = urdma_zalloc(sizeof(*x));
	if (!x) {
		errno = ENOMEM;
		return NULL;
	}
	x->ibxrcd.context = context;
	x->id = id;
	x->lock_fd = -1;
	/* The flock may wait (another process between its look and its
	 * hold): not under xrc_lock, which receive paths take. */
	pthread_mutex_lock(&xrc_lock);
	list_for_each_entry(o, &xrcds, node)
		local |= o->id == id;
	pthread_mutex_unlock(&xrc_lock);
	if (fd >= 0 && urdma_host_shm_ok()) {
		int r = xrcd_hold(id, oflags, local);

		if (r < 0) {
			urdma_free(x);
			errno = -r;
			return NULL;
		}
		x->lock_fd = r;
	} else if (fd >= 0 && ((!local && !(oflags & O_CREAT)) ||
			       (local && (oflags & O_EXCL)))) {
		/* No host directory: the domain is this process's. */
		urdma_free(x);
		errno = local ? EEXIST : ENOENT;
		return NULL;
	}
	pthread_mutex_lock(&xrc_lock);
	list_add_tail(&x->node, &xrcds);
	pthread_mutex_unlock(&xrc_lock);
	urdma_dbg("xrcd %016llx opened", (unsigned long long)id);
	return &x->ibxrcd;
}

int urdma_close_xrcd(struct ibv_xrcd *ibxrcd)
{
	struct urdma_xrcd *x = to_uxrcd(ibxrcd);

	if (atomic_load(&x->usecnt))
		return EBUSY;
	pthread_mutex_lock(&xrc_lock);
	list_del(&x->node);
	pthread_mutex_unlock(&xrc_lock);
	if (x->lock_fd >= 0)
		urdma_xrcd_let_go(x->lock_fd, x->id);
	urdma_free(x);
	return 0;
}

/* Let go of an xrcd-<id> held (fd), and remove the name when nobody else
 * holds it (an exclusive lock, taken without waiting, says so): a domain
 * leaves nothing behind.  An opener that met the old file sees it gone and
 * starts again (xrcd_hold). */
void urdma_xrcd_let_go(int fd, uint64_t id)
{
	char name[40];

	xrcd_name(name, sizeof(name), id);
	if (!flock(fd, LOCK_EX | LOCK_NB))
		xrcd_unlink(fd, name);
	close(fd);
}

/* ---- XRC SRQs ---- */

int urdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct urdma_srq *srq = to_usrq(ibsrq);

	if (!srq->xrcd)
		return EINVAL; /* only XRC SRQs have one a peer can name */
	*srq_num = srq->srqn;
	return 0;
}

static bool xsrq_taken(uint32_t n)
{
	struct urdma_srq *s;

	list_for_each_entry(s, &xsrqs, xrc_node)
		if (s->srqn == n)
			return true;
	return false;
}

/* srq, being made, is an XRC SRQ of xrcd completing into cq: a number
 * nobody of this user has, published. */
int urdma_xsrq_setup(struct urdma_srq *srq, struct urdma_xrcd *xrcd,
		     struct urdma_cq *cq)
{
	int ret = -EAGAIN;
	uint32_t n = 0;

	srq->cq = cq;
	srq->xrcd = xrcd;
	srq->shm->xrcd_id = xrcd->id;
	atomic_fetch_add(&xrcd->usecnt, 1);
	atomic_fetch_add(&cq->usecnt, 1);
	pthread_mutex_lock(&cq->lock);
	list_add_tail(&srq->cq_node, &cq->xrc_srqs);
	atomic_store(&srq->shm->notify, cq->armed);
	pthread_mutex_unlock(&cq->lock);
	atomic_fetch_add(&cq->srq_qps, 1);
	/* Whole before its record names it: a deliverer may look at once. */
	pthread_mutex_lock(&xrc_lock);
	for (int tries = 0; ret && tries < 64; tries++) {
		n = urdma_random32() & 0xffffff;
		if (!n || xsrq_taken(n))
			continue;
		srq->srqn = n;
		srq->shm->srqn = n;
		atomic_store(&srq->shm->state, URDMA_SSRQ_LIVE);
		ret = urdma_host_rec_publish("srq", n, srq->uctx->ctx_id,
					     srq->va, srq->shm_size);
	}
	if (!ret) {
		list_add_tail(&srq->xrc_node, &xsrqs);
		atomic_fetch_add(&xsrq_gen, 1);
	} else { /* no number: teardown unpublishes nothing */
		list_init(&srq->xrc_node);
		srq->srqn = 0;
	}
	pthread_mutex_unlock(&xrc_lock);
	return ret;
}

/* An XRC SRQ being destroyed: nobody finds it any more, and nobody who
 * found it before is inside (deliverers enter it by busy and then look
 * at state: a Dekker handshake, as a QP's ring has).  false: one stayed
 * inside past XSRQ_WAIT_NS (stopped, or hostile). */
#define XSRQ_WAIT_NS 1000000000ull

bool urdma_xsrq_teardown(struct urdma_srq *srq)
{
	struct urdma_cq *cq = srq->cq;
	uint64_t t0;

	if (srq->srqn)
		urdma_host_rec_unpublish("srq", srq->srqn);
	atomic_store(&srq->shm->state, 0);
	atomic_thread_fence(memory_order_seq_cst);
	t0 = urdma_now_ns();
	while (atomic_load(&srq->shm->busy) &&
	       urdma_now_ns() - t0 < XSRQ_WAIT_NS)
		sched_yield();
	pthread_mutex_lock(&xrc_lock);
	list_del(&srq->xrc_node);
	atomic_fetch_add(&xsrq_gen, 1);
	pthread_mutex_unlock(&xrc_lock);
	/* Under the CQ's lock, where cq_drain_srqs counts itself in the
	 * SRQ's drainers: one that saw it has, before we go on. */
	pthread_mutex_lock(&cq->lock);
	list_del(&srq->cq_node);
	pthread_mutex_unlock(&cq->lock);
	atomic_fetch_sub(&cq->srq_qps, 1);
	atomic_fetch_sub(&cq->usecnt, 1);
	atomic_fetch_sub(&srq->xrcd->usecnt, 1);
	return !atomic_load(&srq->shm->busy);
}

int urdma_xsrq_pds(uint64_t xrcd_id, const struct urdma_context *uctx,
		   uint32_t *pds, int max)
{
	struct urdma_srq *s;
	int n = 0;

	pthread_mutex_lock(&xrc_lock);
	list_for_each_entry(s, &xsrqs, xrc_node) {
		uint32_t pd = to_upd(s->ibsrq.pd)->id;
		int i;

		if (s->xrcd->id != xrcd_id || s->uctx != uctx)
			continue;
		for (i = 0; i < n && pds[i] != pd; i++)
			;
		if (i == n && n < max)
			pds[n++] = pd;
	}
	pthread_mutex_unlock(&xrc_lock);
	return n;
}

/* ---- target QPs and their handles ---- */

/* Targets whose transport receives in ibv_poll_cq (TCP): any at all? */
_Atomic int urdma_xrc_polled;

int urdma_xrc_take_pollers(const struct urdma_context *uctx, uint64_t xrcd_id,
			   const struct urdma_transport_ops **trs,
			   struct urdma_qp **qps, int n, int max)
{
	struct urdma_qp *qp;

	pthread_mutex_lock(&xrc_lock);
	list_for_each_entry(qp, &tgt_qps, xrc_node) {
		const struct urdma_transport_ops *tr;
		int i;

		if (n >= max)
			break;
		if (qp->uctx != uctx || qp->xrcd->id != xrcd_id)
			continue;
		tr = __atomic_load_n(&qp->tr, __ATOMIC_RELAXED);
		for (i = 0; i < n && qps[i] != qp; i++)
			;
		if (!tr || !tr->poll || i < n)
			continue;
		/* Dekker with qp_disconnect, which clears tr, then waits for
		 * the pollers: counted in, then tr looked at again. */
		atomic_fetch_add(&qp->pollers, 1);
		if (__atomic_load_n(&qp->tr, __ATOMIC_SEQ_CST) != tr) {
			atomic_fetch_sub(&qp->pollers, 1);
			continue;
		}
		trs[n] = tr;
		qps[n++] = qp;
	}
	pthread_mutex_unlock(&xrc_lock);
	return n;
}

void urdma_xrc_tgt_add(struct urdma_qp *qp)
{
	atomic_store(&qp->xrc_refs, 1);
	atomic_fetch_add(&qp->xrcd->usecnt, 1);
	pthread_mutex_lock(&xrc_lock);
	list_add_tail(&qp->xrc_node, &tgt_qps);
	pthread_mutex_unlock(&xrc_lock);
}

struct ibv_qp *urdma_open_qp(struct ibv_context *context,
			     struct ibv_qp_open_attr *attr)
{
	uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
			IBV_QP_OPEN_ATTR_TYPE;
	struct urdma_qp *qp, *h = NULL;
	struct urdma_xrcd *x;
	struct urdma_qp_rec rec;
	int e = EINVAL;

	if ((attr->comp_mask & need) != need ||
	    (attr->comp_mask & ~(need | IBV_QP_OPEN_ATTR_CONTEXT)) ||
	    attr->qp_type != IBV_QPT_XRC_RECV || !attr->xrcd ||
	    attr->xrcd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	x = to_uxrcd(attr->xrcd);
	pthread_mutex_lock(&xrc_lock);
	list_for_each_entry(qp, &tgt_qps, xrc_node) {
		if (qp->ibqp.qp_num != attr->qp_num || qp->xrcd->id != x->id)
			continue;
		/* Its engine and events are its context's, which may be
		 * closed: a handle lives in the same one. */
		if (qp->uctx != to_uctx(context)) {
			e = EOPNOTSUPP;
			break;
		}
		h = urdma_zalloc(sizeof(*h));
		if (!h) {
			e = ENOMEM;
			break;
		}
		h->xrc_real = qp;
		atomic_fetch_add(&qp->xrc_refs, 1);
		break;
	}
	pthread_mutex_unlock(&xrc_lock);
	if (!h) {
		/* A QP of this user's that is none of ours: maybe the target
		 * of another process, whose engine runs there. */
		if (e == EINVAL && !urdma_host_qp_find(attr->qp_num, &rec)) {
			bool ours;

			pthread_mutex_lock(&urdma_proc.lock);
			ours = urdma_host_own_mrs(rec.ctx_id) >= 0;
			pthread_mutex_unlock(&urdma_proc.lock);
			if (!ours) {
				urdma_info("qp %#x is another process's: opening "
					   "it is not supported", attr->qp_num);
				e = EOPNOTSUPP;
			}
		}
		errno = e;
		return NULL;
	}
	h->uctx = to_uctx(context);
	h->ibqp.context = context;
	h->ibqp.qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ?
				     attr->qp_context :
				     NULL;
	h->ibqp.qp_num = attr->qp_num;
	h->ibqp.qp_type = IBV_QPT_XRC_RECV;
	h->ibqp.state = h->xrc_real->ibqp.state;
	h->ibqp.handle = h->xrc_real->ibqp.handle;
	pthread_mutex_init(&h->ibqp.mutex, NULL);
	pthread_cond_init(&h->ibqp.cond, NULL);
	return &h->ibqp;
}

/* A handle to an XRC target QP is destroyed: the QP to destroy now (its
 * last handle went), or NULL. */
struct urdma_qp *urdma_xrc_handle_put(struct urdma_qp *h)
{
	struct urdma_qp *qp = h->xrc_real ? h->xrc_real : h;

	if (h != qp) {
		pthread_mutex_destroy(&h->ibqp.mutex);
		urdma_free(h);
	}
	pthread_mutex_lock(&xrc_lock);
	if (atomic_fetch_sub(&qp->xrc_refs, 1) != 1) {
		pthread_mutex_unlock(&xrc_lock);
		return NULL;
	}
	list_del(&qp->xrc_node);
	pthread_mutex_unlock(&xrc_lock);
	atomic_fetch_sub(&qp->xrcd->usecnt, 1);
	return qp;
}
