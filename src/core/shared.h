/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory layout: the contract between urdma processes of one
 * user on one host (core/host.c says how they find and trust each other).
 *
 *   <dir>/ctx-<id>  a Unix socket per context: a peer that connects (same
 *                   user, checked by SO_PEERCRED) gets struct urdma_hello
 *                   and, by SCM_RIGHTS, the context's MR table (struct
 *                   urdma_shm_ctx in a sealed memfd, read-only to peers)
 *                   and the process's identity memfd; one byte written on
 *                   the connection wakes the owner's progress thread
 *   <dir>/qp-<qpn>  struct urdma_qp_rec: which context holds QP qpn, and
 *                   where its shared block (struct urdma_shm_qp and the
 *                   receive ring) is in that process's identity memfd
 *   <dir>/srq-<n>   the same for XRC SRQ n (struct urdma_shm_srq)
 *   <dir>/mcg-<gid>-<qpn>  a qp-<qpn> record for each UD QP attached to
 *                   multicast group <gid> (32 hex digits; core/mcast.c)
 *   <dir>/xrcd-<id> an empty file each process that has XRC domain id
 *                   open holds a shared flock on (core/xrc.c)
 *
 * Rules: offsets and ids, never pointers; every struct starts with magic and
 * version; sizes are fixed by static_assert; fields written by different
 * processes sit on different cache lines.  Bump URDMA_SHM_VERSION on any
 * change: a peer with another version is refused.  Nothing read from here
 * is trusted: each value is checked before use, and what must not change
 * (ring geometry, what was posted) is kept in private memory.
 *
 * Registered memory: each process owns one "identity memfd".  A registered
 * page at virtual address A is backed by that memfd at file offset A, so a
 * peer that has the memfd and maps offset A sees exactly the owner's page.
 * One-sided operations are then plain loads, stores and CPU atomics by the
 * initiator.  QP shared blocks live in the same memfd (core/arena.c).
 * Direct MRs (URDMA_MR_F_DIRECT) are not in the memfd: a peer reaches them
 * in the owner's address space (process_vm_readv/writev, core/peer.c).
 */
#ifndef URDMA_SHARED_H
#define URDMA_SHARED_H

#include <assert.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define URDMA_SHM_MAGIC 0x75726d61u /* "urma" */
#define URDMA_SHM_VERSION 15u
#define URDMA_CACHELINE 64

/* MR table: key = (index << URDMA_MR_TAG_BITS) | random tag.  The index
 * on top, as iWARP's STag index: the low byte is the key a program may
 * choose when it binds a memory window (ibv_inc_rkey). */
#define URDMA_MR_IDX_BITS 14
#define URDMA_MR_TAG_BITS (32 - URDMA_MR_IDX_BITS)
#define URDMA_MAX_MR (1u << URDMA_MR_IDX_BITS)
#define URDMA_MR_IDX(key) ((key) >> URDMA_MR_TAG_BITS)
#define URDMA_MR_TAG(key) ((key) & ((1u << URDMA_MR_TAG_BITS) - 1))
/* urdma_mr_lookup's `via` for a local key (an SGE's lkey): no MW. */
#define URDMA_VIA_LOCAL 0xffffffffu

enum {
	URDMA_MR_F_UNMAPPED = 1u << 0, /* the owner unmapped the pages */
	/* Not backed by the identity memfd (a shared mapping of another
	 * object: file, SysV, hugetlb, shared anonymous): a peer reaches
	 * va in the owner's address space with process_vm_readv/writev,
	 * and does atomics under the owner's lock (urdma_shm_ctx). */
	URDMA_MR_F_DIRECT = 1u << 1,
	URDMA_MR_F_MW = 1u << 2, /* a memory window: a remote key only */
};

struct urdma_shm_mr {
	_Atomic uint32_t key; /* 0 while free or being changed; written last */
	uint32_t access;      /* enum ibv_access_flags */
	uint32_t pd_id;
	_Atomic uint32_t flags; /* URDMA_MR_F_* */
	uint64_t iova;          /* address the WRs use */
	uint64_t length;
	uint64_t va; /* owner virtual address of iova == memfd offset */
	/* Odd while the owner rewrites the entry (ibv_rereg_mr keeps the
	 * key): a reader that saw another value before and after, or an odd
	 * one, read a mix of two entries. */
	_Atomic uint32_t seq;
	uint32_t qpn; /* a type 2 MW: reached only through this QP */
	uint64_t reserved[2];
};
static_assert(sizeof(struct urdma_shm_mr) == 64, "MR entry is one cache line");

