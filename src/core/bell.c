// SPDX-License-Identifier: MIT
/*
 * A CQ's shared block (struct urdma_shm_bell, shared.h): its notify word,
 * so that arming and firing a CQ cost one store however many QPs feed it,
 * and its bell, so that a poll of a CQ behind thousands of QPs costs what
 * it costs behind one.
 *
 * The block is made with the CQ, and each receive QP's block names it for
 * the QP's life (bell_va), with the QP's slot if it has a receive ring of
 * its own (bell_slot).  A deliverer, after it published a receive
 * completion and passed a fence, rings the slot (its bit, then its word's
 * bit in summary, each only if clear: a load, the RMW only then), passes
 * another fence if it set a bit, and claims notify (urdma_dest_notify).
 * Against the owner's arm (notify stored, a fence, then the poll's look at
 * the bits and entries) that is a Dekker pair: either the deliverer sees
 * the arm and fires, or the owner's poll sees the completion.
 *
 * The owner reads the bits only from URDMA_BELL_MIN ring QPs on; below,
 * the poll walks them all, which is as cheap.  Until then it never clears
 * a bit, so a bit a deliverer set before waits for the first scan: the
 * bell goes on without a sweep.  A poll follows the summary words to the
 * bits words and harvests the QPs whose bits are set, and the QPs on its
 * carry list (those without a slot), in turns.  A QP's bit stays set
 * while it is busy (harvest_slot says when it goes), so a QP that
 * receives often costs its deliverer two loads of lines that do not move,
 * not two RMWs.
 *
 * Why nothing is lost: the owner clears a bit (an RMW) and only then looks
 * at the QP once more; a deliverer publishes, fences, and only then looks
 * at the bit.  Either the deliverer's look came after the clear, and it
 * sets the bit again, or the owner's look after the clear sees the entry.
 * The same holds between a summary bit the owner clears (summary_clear)
 * and the bits word under it.  A ring lost anyway (a peer that died
 * between its two stores, or one that cleared bits) waits for a sweep: the
 * progress thread asks for one at most every BELL_SWEEP_NS (its pass comes
 * at least every 200 ms), and the next poll makes it; a program asleep on
 * its channel learns of it only at its next event.
 *
 * The owner's own completions (TCP, UDP, a flush) ring the same block
 * (urdma_qp_bell_own; UDP through its own dest).
 */
#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdatomic.h>
#include <string.h>

#define BELL_SWEEP_NS 100000000ull /* 100 ms */

static bool bell_ring(struct urdma_shm_bell *b, uint32_t slot);

static void carry_add(struct urdma_cq *cq, struct urdma_qp *qp)
{
	if (!qp->carried) {
		qp->carried = true;
		list_add_tail(&qp->carry_node, &cq->carry);
	}
}

/* A free slot, or URDMA_BELL_NONE (all taken, or no memory). */
static uint32_t slot_get(struct urdma_cq *cq)
{
	if (cq->nfree)
		return cq->slot_free[--cq->nfree];
	if (cq->slot_next == URDMA_BELL_SLOTS)
		return URDMA_BELL_NONE;
	if (cq->slot_next == cq->slot_cap) {
		uint32_t cap = cq->slot_cap ? 2 * cq->slot_cap : 64;
		uint32_t *f = urdma_ring_move(cq->slot_free, cq->slot_cap, 0,
					      cq->nfree, cap, sizeof(*f));
		struct urdma_qp **q;

		if (!f)
			return URDMA_BELL_NONE;
		cq->slot_free = f; /* (bigger than needed, if q fails) */
		q = urdma_ring_move(cq->slot_qp, cq->slot_cap, 0, cq->slot_next,
				    cap, sizeof(*q));
		if (!q)
			return URDMA_BELL_NONE;
		cq->slot_qp = q;
		cq->slot_cap = cap;
	}
	return cq->slot_next++;
}

int urdma_bell_new(struct urdma_cq *cq)
{
	struct urdma_shm_bell *b = urdma_arena_alloc(sizeof(*b), &cq->shm_va);

	if (!b)
		return -errno;
	b->magic = URDMA_BELL_MAGIC;
	b->version = URDMA_SHM_VERSION;
	cq->shm = b;
	return 0;
}

/* A receive QP joins the CQ: its block names the CQ's (before any
 * deliverer can find the QP), and a ring QP gets a slot. */
