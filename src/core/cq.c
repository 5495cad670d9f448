// SPDX-License-Identifier: MIT
/*
 * Completion queues and completion channels.
 *
 * A CQ has two sources: a private ring of completions produced in this
 * process (send completions, flushes), and the receive queues of the QPs
 * that use it as recv CQ, whose entries peers complete in shared memory.
 * ibv_poll_cq takes from both, the ring first, then those receive queues,
 * and gives each its turn when the other keeps filling the polls
 * (cq_take).
 *
 * Notification: ibv_req_notify_cq arms the CQ and sets 'notify' in its
 * shared block (core/bell.c); a poll that leaves completions on a CQ so
 * armed fires it (cq_fire_left_locked).  A local producer fires the
 * channel directly; a remote deliverer claims 'notify', sets 'fired' and
 * wakes a thread of ours asleep in ibv_get_cq_event, or our progress
 * thread, which fires the channel (urdma_cq_take_fired).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

struct ibv_comp_channel *urdma_create_comp_channel(struct ibv_context *context)
{
	struct urdma_channel *ch = urdma_zalloc(sizeof(*ch));

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ch.fd < 0) {
		urdma_free(ch);
		return NULL;
	}
	ch->ch.context = context;
	pthread_mutex_init(&ch->lock, NULL);
	urdma_wake_init();
	return &ch->ch;
}

int urdma_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct urdma_channel *ch = to_uchan(channel);

	if (__atomic_load_n(&channel->refcnt, __ATOMIC_ACQUIRE))
		return EBUSY;
	close(channel->fd);
	urdma_free(ch->q);
	pthread_mutex_destroy(&ch->lock);
	urdma_free(ch);
	return 0;
}

static void channel_push(struct urdma_channel *ch, struct urdma_cq *cq)
{
	uint64_t one = 1;

	pthread_mutex_lock(&ch->lock);
	if (ch->count == ch->cap) {
		unsigned int ncap = ch->cap ? ch->cap * 2 : 16;
		struct urdma_cq **nq = urdma_ring_move(ch->q, ch->cap, ch->head,
						       ch->count, ncap, sizeof(*nq));

		if (!nq) {
			pthread_mutex_unlock(&ch->lock);
			urdma_err("out of memory: a completion event is lost");
			return;
		}
		ch->q = nq;
		ch->cap = ncap;
		ch->head = 0;
	}
	ch->q[(ch->head + ch->count++) % ch->cap] = cq;
	pthread_mutex_unlock(&ch->lock);
	if (write(ch->ch.fd, &one, sizeof(one)) < 0)
		urdma_err("completion channel write: %m");
	urdma_wake_local(); /* a thread may sleep for it (wake.c) */
}

/* Completions the CQ holds (its ring, its QPs' receive rings).  Under
 * cq->lock. */
static uint32_t cq_ready_locked(struct urdma_cq *cq)
{
	uint32_t n = cq->tail - cq->head;
	struct urdma_qp *qp;

	if (urdma_bell_on(cq))
		return n + urdma_bell_ready(cq);
	list_for_each_entry(qp, &cq->ring_qps, ring_node)
		n += urdma_rq_ready(qp);
	return n;
}

/* Does the CQ hold a completion: in its ring, its QPs' receive rings,
 * their SRQs or its XRC SRQs?  Under cq->lock. */
static bool cq_holds_locked(struct urdma_cq *cq)
{
	struct urdma_cq_srq *cs;
	struct urdma_srq *srq;
	struct urdma_qp *qp;

	if (cq->head != cq->tail)
		return true;
	if (urdma_bell_on(cq)) {
		if (urdma_bell_holds(cq))
			return true;
	} else {
		list_for_each_entry(qp, &cq->ring_qps, ring_node)
			if (urdma_rq_any(qp))
				return true;
	}
	list_for_each_entry(cs, &cq->srqs, node)
		if (urdma_srq_pending(cs->srq))
			return true;
	list_for_each_entry(srq, &cq->xrc_srqs, cq_node)
		if (urdma_srq_pending(srq))
			return true;
	return false;
}

