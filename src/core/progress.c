// SPDX-License-Identifier: MIT
/*
 * The progress thread: one per process, asleep in epoll_wait unless there
 * is work.  It is never on the data path of a polling application; it does
 * what nobody else would do while the application sleeps or computes:
 *  - peers wake it (a byte on their connection to the context's socket,
 *    core/host.c) to fire armed CQs, to put a QP in error, or because a
 *    receive it waited for was posted;
 *  - a peer's connection hangs up when the peer goes: its QPs go to error;
 *  - with send WRs waiting (RNR, peer not ready), a short timer retries
 *    them and enforces the retry limits;
 *  - a transport asks for a pass by a given time (urdma_progress_by): to
 *    send answers held back for a message that did not come, to look at
 *    a stream whose application stopped polling;
 *  - every 200 ms it checks that registered pages are still mapped.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/log.h"

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct list_head ctxs = LIST_HEAD_INIT(ctxs);
static int epfd = -1, kickfd = -1;
static pthread_t thread;
static bool running;
static _Atomic bool stop;
/* When the thread's sleep ends (urdma_now_ns; 0: awake, or kicked), and
 * the earliest pass asked for (urdma_progress_by; 0: none). */
static _Atomic uint64_t sleep_end, due;

#define IDLE_NS 200000000ull
#define PENDING_NS 2000000ull
#define SWEEP_GAP 4 /* the pass over every QP: its length times this apart */
/*
 * CQs that peers fired (their blocks' 'fired', named by the wake block's
 * 'fired') are fired from here at once, not in the pass over every QP,
 * which is put off with many QPs (4,096 behind a CQ: a Send to a receiver
 * asleep on its channel took 560 us instead of 41); but at most every
 * FIRE_GAP_NS: in a stream the slower hop gathers more completions per
 * event (8 B ib_send_bw -e over shm, medians of 6 runs: 5.6 Mmsg/s fired
 * at once, 5.7 10 us apart, 5.9 20 us apart, 5.8-6.0 when the pass over
 * 2 QPs fired them).  The pass fires them too (a peer that marked a CQ
 * but not the wake block).
 */
#define FIRE_GAP_NS 20000ull

/* How long until the CQs peers marked fire: 0 now, UINT64_MAX if none
 * is marked. */
static uint64_t fire_wait_ns(uint64_t last_fire)
{
	uint64_t now;

	if (!urdma_wake_fired())
		return UINT64_MAX;
	now = urdma_now_ns();
	return now - last_fire >= FIRE_GAP_NS ? 0 :
						last_fire + FIRE_GAP_NS - now;
}
/* Every CQ of the process, under cqs_lock alone: firing what peers marked
 * waits for no pass over the QPs (which holds ctx_lock and each context's
 * lock, about a millisecond with 8,192 QPs).  Under cqs_lock only a CQ's
 * lock is taken (then its channel's); no verbs lock is held around it
 * (rdma_cm's cma_lock may be: it makes and destroys CQs under it). */
static pthread_mutex_t cqs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct list_head cqs = LIST_HEAD_INIT(cqs);

void urdma_progress_add_cq(struct urdma_cq *cq)
{
	pthread_mutex_lock(&cqs_lock);
	list_add_tail(&cq->node, &cqs);
	pthread_mutex_unlock(&cqs_lock);
}

void urdma_progress_del_cq(struct urdma_cq *cq)
{
	pthread_mutex_lock(&cqs_lock);
	list_del(&cq->node);
	pthread_mutex_unlock(&cqs_lock);
}

/* Watchers to release between batches (urdma_progress_retire). */
static pthread_mutex_t retire_lock = PTHREAD_MUTEX_INITIALIZER;
static struct urdma_watcher *retired;

#define KIND_BITS 3ull

void urdma_progress_kick(void)
{
	uint64_t one = 1;

	if (kickfd >= 0 && write(kickfd, &one, sizeof(one)) < 0)
		urdma_dbg("kick: %m");
}