void urdma_bell_add(struct urdma_cq *cq, struct urdma_qp *qp)
{
	qp->bell_slot = URDMA_BELL_NONE;
	if (qp->ring_listed) {
		cq->nring++;
		qp->bell_slot = slot_get(cq);
		if (qp->bell_slot == URDMA_BELL_NONE)
			carry_add(cq, qp); /* no slot: looked at by every poll */
		else
			cq->slot_qp[qp->bell_slot] = qp;
		/* Its bit was never cleared while off: no sweep (above). */
		if (cq->nring >= URDMA_BELL_MIN)
			atomic_store_explicit(&cq->bell_on, true,
					      memory_order_relaxed);
	}
	qp->shm->bell_slot = qp->bell_slot;
	qp->shm->bell_va = cq->shm_va;
}

void urdma_bell_del(struct urdma_cq *cq, struct urdma_qp *qp)
{
	if (!qp->ring_listed)
		return;
	cq->nring--;
	if (qp->carried) {
		qp->carried = false;
		list_del(&qp->carry_node);
	}
	if (qp->bell_slot != URDMA_BELL_NONE) {
		/* (a late ring of it rings the next QP of the slot: a harvest
		 * that finds nothing) */
		cq->slot_qp[qp->bell_slot] = NULL;
		cq->slot_free[cq->nfree++] = qp->bell_slot;
		qp->bell_slot = URDMA_BELL_NONE;
	}
}

/* The sweep the progress thread's timer asked for: every ring QP's slot
 * rung, by us (the flag first: a ring from now on is seen by this look or
 * the next).  Rung, not carried: the scan's turns keep one busy QP from
 * starving the others. */
static void sweep_take(struct urdma_cq *cq)
{
	struct urdma_qp *qp;

	if (!atomic_load_explicit(&cq->bell_sweep, memory_order_relaxed))
		return;
	atomic_store(&cq->bell_sweep, false);
	atomic_thread_fence(memory_order_seq_cst);
	list_for_each_entry(qp, &cq->ring_qps, ring_node)
		if (qp->bell_slot != URDMA_BELL_NONE)
			bell_ring(cq->shm, qp->bell_slot);
}

/* A bits word found empty: its summary bit goes, unless a ring came
 * meanwhile (its deliverer found the summary bit set and left it). */
static void summary_clear(struct urdma_shm_bell *b, uint32_t i)
{
	_Atomic uint64_t *s = &b->summary[i / 64];
	uint64_t m = 1ull << (i % 64);

	atomic_fetch_and(s, ~m);
	if (atomic_load(&b->bits[i]))
		atomic_fetch_or(s, m);
}

typedef bool (*slot_fn)(struct urdma_cq *cq, uint32_t slot, void *arg);

/* fn for each rung slot in [from, to), in order, until it says stop
 * (true).  The summary skips 64 quiet slots a bit, 4,096 a word. */
static bool bell_scan(struct urdma_cq *cq, uint32_t from, uint32_t to,
		      slot_fn fn, void *arg)
{
	struct urdma_shm_bell *b = cq->shm;
	uint32_t i = from / 64; /* a bits word */

	while (i * 64 < to) {
		uint64_t s = atomic_load(&b->summary[i / 64]) >> (i % 64);
		uint64_t bw;

		if (!s) {
			i = (i / 64 + 1) * 64;
			continue;
		}
		i += (uint32_t)__builtin_ctzll(s);
		if (i * 64 >= to)
			break;
		bw = atomic_load(&b->bits[i]);
		if (!bw) {
			summary_clear(b, i);
			i++;
			continue;
		}
		if (i == from / 64)
			bw &= ~0ull << (from % 64);
		if ((i + 1) * 64 > to)
			bw &= (1ull << (to % 64)) - 1;
		while (bw) {
			uint32_t slot = i * 64 + (uint32_t)__builtin_ctzll(bw);

			bw &= bw - 1;
			if (fn(cq, slot, arg))
				return true;
		}
		i++;
	}
	return false;
}

static struct urdma_qp *slot_qp(struct urdma_cq *cq, uint32_t slot)
{
	return slot < cq->slot_next ? cq->slot_qp[slot] : NULL;
}

struct harvest {
	struct ibv_wc *wc;
	int n, num;
	int empty; /* QPs this poll found empty */
};

/*
 * Harvest a rung slot's QP.  Its bit stays set while the QP is busy: a
 * deliverer that finds it set writes nothing, so a QP that receives often
 * costs no line moved per message.  The bit goes once the QP was found
 * empty BELL_IDLE times (qp->bell_idle) and the CQ's last BELL_IDLE polls
 * found nothing at all (cq->bell_quiet), or BELL_IDLE_MAX times in a CQ
 * that stays busy (else each poll would look at every QP that ever
 * received, as the walk did): perftest 8 B ib_send_bw -q 16
 * and -q 64, round robin, lost a quarter of their rate when each emptied
 * QP's bit went at once, and still 6-12 % with the QP's count alone (a
 * poller faster than the sender finds each QP empty often).  But once a
 * poll has found BELL_LOOKS QPs idle (empty BELL_IDLE times or more) it
 * clears the bits of the idle ones after: each message to one QP in turn
 * of thousands (an event-driven
 * server's) left a thousand bits set, and each poll looked at them all
 * (cq_scale, 4,096 pairs, a Send to a receiver asleep on its channel:
 * 110-111 us; 38-40 with this).  Then one more look takes what a
 * deliverer published before the bit went and did not ring for, as it
 * found the bit set.
 */