/* Tell deliverers whether the CQ is armed: in its shared block, and in
 * those of its XRC SRQs.  Under cq->lock. */
static void cq_arm_shared(struct urdma_cq *cq, int mode)
{
	struct urdma_srq *srq;

	atomic_store(&cq->shm->notify,
		     mode ? (uint32_t)mode + cq->arm_no * URDMA_NOTIFY_ARM : 0);
	list_for_each_entry(srq, &cq->xrc_srqs, cq_node)
		atomic_store(&srq->shm->notify, mode);
}

/*
 * Moderation: is the event of an armed CQ held back?  Until mod_count
 * completions are there, or mod_period_ns has passed since the first
 * (the progress thread fires it then: mod_due).  While held, the CQ's
 * notify stays armed, so each receive claims it again: stored before the
 * count, with a fence, as an arm is before a poll (a deliverer that found
 * it claimed published before the count looks).  Errors and a
 * solicited-only arm are not held.  Under cq->lock.
 */
static bool cq_held_locked(struct urdma_cq *cq, bool error)
{
	uint64_t now, due;

	if (error || cq->armed != URDMA_NOTIFY_ANY ||
	    (cq->mod_count <= 1 && !cq->mod_period_ns))
		return false;
	cq_arm_shared(cq, cq->armed);
	atomic_thread_fence(memory_order_seq_cst);
	now = urdma_now_ns();
	due = atomic_load(&cq->mod_due);
	if ((due && now >= due) ||
	    (cq->mod_count && cq_ready_locked(cq) >= cq->mod_count))
		return false;
	if (!due && cq->mod_period_ns) {
		atomic_store(&cq->mod_due, now + cq->mod_period_ns);
		urdma_progress_by(now + cq->mod_period_ns);
	}
	return true;
}

/* Called with cq->lock held; error: an error completion is the cause. */
static void cq_fire_locked_why(struct urdma_cq *cq, bool error)
{
	if (!cq->armed || cq_held_locked(cq, error))
		return;
	atomic_store(&cq->mod_due, 0);
	cq->armed = URDMA_NOTIFY_NONE;
	cq_arm_shared(cq, URDMA_NOTIFY_NONE);
	if (cq->chan)
		channel_push(cq->chan, cq);
}

static void cq_fire_locked(struct urdma_cq *cq)
{
	cq_fire_locked_why(cq, false);
}

/* Progress thread: a held event whose period is over fires. */
void urdma_cq_moderation_due(struct urdma_cq *cq, uint64_t now)
{
	uint64_t due = atomic_load(&cq->mod_due);

	if (!due)
		return;
	if (now < due) { /* a pass asked for earlier brought this one */
		urdma_progress_by(due);
		return;
	}
	pthread_mutex_lock(&cq->lock);
	cq_fire_locked(cq);
	pthread_mutex_unlock(&cq->lock);
}

int urdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr)
{
	struct urdma_cq *cq = to_ucq(ibcq);

	if (attr->attr_mask & ~(uint32_t)IBV_CQ_ATTR_MODERATE)
		return EINVAL;
	if (!attr->attr_mask)
		return 0;
	pthread_mutex_lock(&cq->lock);
	cq->mod_count = attr->moderate.cq_count;
	cq->mod_period_ns = attr->moderate.cq_period * 1000ull;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

int urdma_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
		       void **cq_context)
{
	struct urdma_channel *ch = to_uchan(channel);
	struct urdma_cq *ucq;
	unsigned int queued;
	uint64_t v;
	int fl;

	/* Nothing queued and a blocking fd: sleep where the peers that fire
	 * our CQs wake us themselves (wake.c), until something is. */
	pthread_mutex_lock(&ch->lock);
	queued = ch->count;
	pthread_mutex_unlock(&ch->lock);
	if (!queued && (fl = fcntl(channel->fd, F_GETFL)) >= 0 &&
	    !(fl & O_NONBLOCK) && urdma_wake_sleep(ch) < 0)
		return -1;
	if (read(channel->fd, &v, sizeof(v)) != sizeof(v))
		return -1;
	pthread_mutex_lock(&ch->lock);
	if (!ch->count) {
		pthread_mutex_unlock(&ch->lock);
		errno = EAGAIN;
		return -1;
	}
	ucq = ch->q[ch->head];
	ch->head = (ch->head + 1) % ch->cap;
	ch->count--;
	pthread_mutex_unlock(&ch->lock);
	pthread_mutex_lock(&ucq->ibcq.mutex);
	ucq->events_reported++;
	pthread_mutex_unlock(&ucq->ibcq.mutex);
	*cq = &ucq->ibcq;
	*cq_context = ucq->ibcq.cq_context;
	return 0;
}