/* A context's MR table: peers check rkeys against it without asking us.
 * atomic_lock: where (identity memfd offset, 0 until the first direct MR)
 * the owner's lock word for atomics on direct MRs is; any writer to it
 * stores its pid, 0 frees it. */
struct urdma_shm_ctx {
	uint32_t magic;
	uint32_t version;
	uint32_t ctx_id;
	uint32_t reserved0;
	_Atomic uint64_t atomic_lock;
	uint8_t reserved[URDMA_CACHELINE - 24];
	struct urdma_shm_mr mr[URDMA_MAX_MR];
};
static_assert(sizeof(struct urdma_shm_ctx) == 64 + 64 * URDMA_MAX_MR, "ctx size");

/* What a context sends a peer that connects, with two fds (SCM_RIGHTS):
 * its MR table and the identity memfd. */
struct urdma_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t ctx_id;
	uint32_t nfds;
};
#define URDMA_HELLO_FDS 2

/* The record qp-<qpn>: the QP's shared block is [va, va + size) of the
 * identity memfd of context ctx_id's process. */
struct urdma_qp_rec {
	uint32_t magic;
	uint32_t version;
	uint32_t qpn;
	uint32_t ctx_id;
	uint64_t va;
	uint64_t size;
};
static_assert(sizeof(struct urdma_qp_rec) == 32, "qp record");

/* States a deliverer may observe in urdma_shm_qp.state. */
enum {
	URDMA_SQPS_RESET = 0,
	URDMA_SQPS_INIT = 1,
	URDMA_SQPS_RTR = 2, /* RTR, RTS, SQD: may receive */
	URDMA_SQPS_ERR = 3,
	URDMA_SQPS_GONE = 4, /* destroyed */
};

struct urdma_shm_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

/*
 * Receive queue entry.  The owner fills num_sge/sge, sets tag to the
 * entry's index (urdma_rqe_unpublished) and publishes by advancing rq_prod.
 * The deliverer (the peer's requester engine) fills the completion fields
 * and publishes the completion by tag = the entry's index + 1, then
 * advances rq_done (the deliverers' own mark).  The owner takes entries
 * in order while their tag says so: the line it reads per message is the
 * entry's, which the deliverer writes anyway, not a counter both move (as
 * UCX's FIFO has an owner bit per element).  It frees slots by advancing
 * its private index and keeps the WR id itself (in private memory).
 */
struct urdma_shm_rqe {
	/* In an SRQ's ring (struct urdma_shm_srq), the deliverer that
	 * claimed the entry also writes its pid and the QPN it receives
	 * for. */
	uint32_t srq_qpn;
	_Atomic uint32_t tag;
	uint32_t num_sge;
	uint32_t status;   /* enum ibv_wc_status */
	uint32_t opcode;   /* enum ibv_wc_opcode */
	uint32_t byte_len;
	uint32_t imm_data; /* network order, as in ibv_wc */
	uint32_t wc_flags;
	uint32_t src_qp;
	uint32_t srq_pid;
	/* A UD receive: the sender's LID, SL and whether a GRH was written
	 * into the buffer's first 40 bytes (URDMA_RQE_UD_*). */
	uint32_t ud_src;
	/* A Send of at most URDMA_RQE_INLINE bytes into a QP's own ring
	 * (not an SRQ's, not UD): its length, the payload in sge[0]'s place,
	 * for the owner to copy into the first buffer it posted.  The
	 * deliverer then writes one line per message, not two (UCX's FIFO
	 * carries a small payload in its element the same way).  0 when
	 * posted. */
	uint32_t inline_len;
	struct urdma_shm_sge sge[];
};
#define URDMA_RQE_INLINE 16 /* sizeof(struct urdma_shm_sge) */
static_assert(sizeof(struct urdma_shm_rqe) == 48, "rqe header");
#define URDMA_RQE_UD_SL_SHIFT 16
#define URDMA_RQE_UD_GRH (1u << 20)


enum {
	URDMA_NOTIFY_NONE = 0,
	URDMA_NOTIFY_ANY = 1,
	URDMA_NOTIFY_SOLICITED = 2,
};
/* A notify word: the mode in its low bits, and, in a CQ's block, the
 * arm's number above (URDMA_NOTIFY_ARM: the owner counts its arms). */
#define URDMA_NOTIFY_MODE 3u
#define URDMA_NOTIFY_ARM 4u

