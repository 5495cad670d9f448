// SPDX-License-Identifier: MIT
/*
 * Waking a thread asleep in ibv_get_cq_event straight from the peer that
 * completed its receive, without our progress thread in between.
 *
 * Before, a peer that delivered into a QP whose CQ was armed woke our
 * progress thread (a byte on our context's socket), which fired the CQ
 * into its channel's eventfd, which woke the application: two wake-ups,
 * each some 15 us on a VM.  Now a thread that is about to block in
 * ibv_get_cq_event (the channel fd blocking, nothing queued) sleeps on a
 * futex in the process's wake block (shared.h, struct urdma_shm_wake),
 * which every QP's block names; the peer bumps it and wakes the thread,
 * which fires the CQs its peers marked (their blocks' 'fired') itself.
 * With nobody asleep there, peers wake the progress thread as before, so
 * programs that poll() or epoll the channel fd are served the old way.
 *
 * The rules (each a Dekker pair, all RMWs and seq_cst):
 *  - a sleeper counts itself in (sleepers: ours, and the block's hint for
 *    peers), reads seq, takes 'fired' and fires what it names, looks at
 *    its channel, and only then waits for seq to move;
 *  - a peer sets 'fired', then reads the hint: asleep (for WAKE_DIRECT_NS
 *    at least), it bumps seq and, if one waits in the kernel, wakes it;
 *    not, it wakes the progress thread;
 *  - our own firing (channel_push: a local completion, the progress
 *    thread) queues the event, then reads our count and bumps seq;
 *  - a sleeper leaving counts itself out, then takes 'fired' once more: a
 *    peer that saw it asleep did not wake the progress thread.
 * The block is peers' to write: a wrong hint costs a wake-up or leaves a
 * fire to the progress thread's next pass (a peer can always withhold its
 * wake-ups); whether we wake our sleepers goes by our own count, but the
 * futex word is shared, so a peer that rewinds seq can hold a sleeper
 * until the wait's timeout: a lost wake-up costs WAKE_CHECK_NS, not a
 * hang.  A peer that keeps setting 'fired' costs us CPU: each wake-up
 * walks the process's CQs.
 *
 * Cancellation: read() on the eventfd was a cancellation point, and rping
 * cancels its CQ thread there.  The futex wait is made one (asynchronous
 * cancellation around the bare system call, the counts undone by a
 * cleanup handler); everything else here runs with cancellation off, as
 * it writes eventfds under locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/clock.h"
#include "util/log.h"

#define WAKE_CHECK_NS 200000000ull
/* A thread asleep for less than this is woken by the progress thread.
 * It went to sleep just before the message: a stream, where the slower
 * hop gathers more completions per event.  Interleaved runs, 8 B and
 * 64 KiB ib_send_bw -e over shm: woken directly always, 25 % slower than
 * before (4-6 Mmsg/s, 23-29 GB/s); with this, 34-44 GB/s and about what
 * it was at 8 B.  ib_send_lat -e: 30-34 us before, 22-23 with this,
 * 21-28 without. */
#define WAKE_DIRECT_NS 5000ull

static pthread_mutex_t wake_once = PTHREAD_MUTEX_INITIALIZER;
static struct urdma_shm_wake *_Atomic wake_blk;
static _Atomic uint64_t wake_va;
static _Atomic uint32_t sleepers; /* ours: threads in urdma_wake_sleep */
static __thread bool sleeping;	   /* this thread is one of them */

static long futex(_Atomic uint32_t *w, int op, uint32_t val,
		  const struct timespec *ts)
{
	return syscall(SYS_futex, w, op, val, ts, NULL, 0);
}

uint64_t urdma_wake_va(void)
{
	return atomic_load(&wake_va);
}

/* The process's wake block, made on first use (a completion channel's
 * creation); NULL if it can't be (then peers wake the progress thread). */
void urdma_wake_init(void)
{
	struct urdma_shm_wake *w;
	uint64_t va;

	if (atomic_load(&wake_blk))
		return;
	pthread_mutex_lock(&wake_once);
	if (!atomic_load(&wake_blk)) {
		w = urdma_arena_alloc(sizeof(*w), &va);
		if (w) {
			w->magic = URDMA_WAKE_MAGIC;
			w->version = URDMA_SHM_VERSION;
			atomic_store(&wake_va, va);
			atomic_store(&wake_blk, w);
		} else {
			urdma_dbg("no wake block: %m");
		}
	}
	pthread_mutex_unlock(&wake_once);
}

/* A forked child's arena is gone (urdma_arena_atfork_child): so is the
 * block, with the parent's sleepers. */
void urdma_wake_atfork_child(void)
{
	atomic_store(&wake_blk, NULL);
	atomic_store(&wake_va, 0);
	atomic_store(&sleepers, 0);
	pthread_mutex_init(&wake_once, NULL);
}