/* A pass by time t (urdma_now_ns) at the latest.  Costs a system call
 * only when the thread sleeps past t.  The thread publishes sleep_end
 * before it reads due, and we the reverse: either it sees t, or we see
 * its sleep and wake it.  Only the earliest time asked for is kept: the
 * pass it brings may come before t, and then the caller's hook in that
 * pass (a transport's maintain or tick, urdma_cq_moderation_due) must ask
 * again for what is still ahead.  One that did not left a held answer to
 * the 200 ms idle pass (conf_two_sided tcp_held_answer_goes). */
void urdma_progress_by(uint64_t t)
{
	uint64_t d = atomic_load(&due);

	while ((!d || t < d) && !atomic_compare_exchange_weak(&due, &d, t))
		;
	if (atomic_load(&sleep_end) > t && atomic_exchange(&sleep_end, 0))
		urdma_progress_kick();
}

int urdma_progress_watch(int fd, int kind, void *obj)
{
	return urdma_progress_watch_events(fd, EPOLLIN, kind, obj, false);
}

/* Watch fd for events; with modify, change an existing watch. */
int urdma_progress_watch_events(int fd, uint32_t events, int kind, void *obj,
				bool modify)
{
	struct epoll_event ev = { .events = events,
				  .data.u64 = (uintptr_t)obj | kind };

	if (epfd < 0)
		return -EINVAL;
	return epoll_ctl(epfd, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) ?
		       -errno :
		       0;
}

void urdma_progress_unwatch(int fd)
{
	if (epfd >= 0)
		epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
}

void urdma_progress_retire(int fd, struct urdma_watcher *w)
{
	if (fd >= 0)
		urdma_progress_unwatch(fd);
	pthread_mutex_lock(&retire_lock);
	w->next_retired = retired;
	retired = w;
	pthread_mutex_unlock(&retire_lock);
	urdma_progress_kick();
}

/* Between batches (or with the thread gone): no fetched event is left
 * that could name a retired watcher. */
static void release_retired(void)
{
	struct urdma_watcher *w;

	pthread_mutex_lock(&retire_lock);
	w = retired;
	retired = NULL;
	pthread_mutex_unlock(&retire_lock);
	while (w) {
		struct urdma_watcher *next = w->next_retired;

		w->release(w);
		w = next;
	}
}

/* fn on every QP of every context, under their locks. */
static void each_qp(void (*fn)(struct urdma_qp *qp))
{
	struct urdma_context *uctx;
	struct urdma_qp *qp;

	pthread_mutex_lock(&ctx_lock);
	list_for_each_entry(uctx, &ctxs, node) {
		pthread_mutex_lock(&uctx->lock);
		list_for_each_entry(qp, &uctx->qps, ctx_node)
			fn(qp);
		pthread_mutex_unlock(&uctx->lock);
	}
	pthread_mutex_unlock(&ctx_lock);
}

/* Fire the CQs peers marked for firing (their blocks' 'fired'): a walk
 * of the CQs, not of the QPs (wake.c, and after each batch of events). */
void urdma_progress_take_fired(void)
{
	struct urdma_cq *cq;

	pthread_mutex_lock(&cqs_lock);
	list_for_each_entry(cq, &cqs, node)
		urdma_cq_take_fired(cq);
	pthread_mutex_unlock(&cqs_lock);
}

/* One pass over every QP; returns whether sends are still waiting. */
static bool maintain_all(bool check_mrs)
{
	struct urdma_context *uctx;
	struct urdma_srq *srq;
	struct urdma_cq *cq;
	struct urdma_qp *qp;
	uint64_t now = urdma_now_ns();
	bool pending = false;

	for (int i = 0; urdma_transports[i]; i++)
		if (urdma_transports[i]->tick)
			urdma_transports[i]->tick();
	for (int i = 0; urdma_ud_transports[i]; i++)
		if (urdma_ud_transports[i]->tick)
			urdma_ud_transports[i]->tick();
	pthread_mutex_lock(&ctx_lock);
	list_for_each_entry(uctx, &ctxs, node) {
		pthread_mutex_lock(&uctx->lock);
		list_for_each_entry(qp, &uctx->qps, ctx_node) {
			pending |= urdma_qp_maintain(qp);
		}
		list_for_each_entry(srq, &uctx->srqs, ctx_node)
			urdma_srq_maintain(srq);
		pthread_mutex_unlock(&uctx->lock);
		if (check_mrs)
			urdma_mrs_check(uctx);
	}
	pthread_mutex_unlock(&ctx_lock);
	pthread_mutex_lock(&cqs_lock);
	list_for_each_entry(cq, &cqs, node) {
		urdma_cq_take_fired(cq);
		urdma_cq_moderation_due(cq, now);
		urdma_bell_tick(cq, now);
	}
	pthread_mutex_unlock(&cqs_lock);
	return pending;
}