void urdma_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* A CQ of at least cqe entries; errno set on failure. */
struct urdma_cq *urdma_cq_new(struct ibv_context *context, int cqe,
			      struct ibv_comp_channel *channel,
			      uint32_t comp_vector)
{
	struct urdma_cq *cq;
	int ret;

	if (cqe < 1 || cqe > URDMA_MAX_CQE ||
	    comp_vector >= (uint32_t)context->num_comp_vectors ||
	    (channel && channel->context != context)) {
		errno = EINVAL;
		return NULL;
	}
	cq = urdma_zalloc(sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->size = roundup_pow2(cqe);
	cq->ring = urdma_zalloc_array(cq->size, sizeof(*cq->ring));
	ret = cq->ring ? urdma_bell_new(cq) : -ENOMEM;
	if (ret) {
		urdma_free(cq->ring);
		urdma_free(cq);
		errno = -ret;
		return NULL;
	}
	pthread_mutex_init(&cq->lock, NULL);
	pthread_mutex_init(&cq->ex_lock, NULL);
	pthread_mutex_init(&cq->ibcq.mutex, NULL);
	pthread_cond_init(&cq->ibcq.cond, NULL);
	list_init(&cq->send_qps);
	list_init(&cq->recv_qps);
	list_init(&cq->ring_qps);
	list_init(&cq->srqs);
	list_init(&cq->carry);
	list_init(&cq->xrc_srqs);
	cq->ibcq.context = context;
	cq->ibcq.channel = channel;
	cq->ibcq.cqe = cq->size;
	if (channel) {
		cq->chan = to_uchan(channel);
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_ACQ_REL);
	}
	cq->watch_epfd = -1;
	urdma_progress_add_cq(cq);
	return cq;
}

struct ibv_cq *urdma_create_cq(struct ibv_context *context, int cqe,
			       void *cq_context,
			       struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct urdma_cq *cq;

	if (comp_vector < 0) {
		errno = EINVAL;
		return NULL;
	}
	cq = urdma_cq_new(context, cqe, channel, comp_vector);
	if (!cq)
		return NULL;
	cq->ibcq.cq_context = cq_context;
	return &cq->ibcq;
}

/* Move the private ring to one of `size` entries (a power of two that holds
 * every entry).  Called with cq->lock held. */
static int cq_ring_resize_locked(struct urdma_cq *cq, uint32_t size)
{
	uint32_t n = cq->tail - cq->head;
	struct urdma_cqe *ring = urdma_ring_move(cq->ring, cq->size, cq->head,
						  n, size, sizeof(*ring));

	if (!ring)
		return ENOMEM;
	cq->ring = ring;
	cq->size = size;
	cq->head = 0;
	cq->tail = n;
	return 0;
}

int urdma_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct urdma_cq *cq = to_ucq(ibcq);
	uint32_t size;
	int ret;

	if (cqe < 1 || cqe > URDMA_MAX_CQE)
		return EINVAL;
	size = roundup_pow2(cqe);
	pthread_mutex_lock(&cq->lock);
	/* Receive completions waiting in the receive rings count too. */
	if (size < cq_ready_locked(cq)) {
		pthread_mutex_unlock(&cq->lock);
		return EINVAL;
	}
	ret = cq_ring_resize_locked(cq, size);
	if (!ret)
		ibcq->cqe = size;
	pthread_mutex_unlock(&cq->lock);
	return ret;
}

int urdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct urdma_context *uctx = to_uctx(ibcq->context);
	struct urdma_cq *cq = to_ucq(ibcq);

	if (atomic_load(&cq->usecnt))
		return EBUSY;
	urdma_async_release(uctx, ibcq, &cq->async_reported,
			    &ibcq->async_events_completed, &ibcq->mutex, &ibcq->cond,
			    &cq->async_gone);
	urdma_progress_del_cq(cq);
	if (cq->chan) {
		struct urdma_channel *ch = cq->chan;

		/* Events fired but never read: drop them. */
		pthread_mutex_lock(&ch->lock);
		for (unsigned int i = 0; i < ch->count;) {
			unsigned int at = (ch->head + i) % ch->cap;

			if (ch->q[at] != cq) {
				i++;
				continue;
			}
			for (unsigned int k = i; k + 1 < ch->count; k++)
				ch->q[(ch->head + k) % ch->cap] =
					ch->q[(ch->head + k + 1) % ch->cap];
			ch->count--;
			uint64_t v;
			if (read(ch->ch.fd, &v, sizeof(v)) < 0)
				break;
		}
		pthread_mutex_unlock(&ch->lock);
		/* As in rdma-core: wait until every reported event is acked. */
		pthread_mutex_lock(&ibcq->mutex);
		while (ibcq->comp_events_completed != cq->events_reported)
			pthread_cond_wait(&ibcq->cond, &ibcq->mutex);
		pthread_mutex_unlock(&ibcq->mutex);
		__atomic_sub_fetch(&ch->ch.refcnt, 1, __ATOMIC_ACQ_REL);
	}
	if (cq->watch_epfd >= 0)
		close(cq->watch_epfd);
	urdma_free(cq->ring);
	urdma_bell_free(cq);
	pthread_mutex_destroy(&cq->lock);
	pthread_mutex_destroy(&cq->ex_lock);
	urdma_free(cq);
	return 0;
}

/*
 * Add a send completion.  No room check is needed before executing a WR:
 * the ring holds at most the outstanding WRs of its QPs (a WR retires only
 * when its completion is polled), and when that is more than the CQ was
 * sized for, the ring grows rather than lose one.  Only if memory runs out
 * is the completion lost, reported as a CQ overrun (IBV_EVENT_CQ_ERR).
 */
void urdma_cq_push(struct urdma_cq *cq, const struct ibv_wc *wc,
		   struct urdma_qp *qp, uint32_t retire)
{
	urdma_cq_push_as(cq, wc, qp, retire, true);
}

void urdma_cq_push_as(struct urdma_cq *cq, const struct ibv_wc *wc,
		      struct urdma_qp *qp, uint32_t retire, bool fire)
{
	struct urdma_cqe *e;

	pthread_mutex_lock(&cq->lock);
	if (cq->tail - cq->head >= cq->size &&
	    cq_ring_resize_locked(cq, cq->size * 2)) {
		struct ibv_async_event ev = { .element.cq = &cq->ibcq,
					      .event_type = IBV_EVENT_CQ_ERR };

		pthread_mutex_unlock(&cq->lock);
		urdma_err("cq overrun: out of memory, a completion is lost");
		urdma_async_event(to_uctx(cq->ibcq.context), &ev);
		return;
	}
	e = &cq->ring[cq->tail & (cq->size - 1)];
	e->wc = *wc;
	e->qp = qp;
	e->retire = retire;
	if (cq->stamp)
		e->ts = urdma_now_ns();
	cq->tail++;
	/* Local completions are never solicited receives; errors always
	 * notify, as the spec asks. */
	if (fire && (cq->armed == URDMA_NOTIFY_ANY ||
		     (cq->armed && wc->status != IBV_WC_SUCCESS)))
		cq_fire_locked_why(cq, wc->status != IBV_WC_SUCCESS);
	pthread_mutex_unlock(&cq->lock);
}