#define BELL_IDLE 16
#define BELL_IDLE_MAX 4096
#define BELL_LOOKS 64

static bool harvest_slot(struct urdma_cq *cq, uint32_t slot, void *arg)
{
	_Atomic uint64_t *w = &cq->shm->bits[slot / 64];
	uint64_t m = 1ull << (slot % 64);
	struct urdma_qp *qp = slot_qp(cq, slot);
	struct harvest *h = arg;
	int k;

	if (!qp) { /* rung for a QP gone */
		atomic_fetch_and(w, ~m);
		return false;
	}
	k = urdma_qp_harvest(qp, h->wc + h->n, h->num - h->n);
	h->n += k;
	if (k)
		qp->bell_idle = 0;
	if (h->n < h->num) {
		if (k || ++qp->bell_idle < BELL_IDLE ||
		    (cq->bell_quiet < BELL_IDLE && qp->bell_idle < BELL_IDLE_MAX &&
		     ++h->empty < BELL_LOOKS))
			return false;
		qp->bell_idle = 0;
		atomic_fetch_and(w, ~m);
		atomic_thread_fence(memory_order_seq_cst); /* (then the look) */
		k = urdma_qp_harvest(qp, h->wc + h->n, h->num - h->n);
		if (!k)
			return false;
		atomic_fetch_or(w, m);
		h->n += k;
		if (h->n < h->num)
			return false;
	}
	cq->bell_turn = slot + 1; /* the next poll starts after it */
	return true;
}

/* Every rung slot, from bell_turn round to it: fn until it says stop. */
static bool bell_scan_all(struct urdma_cq *cq, slot_fn fn, void *arg)
{
	uint32_t end = cq->slot_next;
	uint32_t t = cq->bell_turn < end ? cq->bell_turn : 0;

	return bell_scan(cq, t, end, fn, arg) || (t && bell_scan(cq, 0, t, fn, arg));
}

/* The QPs without a slot (more than URDMA_BELL_SLOTS, or no memory for
 * one): every poll looks at them, in turns. */
static void harvest_carry(struct urdma_cq *cq, struct harvest *h)
{
	struct urdma_qp *qp, *next;

	list_for_each_entry_safe(qp, next, &cq->carry, carry_node) {
		h->n += urdma_qp_harvest(qp, h->wc + h->n, h->num - h->n);
		if (h->n == h->num) {
			if (&next->carry_node != &cq->carry)
				list_rotate_to(&cq->carry, &next->carry_node);
			return;
		}
	}
}

int urdma_bell_harvest(struct urdma_cq *cq, int num, struct ibv_wc *wc)
{
	struct harvest h = { wc, 0, num };

	sweep_take(cq);
	/* the slotless first every other poll: neither starves the other */
	cq->carry_first = !cq->carry_first;
	if (cq->carry_first && !list_empty(&cq->carry))
		harvest_carry(cq, &h);
	if (h.n < num)
		bell_scan_all(cq, harvest_slot, &h);
	if (!cq->carry_first && h.n < num && !list_empty(&cq->carry))
		harvest_carry(cq, &h);
	if (h.n)
		cq->bell_quiet = 0;
	else if (cq->bell_quiet < BELL_IDLE)
		cq->bell_quiet++;
	return h.n;
}

static bool any_slot(struct urdma_cq *cq, uint32_t slot, void *arg)
{
	struct urdma_qp *qp = slot_qp(cq, slot);

	(void)arg;
	return qp && urdma_rq_any(qp);
}

bool urdma_bell_holds(struct urdma_cq *cq)
{
	struct urdma_qp *qp;

	sweep_take(cq);
	list_for_each_entry(qp, &cq->carry, carry_node)
		if (urdma_rq_any(qp))
			return true;
	return bell_scan_all(cq, any_slot, NULL);
}

static bool count_slot(struct urdma_cq *cq, uint32_t slot, void *arg)
{
	struct urdma_qp *qp = slot_qp(cq, slot);

	if (qp && !qp->carried)
		*(uint32_t *)arg += urdma_rq_ready(qp);
	return false;
}

uint32_t urdma_bell_ready(struct urdma_cq *cq)
{
	struct urdma_qp *qp;
	uint32_t n = 0;

	sweep_take(cq);
	list_for_each_entry(qp, &cq->carry, carry_node)
		n += urdma_rq_ready(qp);
	bell_scan_all(cq, count_slot, &n);
	return n;
}