/* Sleep until an event, the pass asked for, or in any case ns. */
static int progress_sleep(struct epoll_event *evs, int max, uint64_t ns)
{
	uint64_t now = urdma_now_ns(), end = now + ns, d;
	struct timespec ts;
	int n;

	atomic_store(&sleep_end, end);
	d = atomic_load(&due);
	if (d && d < end) {
		end = d > now ? d : now;
		atomic_store(&sleep_end, end);
	}
	ts.tv_sec = (end - now) / 1000000000ull;
	ts.tv_nsec = (end - now) % 1000000000ull;
	n = epoll_pwait2(epfd, evs, max, &ts, NULL);
	urdma_stop_point();
	atomic_store(&sleep_end, 0);
	/* The pass that follows is the one asked for by now. */
	d = atomic_load(&due);
	if (d && d <= urdma_now_ns())
		atomic_compare_exchange_strong(&due, &d, 0);
	return n;
}

static __thread bool on_progress_thread;

bool urdma_progress_self(void)
{
	return on_progress_thread;
}

static void *progress_main(void *arg)
{
	/* The last pass over every QP: when it ended; how long the last
	 * two took (the shorter counts: one the thread was preempted in is
	 * no measure); owed: one was put off (SWEEP_GAP). */
	uint64_t last_mr_check = 0, last_sweep = 0, sweep_ns[2] = { 0, 0 };
	uint64_t last_fire = 0; /* when it last fired CQs peers marked */
	bool pending = false, owed = false;

	on_progress_thread = true;
	urdma_stop_coop();

	while (!atomic_load(&stop)) {
		struct epoll_event evs[16];
		uint64_t now, fire_wait, wait = pending ? PENDING_NS : IDLE_NS;
		uint64_t gap = SWEEP_GAP * (sweep_ns[0] < sweep_ns[1] ?
						    sweep_ns[0] : sweep_ns[1]);

		if (gap > PENDING_NS) /* a pass that waited for a lock */
			gap = PENDING_NS;
		int n;

		if (owed) { /* sleep no longer than the pass put off */
			now = urdma_now_ns();
			if (now - last_sweep >= gap)
				wait = 0;
			else if (last_sweep + gap - now < wait)
				wait = last_sweep + gap - now;
		}
		fire_wait = fire_wait_ns(last_fire); /* nor than a fire */
		if (fire_wait < wait)
			wait = fire_wait;
		n = progress_sleep(evs, 16, wait);

		for (int i = 0; i < n; i++) {
			uint64_t d = evs[i].data.u64;
			void *obj = (void *)(uintptr_t)(d & ~KIND_BITS);

			if (!obj) { /* the kick eventfd */
				uint64_t v;
				if (read(kickfd, &v, sizeof(v)) < 0)
					continue;
			} else {
				struct urdma_watcher *w = obj;

				w->fn(w, evs[i].events);
			}
		}
		release_retired();
		now = urdma_now_ns();
		if (!fire_wait_ns(last_fire)) {
			last_fire = now;
			urdma_wake_take_fired();
		}
		/* The pass over every QP, after each batch of events, costs
		 * O(QPs): it runs no sooner than SWEEP_GAP times its own
		 * length after the last, so that it takes at most a fifth of
		 * this thread however many QPs there are (thousands of TCP
		 * streams coming up, an event and a kick each, made it
		 * quadratic), and no later than PENDING_NS after it.  With few
		 * QPs a pass is a microsecond or two: it runs at once, as
		 * always. */
		owed = true;
		if (now - last_sweep < gap)
			continue;
		owed = false;
		pending = maintain_all(now - last_mr_check > 200000000ull);
		if (now - last_mr_check > 200000000ull)
			last_mr_check = now;
		last_sweep = urdma_now_ns();
		sweep_ns[1] = sweep_ns[0];
		sweep_ns[0] = last_sweep - now;
	}
	return NULL;
}