/* A peer delivered into one of our receive queues while armed. */
void urdma_cq_notify(struct urdma_cq *cq)
{
	pthread_mutex_lock(&cq->lock);
	cq_fire_locked(cq);
	pthread_mutex_unlock(&cq->lock);
}

/* An event that comes after its completions were taken into the CQ, so
 * that the program's polls may have taken them meanwhile (srq.c, an XRC
 * SRQ's): fired only if some are left, as an event for nothing wakes
 * perftest -e to an empty poll. */
void urdma_cq_notify_left(struct urdma_cq *cq)
{
	pthread_mutex_lock(&cq->lock);
	if (cq_holds_locked(cq))
		cq_fire_locked(cq);
	pthread_mutex_unlock(&cq->lock);
}

/* A peer claimed the CQ's notify (its block's 'fired', the word it
 * claimed): fire it, if that arm is still the CQ's.  Else the arm fired
 * meanwhile for another cause (a local completion, a poll that left
 * some), and the program took that event and armed again: an event now
 * would be for nothing new (perftest -e reads the unfilled work
 * completion of its empty poll as an error). */
void urdma_cq_take_fired(struct urdma_cq *cq)
{
	_Atomic uint32_t *f = &cq->shm->fired;
	uint32_t w;

	if (!atomic_load_explicit(f, memory_order_relaxed) ||
	    !(w = atomic_exchange(f, 0)))
		return;
	pthread_mutex_lock(&cq->lock);
	if ((w & ~URDMA_NOTIFY_MODE) == cq->arm_no * URDMA_NOTIFY_ARM)
		cq_fire_locked(cq);
	pthread_mutex_unlock(&cq->lock);
}

/* Read once: qp_disconnect clears it under the send CQ's lock only, then
 * passes through the receive CQ's before the transport lets go. */
static void cq_armed_transport(struct urdma_qp *qp)
{
	const struct urdma_transport_ops *tr =
		__atomic_load_n(&qp->tr, __ATOMIC_RELAXED);

	if (tr && tr->armed)
		tr->armed(qp);
}

/* Tell the CQ's QPs whose transports have tr->armed (TCP, UDP) that the
 * application may go to sleep: those it receives for, and those it only
 * completes the sends of (a program that sleeps on its send CQ, as
 * rdma_get_send_comp does, must not leave the stream to its polls).
 * Under cq->lock; no walk when none has. */
static void cq_armed_transports(struct urdma_cq *cq)
{
	struct urdma_qp *qp;

	if (!atomic_load_explicit(&cq->armed_qps, memory_order_relaxed))
		return;
	list_for_each_entry(qp, &cq->recv_qps, rcq_node)
		cq_armed_transport(qp);
	list_for_each_entry(qp, &cq->send_qps, scq_node)
		if (qp->rcq != cq)
			cq_armed_transport(qp);
}

int urdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct urdma_cq *cq = to_ucq(ibcq);
	int mode = solicited_only ? URDMA_NOTIFY_SOLICITED : URDMA_NOTIFY_ANY;

	pthread_mutex_lock(&cq->lock);
	cq->armed = mode;
	cq->arm_no++;
	cq_arm_shared(cq, mode);
	cq_armed_transports(cq);
	/* Pairs with the fence in the deliverer (urdma_dest_notify): armed
	 * before the caller's next poll reads the bits and entries. */
	atomic_thread_fence(memory_order_seq_cst);
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