struct urdma_shm_qp {
	/* Written by the owner only. */
	uint32_t magic;
	uint32_t version;
	uint32_t qpn;
	uint32_t ctx_id;
	uint32_t qp_type; /* enum ibv_qp_type */
	uint32_t pd_id;	  /* 0: none (an XRC target) */
	_Atomic uint32_t state;	 /* URDMA_SQPS_* */
	_Atomic uint32_t dest_qpn; /* valid from RTR */
	uint32_t access;	 /* qp_access_flags */
	uint32_t min_rnr_timer;
	/* The receive ring's geometry, checked and copied by a deliverer
	 * (urdma_shm_qp_check) and never read again. */
	uint32_t rq_size; /* power of two */
	uint32_t rq_stride;
	uint32_t rq_max_sge;
	uint32_t rq_offset; /* sizeof(struct urdma_shm_qp) */
	uint32_t max_dest_rd_atomic;
	/* A QP on an SRQ: receives come from the SRQ's block, [srq_va,
	 * srq_va + srq_bytes) of the same identity memfd (srq_bytes 0: none).
	 * Its own ring then has one unused entry. */
	alignas(URDMA_CACHELINE) uint64_t srq_va;
	uint64_t srq_bytes;
	uint32_t srqn;
	uint32_t qkey; /* a UD QP's Q_Key */
	/* Counts the receive queue's resets (its indices back to 0): a
	 * deliverer that kept rq_prod from before one reads it again. */
	_Atomic uint32_t rq_epoch;
	/* Random, per QP: a deliverer that found this block for another QP
	 * (destroyed, its block reused) sees the difference. */
	uint32_t gen;
	/* An XRC target: receives go to the XRC SRQ each message names, of
	 * this domain (struct urdma_shm_srq.xrcd_id). */
	uint64_t xrcd_id;
	/* The owner context's wake block (struct urdma_shm_wake), in the
	 * same identity memfd; 0: none. */
	uint64_t wake_va;
	/* Its receive CQ's block (struct urdma_shm_bell) and this QP's slot
	 * in its bell (URDMA_BELL_NONE: none, on an SRQ), for the QP's life,
	 * read by a deliverer at attach: it rings the slot after each receive
	 * it completes, then claims the CQ's notify. */
	uint64_t bell_va;
	uint32_t bell_slot;
	/* Written by deliverers. */
	alignas(URDMA_CACHELINE) _Atomic uint32_t error_req; /* please enter ERR */
	_Atomic uint32_t rnr_waiter; /* wake the peer on the next post_recv */
	_Atomic uint32_t ud_drops; /* UD: datagrams no receive took */
	/* UD: the ring's many writers take turns: 0, or the pid of the one
	 * writing (compare-and-swap; transport/ud.c). */
	_Atomic uint32_t ud_lock;
	/* Producer index (owner). */
	alignas(URDMA_CACHELINE) _Atomic uint32_t rq_prod;
	/* Completion index and busy flag (deliverer). */
	alignas(URDMA_CACHELINE) _Atomic uint32_t rq_done;
	_Atomic uint32_t busy;
	alignas(URDMA_CACHELINE) uint8_t rq[];
};
static_assert(sizeof(struct urdma_shm_qp) == 5 * URDMA_CACHELINE, "qp header");

/*
 * A CQ's shared block, made with the CQ: what deliverers in other
 * processes write for a CQ they cannot reach otherwise.
 *
 * notify: the CQ armed, a mode (URDMA_NOTIFY_*) and the arm's number.
 * The owner stores it at each ibv_req_notify_cq and clears it when the
 * CQ fires; a deliverer that completed a receive into the CQ claims it
 * (compare-and-swap to NONE) and, if it was armed, stores the word it
 * claimed in fired and wakes the owner, who fires the CQ if that arm is
 * still the CQ's (a claim of an arm that fired for another cause meanwhile
 * is no event for the next).  One word per CQ, so an arm costs a store,
 * however many QPs feed it.
 *
 * The bell: a bit per receive QP with a ring of its own (the slot named in
 * its block), bit slot % 64 of bits[slot / 64], then bit (slot / 64) % 64
 * of summary[slot / 4096], each set by a deliverer only if clear; the owner
 * follows the summary words to the bits words and harvests those QPs, and
 * clears a bit when its QP has been idle a while (core/bell.c).  Rung
 * always; read once the CQ has URDMA_BELL_MIN such QPs.
 *
 * Peers write it: a bit rung for nothing costs a harvest, a fired that
 * names the CQ's arm an event it was armed for anyway.  They write it
 * only while inside a receive queue of the CQ (a QP's busy count): once
 * each QP waited for its deliverers the block is reused, else never.
 */