/* The wake block at va in peer p's memory, checked, or NULL. */
struct urdma_shm_wake *urdma_wake_map(struct urdma_peer *p, uint64_t va)
{
	return urdma_peer_block(p, va, sizeof(struct urdma_shm_wake),
				URDMA_WAKE_MAGIC);
}

/* A peer fired one of w's owner's CQs (its block's 'fired' is set): wake a
 * thread of it asleep in ibv_get_cq_event.  False if none is (by the
 * hint): the caller wakes its progress thread. */
bool urdma_wake_owner(struct urdma_shm_wake *w)
{
	if (!w)
		return false;
	atomic_store(&w->fired, 1);
	if (!atomic_load(&w->sleepers))
		return false;
	if (urdma_now_ns() - atomic_load(&w->since) < WAKE_DIRECT_NS)
		return false;
	atomic_fetch_add(&w->seq, 1);
	if (atomic_load(&w->waiting))
		futex(&w->seq, FUTEX_WAKE, INT_MAX, NULL);
	return true;
}

/* We queued an event on a channel (channel_push, after the queue's
 * lock): a thread asleep in urdma_wake_sleep may wait for it. */
void urdma_wake_local(void)
{
	struct urdma_shm_wake *w = atomic_load(&wake_blk);

	atomic_thread_fence(memory_order_seq_cst);
	/* (a sleeper that fires, as it takes 'fired', is awake) */
	if (!w || atomic_load(&sleepers) == (sleeping ? 1u : 0u))
		return;
	atomic_fetch_add(&w->seq, 1);
	futex(&w->seq, FUTEX_WAKE, INT_MAX, NULL); /* (ours: not the hint) */
}

/* A sleeper counts itself out (urdma_wake_sleep, sleep_cancelled). */
static void sleep_out(struct urdma_shm_wake *w)
{
	atomic_fetch_sub(&w->sleepers, 1);
	atomic_fetch_sub(&sleepers, 1);
	sleeping = false;
}

/* A sleeper cancelled in its futex wait. */
static void sleep_cancelled(void *arg)
{
	struct urdma_shm_wake *w = arg;

	atomic_fetch_sub(&w->waiting, 1);
	sleep_out(w);
	/* what a peer left to us goes to the progress thread */
	if (atomic_exchange(&w->fired, 0))
		urdma_progress_kick();
}

/* The futex wait for seq to leave 'seq', cancellable if the caller was;
 * -1 with errno, as the system call. */
static int sleep_wait(struct urdma_shm_wake *w, uint32_t seq, int state)
{
	struct timespec ts = { 0, WAKE_CHECK_NS };
	int type, ret;

	pthread_cleanup_push(sleep_cancelled, w);
	if (state == PTHREAD_CANCEL_ENABLE) {
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, &type);
	}
	ret = (int)futex(&w->seq, FUTEX_WAIT, seq, &ts);
	if (state == PTHREAD_CANCEL_ENABLE) {
		int err = errno;

		pthread_setcanceltype(type, NULL);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		errno = err;
	}
	pthread_cleanup_pop(0);
	return ret;
}

static bool fired_take(struct urdma_shm_wake *w)
{
	if (!atomic_load(&w->fired) || !atomic_exchange(&w->fired, 0))
		return false;
	urdma_progress_take_fired();
	return true;
}

bool urdma_wake_fired(void)
{
	struct urdma_shm_wake *w = atomic_load(&wake_blk);

	return w && atomic_load_explicit(&w->fired, memory_order_relaxed);
}

void urdma_wake_take_fired(void)
{
	struct urdma_shm_wake *w = atomic_load(&wake_blk);

	if (w)
		fired_take(w);
}

/* Until ch has an event queued (0) or a signal comes (-1, EINTR): the
 * blocking part of ibv_get_cq_event.  1: not here (no wake block): block
 * in read() as before. */
int urdma_wake_sleep(struct urdma_channel *ch)
{
	struct urdma_shm_wake *w = atomic_load(&wake_blk);
	int ret = 0, state;

	if (!w)
		return 1;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
	atomic_fetch_add(&sleepers, 1);
	atomic_fetch_add(&w->sleepers, 1);
	sleeping = true;
	for (;;) {
		uint32_t seq = atomic_load(&w->seq);
		unsigned int queued;

		fired_take(w);
		pthread_mutex_lock(&ch->lock);
		queued = ch->count;
		pthread_mutex_unlock(&ch->lock);
		if (queued)
			break;
		uint32_t stops = urdma_stop_seq();

		/* Counted in first: a peer that bumped seq without a wake
		 * (seeing none waiting) bumped it before the kernel looks. */
		atomic_fetch_add(&w->waiting, 1);
		atomic_store(&w->since, urdma_now_ns());
		if (sleep_wait(w, seq, state) && errno == EINTR &&
		    urdma_stop_seq() == stops)
			ret = -1;
		atomic_fetch_sub(&w->waiting, 1);
		if (ret)
			break;
	}
	sleep_out(w);
	fired_take(w);
	pthread_setcancelstate(state, NULL);
	if (ret)
		errno = EINTR;
	return ret;
}