/* Retry sends that wait for the peer (RNR), at most a few QPs per call. */
static void cq_progress_sends(struct urdma_cq *cq)
{
	struct urdma_qp *qps[8], *qp;
	int n = 0;

	pthread_mutex_lock(&cq->lock);
	list_for_each_entry(qp, &cq->send_qps, scq_node) {
		if (qp->sq_pending && n < 8)
			qps[n++] = qp;
	}
	if (!n)
		atomic_store(&cq->sq_pending, 0);
	pthread_mutex_unlock(&cq->lock);
	for (int i = 0; i < n; i++)
		urdma_qp_progress(qps[i]);
}

/* The transports ibv_poll_cq enters, at most URDMA_CQ_POLLERS a call. */
struct cq_pollers {
	const struct urdma_transport_ops *tr[URDMA_CQ_POLLERS];
	struct urdma_qp *qp[URDMA_CQ_POLLERS];
	enum urdma_poll_hint hint[URDMA_CQ_POLLERS];
	int n;
};

/* Count qp in as a poller of its transport if it has one that polls, and
 * is not in already.  Under cq->lock; qp->tr read once (qp_disconnect
 * clears it under the send CQ's lock only, then waits for the pollers
 * counted here). */
static void cq_take_poller(struct cq_pollers *p, struct urdma_qp *qp,
			   enum urdma_poll_hint hint)
{
	const struct urdma_transport_ops *tr =
		__atomic_load_n(&qp->tr, __ATOMIC_RELAXED);

	if (p->n >= URDMA_CQ_POLLERS || !tr || !tr->poll)
		return;
	for (int i = 0; i < p->n; i++)
		if (p->qp[i] == qp)
			return;
	atomic_fetch_add(&qp->pollers, 1);
	p->tr[p->n] = tr;
	p->qp[p->n] = qp;
	p->hint[p->n++] = hint;
}

/* In the turn of the CQ's lists: qp, with what the readiness set said. */
static void cq_take_turn(struct urdma_cq *cq, struct cq_pollers *p,
			 struct urdma_qp *qp, bool asked)
{
	cq_take_poller(p, qp,
		       asked && urdma_cq_watches(cq, qp) ? URDMA_POLL_IDLE :
							   URDMA_POLL_LOOK);
}

/* The CQ's QPs whose transports receive in software (TCP), counted in as
 * pollers: first those whose sockets the CQ's readiness set names (half
 * the batch at most: cq_watch.c), then the
 * lists' turn, URDMA_CQ_POLLERS at most, and the next call starts after
 * them (the lists turn), so that each QP's stream is taken in turn and a CQ
 * of thousands of QPs costs no walk of them all per poll.  A watched QP the
 * set did not name is entered all the same (IDLE: no look at its socket):
 * its stream's upkeep on a poll (held answers, parking) is the
 * transport's.  Under cq->lock.  Returns whether an XRC target is among
 * them. */
static bool cq_take_pollers(struct urdma_cq *cq, struct cq_pollers *p)
{
	struct urdma_qp *ready[URDMA_CQ_POLLERS], *qp;
	struct urdma_srq *srq;
	bool asked = cq->watch_epfd >= 0;
	int m, k = asked ? urdma_cq_ready(cq, ready, URDMA_CQ_POLLERS / 2) : 0;

	for (int i = 0; i < k; i++)
		cq_take_poller(p, ready[i], URDMA_POLL_READY);
	list_for_each_entry(qp, &cq->recv_qps, rcq_node) {
		if (p->n == URDMA_CQ_POLLERS) {
			list_rotate_to(&cq->recv_qps, &qp->rcq_node);
			break;
		}
		cq_take_turn(cq, p, qp, asked);
	}
	list_for_each_entry(qp, &cq->send_qps, scq_node) {
		if (p->n == URDMA_CQ_POLLERS) {
			list_rotate_to(&cq->send_qps, &qp->scq_node);
			break;
		}
		if (qp->rcq != cq)
			cq_take_turn(cq, p, qp, asked);
	}
	/* The targets that feed the CQ's XRC SRQs: what they receive goes
	 * to an SRQ, to be drained again (urdma_cq_poll). */
	m = p->n;
	if (atomic_load_explicit(&urdma_xrc_polled, memory_order_relaxed))
		list_for_each_entry(srq, &cq->xrc_srqs, cq_node)
			p->n = urdma_xrc_take_pollers(
				to_uctx(cq->ibcq.context), srq->xrcd->id, p->tr,
				p->qp, p->n, URDMA_CQ_POLLERS);
	for (int i = m; i < p->n; i++)
		p->hint[i] = URDMA_POLL_LOOK;
	return p->n > m;
}