/* Deliverers write the block only inside a QP's busy count (urdma_dest_
 * notify and _ring come before they leave), and each QP waited for its
 * own before it went: the block is reused, unless a QP gave up waiting. */
void urdma_bell_free(struct urdma_cq *cq)
{
	urdma_arena_free(cq->shm, sizeof(*cq->shm),
			 atomic_load(&cq->shm_busy_left));
	urdma_free(cq->slot_qp);
	urdma_free(cq->slot_free);
}

void urdma_bell_tick(struct urdma_cq *cq, uint64_t now)
{
	if (!urdma_bell_on(cq) ||
	    now - cq->bell_swept_ns < BELL_SWEEP_NS)
		return;
	cq->bell_swept_ns = now;
	atomic_store(&cq->bell_sweep, true);
}

/* Ring slot of bell b: true if it set a bit (it was clear). */
static bool bell_ring(struct urdma_shm_bell *b, uint32_t slot)
{
	_Atomic uint64_t *w, *s;
	uint64_t m, ms;
	bool set = false;

	if (slot >= URDMA_BELL_SLOTS)
		return false; /* a block a peer wrote */
	w = &b->bits[slot / 64];
	m = 1ull << (slot % 64);
	if (!(atomic_load(w) & m)) {
		atomic_fetch_or(w, m);
		set = true;
	}
	s = &b->summary[slot / 4096];
	ms = 1ull << (slot / 64 % 64);
	if (!(atomic_load(s) & ms)) {
		atomic_fetch_or(s, ms);
		set = true;
	}
	return set;
}

void urdma_qp_bell_own(struct urdma_qp *qp)
{
	/* (the deliverers' fence: published before the bell is read) */
	atomic_thread_fence(memory_order_seq_cst);
	if (qp->bell_slot != URDMA_BELL_NONE)
		bell_ring(qp->rcq->shm, qp->bell_slot);
}

/* Map d's CQ block (d->bell_va, in peer p's memory) into d->bell, NULL
 * if it is not one; the first failure in the process warns. */
static void dest_bell_map(struct urdma_shm_dest *d, struct urdma_peer *p)
{
	static _Atomic bool warned;

	d->bell = urdma_peer_block(p, d->bell_va, sizeof(*d->bell),
				   URDMA_BELL_MAGIC);
	/* Its receives then raise no event: say so, once. */
	if (!d->bell && !atomic_exchange(&warned, true))
		urdma_warn("a peer's QP names no CQ block we can map (%#llx): "
			   "its CQ gets no events from us",
			   (unsigned long long)d->bell_va);
}

/* The block of d's QP's CQ, as found at attach, or NULL.  A mapping that
 * failed is tried again (our own QP's, UDP's own dest, p NULL, is set at
 * its making). */
static struct urdma_shm_bell *dest_bell(struct urdma_shm_dest *d,
					struct urdma_peer *p)
{
	if (!d->bell && p)
		dest_bell_map(d, p);
	return d->bell;
}

/* Ring d's QP's slot in b; true if it set a bit.  After the fence. */
static bool dest_ring(struct urdma_shm_dest *d, struct urdma_shm_bell *b)
{
	return b && bell_ring(b, d->bell_slot);
}

void urdma_dest_ring(struct urdma_shm_dest *d, struct urdma_peer *p)
{
	atomic_thread_fence(memory_order_seq_cst); /* published, then rung */
	dest_ring(d, dest_bell(d, p));
}

bool urdma_dest_notify(struct urdma_shm_dest *d, struct urdma_peer *p,
		       bool solicited)
{
	struct urdma_shm_bell *b;
	uint32_t w;

	atomic_thread_fence(memory_order_seq_cst); /* published, then rung */
	b = dest_bell(d, p);
	if (!b)
		return false;
	/* A bit set, then notify read: the Dekker pair with the arm. */
	if (dest_ring(d, b))
		atomic_thread_fence(memory_order_seq_cst);
	w = urdma_notify_take(&b->notify, solicited);
	if (!w)
		return false;
	if (p) /* (our own QP, UDP's own dest: the caller fires it) */
		atomic_store(&b->fired, w);
	return true;
}

void urdma_dest_blocks(struct urdma_shm_dest *d, struct urdma_peer *p,
		       const struct urdma_shm_qp *h)
{
	d->wake = urdma_wake_map(p, READ_ONCE(h->wake_va));
	/* Read once, as the ring's geometry: the QP's for its life, and a
	 * peer that rewrites its block later changes nothing here. */
	d->bell_va = READ_ONCE(h->bell_va);
	d->bell_slot = READ_ONCE(h->bell_slot);
	dest_bell_map(d, p);
}