#define URDMA_BELL_MAGIC 0x7562656cu /* "ubel" */
#define URDMA_BELL_SLOTS 65536u
struct urdma_shm_bell {
	uint32_t magic; /* written by the owner only */
	uint32_t version;
	alignas(URDMA_CACHELINE) _Atomic uint32_t notify;
	_Atomic uint32_t fired;
	alignas(URDMA_CACHELINE) _Atomic uint64_t summary[URDMA_BELL_SLOTS / 4096];
	alignas(URDMA_CACHELINE) _Atomic uint64_t bits[URDMA_BELL_SLOTS / 64];
};

/*
 * A context's wake block: a thread of the owner asleep in
 * ibv_get_cq_event waits on seq (a futex), counted in sleepers.  A
 * deliverer that consumed the 'notify' of one of its CQs sets fired and,
 * if anyone sleeps, bumps seq and wakes them: the owner's thread fires the
 * CQ itself, one wake-up instead of two (its progress thread, then it).
 * With nobody asleep the deliverer wakes the progress thread as before.
 * Peers write it: hints only, never trusted for the owner's own wake-ups.
 * One page, never reused while the process lives (arena quarantine): a
 * peer may keep writing it after the context closed.
 */
#define URDMA_WAKE_MAGIC 0x75776b65u /* "uwke" */
struct urdma_shm_wake {
	uint32_t magic; /* written by the owner only */
	uint32_t version;
	alignas(URDMA_CACHELINE) _Atomic uint32_t seq;
	_Atomic uint32_t sleepers;
	_Atomic uint32_t fired;
	_Atomic uint32_t waiting; /* of the sleepers, in the futex wait */
	_Atomic uint64_t since;	  /* when one last went to wait (ns) */
};
static_assert(sizeof(struct urdma_shm_wake) == 2 * URDMA_CACHELINE, "wake");
/* (magic, then version: checked alike by urdma_peer_block) */
static_assert(offsetof(struct urdma_shm_wake, version) == 4, "wake header");
static_assert(offsetof(struct urdma_shm_bell, version) == 4, "bell header");

/*
 * A shared receive queue's block.  The owner posts as into a QP's ring
 * (entries, then prod); any deliverer, of any process and QP, claims the
 * next entry by compare-and-swap on claim, fills it, and publishes it with
 * its tag.  The owner takes completed entries in order (srq.c) into the
 * CQ of the QP each names.
 */
struct urdma_shm_srq {
	/* Written by the owner only. */
	uint32_t magic;
	uint32_t version;
	uint32_t srqn;
	uint32_t ctx_id;
	uint32_t pd_id;
	uint32_t rq_size; /* power of two */
	uint32_t rq_stride;
	uint32_t rq_max_sge;
	uint32_t rq_offset;	/* sizeof(struct urdma_shm_srq) */
	_Atomic uint32_t limit; /* armed srq_limit, 0: not armed */
	/* An XRC SRQ: its domain (0: a basic SRQ), whether its CQ is armed
	 * (URDMA_NOTIFY_*, as a QP's notify), and whether it lives
	 * (URDMA_SSRQ_LIVE; its owner clears it, then waits for busy to
	 * drop to 0 before the block goes: deliverers that found it by its
	 * number, in any process, enter it by busy, then look). */
	uint64_t xrcd_id;
	_Atomic uint32_t notify;
	_Atomic uint32_t state;
	/* Written by deliverers. */
	alignas(URDMA_CACHELINE) _Atomic uint32_t claim;
	_Atomic uint32_t rnr_waiter; /* wake the owner's peers on a post */
	_Atomic uint32_t limit_hit;  /* fewer than limit left: tell the owner */
	_Atomic uint32_t notify_fired; /* a deliverer consumed 'notify' */
	_Atomic uint32_t busy;	       /* XRC deliverers inside */
	/* Producer index (owner). */
	alignas(URDMA_CACHELINE) _Atomic uint32_t prod;
	alignas(URDMA_CACHELINE) uint8_t rq[];
};
static_assert(sizeof(struct urdma_shm_srq) == 3 * URDMA_CACHELINE, "srq header");
#define URDMA_SSRQ_LIVE 0x4c495645u /* an XRC SRQ's state while it lives */

#endif