/* The ring's completions, at most num, with their times in ts if it is
 * not NULL.  Under the CQ lock. */
static int cq_take_ring(struct urdma_cq *cq, int num, struct ibv_wc *wc,
			uint64_t *ts)
{
	int n = 0;

	while (n < num && cq->head != cq->tail) {
		struct urdma_cqe *e = &cq->ring[cq->head & (cq->size - 1)];

		if (ts)
			ts[n] = e->ts;
		wc[n++] = e->wc;
		if (e->retire)
			atomic_fetch_add_explicit(&e->qp->sq_retired, e->retire,
						  memory_order_release);
		cq->head++;
	}
	return n;
}

/* The receive QPs' completions, at most num, each QP's in order, with the
 * time they are taken in ts if it is not NULL.  A call that fills num at
 * a QP makes the QP after it the first of the next call: one QP whose
 * ring never empties (a sender faster than the poller) does not keep the
 * others' from being taken.  Under the CQ lock. */
static int cq_harvest(struct urdma_cq *cq, int num, struct ibv_wc *wc,
		      uint64_t *ts)
{
	struct urdma_qp *qp;
	int n = 0;

	if (urdma_bell_on(cq))
		n = urdma_bell_harvest(cq, num, wc);
	else
		list_for_each_entry(qp, &cq->ring_qps, ring_node) {
			n += urdma_qp_harvest(qp, wc + n, num - n);
			if (n == num) {
				struct list_head *next = qp->ring_node.next;

				if (next == &cq->ring_qps)
					next = next->next;
				if (next != cq->ring_qps.next)
					list_rotate_to(&cq->ring_qps, next);
				break;
			}
		}
	if (ts && n) {
		uint64_t now = urdma_now_ns();

		for (int i = 0; i < n; i++)
			ts[i] = now;
	}
	return n;
}

/* A poll that filled its request on a CQ armed for any completion: if
 * completions are left, the CQ fires.  A program that takes an event,
 * re-arms, then polls once (qperf: at most 1,024 from a CQ of sends and
 * receives that holds up to twice that) otherwise sleeps on what its poll
 * left, and its peer on it.  Only what is left after such a poll fires:
 * perftest's -e takes an event, re-arms and polls one completion, and an
 * event for that one, already taken, would wake it to nothing.  Under
 * cq->lock. */
static void cq_fire_left_locked(struct urdma_cq *cq)
{
	if (cq->armed == URDMA_NOTIFY_ANY && cq_holds_locked(cq))
		cq_fire_locked(cq);
}

/* Completions ready on the CQ, at most num (ts as above).  The ring goes
 * first; but after a call that the ring alone filled, it has at most half
 * of this one before the receive QPs have theirs (and the rest after).
 * Taking the ring always first kept receives from ever being taken while
 * each poll found num completions there (qperf's uc_bi_bw: a UC Send
 * completes at once, both sides send and receive on one CQ, and no
 * receive came out of 600,000 polls).  Under the CQ lock. */
static int cq_take(struct urdma_cq *cq, int num, struct ibv_wc *wc,
		   uint64_t *ts)
{
	int first = cq->recv_turn ? num / 2 : num, n;

	cq->recv_turn = false;
	n = cq_take_ring(cq, first, wc, ts);
	if (n == num) {
		cq->recv_turn = !list_empty(&cq->ring_qps);
		return n;
	}
	n += cq_harvest(cq, num - n, wc + n, ts ? ts + n : NULL);
	if (n < num && first < num)
		n += cq_take_ring(cq, num - n, wc + n, ts ? ts + n : NULL);
	return n;
}