/* The connection manager's way to a QP that the application may have
 * destroyed (core/cm_link.h): looked up under the locks that closing a
 * context and destroying a QP take, then moved to ERR as maintain_all()
 * may move a QP there, under the same locks. */
int urdma_qp_error_if_live(struct ibv_context *ctx, struct ibv_qp *ibqp,
			   uint32_t handle)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct urdma_context *uctx;
	struct urdma_qp *qp;
	int ret = ENOENT;

	pthread_mutex_lock(&ctx_lock);
	list_for_each_entry(uctx, &ctxs, node) {
		if (&uctx->vctx.context != ctx)
			continue;
		pthread_mutex_lock(&uctx->lock);
		list_for_each_entry(qp, &uctx->qps, ctx_node) {
			if (&qp->ibqp == ibqp && ibqp->handle == handle) {
				ret = urdma_modify_qp(ibqp, &a, IBV_QP_STATE);
				break;
			}
		}
		pthread_mutex_unlock(&uctx->lock);
		break;
	}
	pthread_mutex_unlock(&ctx_lock);
	return ret;
}

/* The application turned to the connection manager (core/cm_link.h):
 * what each QP holds back for its next message goes now, from this thread,
 * as waking the progress thread can take milliseconds on a busy host. */
void urdma_release_held(void)
{
	if (atomic_load_explicit(&urdma_held_qps, memory_order_relaxed))
		each_qp(urdma_qp_release);
}

int urdma_progress_add_ctx(struct urdma_context *uctx)
{
	int ret = 0;

	pthread_mutex_lock(&ctx_lock);
	if (!running) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };

		epfd = epoll_create1(EPOLL_CLOEXEC);
		kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (epfd < 0 || kickfd < 0 ||
		    epoll_ctl(epfd, EPOLL_CTL_ADD, kickfd, &ev)) {
			ret = -errno;
			goto out;
		}
		atomic_store(&stop, false);
		ret = -pthread_create(&thread, NULL, progress_main, NULL);
		if (ret)
			goto out;
		running = true;
	}
	list_add_tail(&uctx->node, &ctxs);
	ret = urdma_host_ctx_start(uctx);
	if (ret)
		list_del(&uctx->node);
out:
	if (ret && !running) {
		if (epfd >= 0)
			close(epfd);
		if (kickfd >= 0)
			close(kickfd);
		epfd = kickfd = -1;
	}
	pthread_mutex_unlock(&ctx_lock);
	return ret;
}

void urdma_progress_del_ctx(struct urdma_context *uctx)
{
	bool last;

	pthread_mutex_lock(&ctx_lock);
	list_del(&uctx->node);
	last = list_empty(&ctxs) && running;
	pthread_mutex_unlock(&ctx_lock);
	if (!last)
		return;
	atomic_store(&stop, true);
	urdma_progress_kick();
	pthread_join(thread, NULL);
	release_retired();
	pthread_mutex_lock(&ctx_lock);
	running = false;
	close(epfd);
	close(kickfd);
	epfd = kickfd = -1;
	pthread_mutex_unlock(&ctx_lock);
}

/* In a forked child the thread does not exist. */
static void progress_atfork_child(void)
{
	running = false;
	epfd = kickfd = -1;
	atomic_store(&sleep_end, 0);
	atomic_store(&due, 0);
	list_init(&ctxs);
	pthread_mutex_init(&ctx_lock, NULL);
	/* The parent's CQs are not ours: their blocks went with the arena
	 * (urdma_arena_atfork_child), and cqs_lock may have been held. */
	list_init(&cqs);
	pthread_mutex_init(&cqs_lock, NULL);
}

__attribute__((constructor)) static void progress_init(void)
{
	pthread_atfork(NULL, NULL, progress_atfork_child);
}