/* Take what the SRQs of the CQ's receive QPs hold into their CQs: up to
 * CQ_SRQS of them a call, the lists turned by one each call, so that every
 * SRQ of a CQ that more feed gets its turn.  Outside cq->lock:
 * urdma_srq_drain takes CQ locks inside its own. */
#define CQ_SRQS 32

/* Move the first entry of list h to its end. */
static void turn_list(struct list_head *h)
{
	if (!list_empty(h)) {
		struct list_head *first = h->next;

		list_del(first);
		list_add_tail(first, h);
	}
}

static void cq_drain_srqs(struct urdma_cq *cq)
{
	struct urdma_srq *srqs[CQ_SRQS], *srq;
	struct urdma_cq_srq *cs;
	int n = 0;

	pthread_mutex_lock(&cq->lock);
	/* XRC SRQs complete into their own CQ: up to half the batch. */
	list_for_each_entry(srq, &cq->xrc_srqs, cq_node) {
		if (n == CQ_SRQS / 2)
			break;
		if (!urdma_srq_pending(srq))
			continue;
		atomic_fetch_add(&srq->drainers, 1);
		srqs[n++] = srq;
	}
	turn_list(&cq->xrc_srqs);
	list_for_each_entry(cs, &cq->srqs, node) {
		if (n == CQ_SRQS)
			break;
		/* Nothing claimed: no lock of its to take (the common empty
		 * poll of a spinning application). */
		if (!urdma_srq_pending(cs->srq))
			continue;
		/* Counted under cq->lock: urdma_destroy_srq waits. */
		atomic_fetch_add(&cs->srq->drainers, 1);
		srqs[n++] = cs->srq;
	}
	turn_list(&cq->srqs);
	pthread_mutex_unlock(&cq->lock);
	for (int i = 0; i < n; i++) {
		urdma_srq_drain(srqs[i]);
		atomic_fetch_sub(&srqs[i]->drainers, 1);
	}
}

int urdma_cq_poll(struct urdma_cq *cq, int num, struct ibv_wc *wc,
		  uint64_t *ts)
{
	struct cq_pollers p = { .n = 0 };
	bool xrc = false;
	int n;

	if (atomic_load_explicit(&cq->sq_pending, memory_order_relaxed))
		cq_progress_sends(cq);
	if (atomic_load_explicit(&cq->srq_qps, memory_order_relaxed))
		cq_drain_srqs(cq);
	/* What is ready goes first: the transports' receive paths (a system
	 * call each over TCP) run only when it does not fill the request. */
	pthread_mutex_lock(&cq->lock);
	n = cq_take(cq, num, wc, ts);
	if (n < num &&
	    (atomic_load_explicit(&cq->polled_qps, memory_order_relaxed) ||
	     (!list_empty(&cq->xrc_srqs) &&
	      atomic_load_explicit(&urdma_xrc_polled, memory_order_relaxed))))
		xrc = cq_take_pollers(cq, &p);
	if (n == num && num)
		cq_fire_left_locked(cq);
	pthread_mutex_unlock(&cq->lock);
	if (!p.n)
		return n;
	/* Outside cq->lock: the receive path completes WRs into CQs.  What
	 * has arrived is taken here, so a polling application needs no
	 * thread switch. */
	for (int i = 0; i < p.n; i++) {
		p.tr[i]->poll(p.qp[i], p.hint[i]);
		atomic_fetch_sub(&p.qp[i]->pollers, 1);
	}
	if (xrc)
		cq_drain_srqs(cq);
	pthread_mutex_lock(&cq->lock);
	n += cq_take(cq, num - n, wc + n, ts ? ts + n : NULL);
	if (n == num)
		cq_fire_left_locked(cq);
	pthread_mutex_unlock(&cq->lock);
	return n;
}

int urdma_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	if (num < 0)
		return -1;
	return urdma_cq_poll(to_ucq(ibcq), num, wc, NULL);
}
