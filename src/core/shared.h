/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory layout: the contract between urdma processes on one host.
 *
 * Every object here lives in a file under the host directory (default
 * /dev/shm/urdma, mode 1777; files mode 0600 so only the same user maps them):
 *
 *   ctx-<id>        struct urdma_shm_ctx: owner pid, identity memfd, MR table
 *   ctx-<id>.wake   FIFO: a byte written here wakes the owner's progress thread
 *   qp-<qpn>        struct urdma_shm_qp followed by the receive queue ring
 *
 * Rules: offsets and ids, never pointers; every struct starts with magic and
 * version; sizes are fixed by static_assert; fields written by different
 * processes sit on different cache lines.  Bump URDMA_SHM_VERSION on any
 * change: a peer with another version is refused.
 *
 * Registered memory: each process owns one "identity memfd".  A registered
 * page at virtual address A is backed by that memfd at file offset A, so a
 * peer that opens the memfd (through /proc/<pid>/fd/<n>) and maps offset A
 * sees exactly the owner's page.  One-sided operations are then plain loads,
 * stores and CPU atomics by the initiator.
 */
#ifndef URDMA_SHARED_H
#define URDMA_SHARED_H

#include <assert.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#define URDMA_SHM_MAGIC 0x75726d61u /* "urma" */
#define URDMA_SHM_VERSION 1u
#define URDMA_CACHELINE 64

/* MR table: key = (random tag << URDMA_MR_IDX_BITS) | index. */
#define URDMA_MR_IDX_BITS 14
#define URDMA_MAX_MR (1u << URDMA_MR_IDX_BITS)
#define URDMA_MR_IDX(key) ((key) & (URDMA_MAX_MR - 1))

enum {
	URDMA_MR_F_UNMAPPED = 1u << 0, /* the owner unmapped the pages */
};

struct urdma_shm_mr {
	_Atomic uint32_t key; /* 0 while free or being changed; written last */
	uint32_t access;      /* enum ibv_access_flags */
	uint32_t pd_id;
	_Atomic uint32_t flags; /* URDMA_MR_F_* */
	uint64_t iova;          /* address the WRs use */
	uint64_t length;
	uint64_t va; /* owner virtual address of iova == memfd offset */
	uint64_t reserved[3];
};
static_assert(sizeof(struct urdma_shm_mr) == 64, "MR entry is one cache line");

struct urdma_shm_ctx {
	uint32_t magic;
	uint32_t version;
	uint32_t ctx_id;
	int32_t pid;
	int32_t memfd;   /* fd number in the owner, opened via /proc/pid/fd */
	uint32_t uid;
	uint64_t memfd_ino; /* checked after opening, against fd reuse */
	uint8_t reserved[URDMA_CACHELINE - 32];
	struct urdma_shm_mr mr[URDMA_MAX_MR];
};
static_assert(sizeof(struct urdma_shm_ctx) == 64 + 64 * URDMA_MAX_MR, "ctx size");

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
 * Receive queue entry.  The owner fills wr_id/num_sge/sge and publishes by
 * advancing rq_prod.  The deliverer (the peer's requester engine) fills the
 * completion fields and publishes by advancing rq_done.  The owner polls
 * completions up to rq_done and frees slots by advancing its private index.
 */
struct urdma_shm_rqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t status;   /* enum ibv_wc_status */
	uint32_t opcode;   /* enum ibv_wc_opcode */
	uint32_t byte_len;
	uint32_t imm_data; /* network order, as in ibv_wc */
	uint32_t wc_flags;
	uint32_t src_qp;
	uint32_t reserved;
	struct urdma_shm_sge sge[];
};
static_assert(sizeof(struct urdma_shm_rqe) == 40, "rqe header");

enum {
	URDMA_NOTIFY_NONE = 0,
	URDMA_NOTIFY_ANY = 1,
	URDMA_NOTIFY_SOLICITED = 2,
};

struct urdma_shm_qp {
	/* Written by the owner only. */
	uint32_t magic;
	uint32_t version;
	uint32_t qpn;
	uint32_t ctx_id;
	int32_t pid;
	uint32_t pd_id;
	_Atomic uint32_t state;	 /* URDMA_SQPS_* */
	_Atomic uint32_t dest_qpn; /* valid from RTR */
	uint32_t access;	 /* qp_access_flags */
	uint32_t min_rnr_timer;
	uint32_t rq_size; /* power of two */
	uint32_t rq_stride;
	uint32_t rq_max_sge;
	uint32_t rq_offset; /* from the start of this struct */
	uint32_t max_dest_rd_atomic;
	_Atomic uint32_t notify; /* URDMA_NOTIFY_*: owner's recv CQ is armed */
	uint8_t reserved0[URDMA_CACHELINE - 64];
	/* Written by deliverers. */
	alignas(URDMA_CACHELINE) _Atomic uint32_t error_req; /* please enter ERR */
	_Atomic uint32_t rnr_waiter; /* wake the peer on the next post_recv */
	_Atomic uint32_t notify_fired; /* a deliverer consumed 'notify' */
	/* Producer index (owner). */
	alignas(URDMA_CACHELINE) _Atomic uint32_t rq_prod;
	/* Completion index and busy flag (deliverer). */
	alignas(URDMA_CACHELINE) _Atomic uint32_t rq_done;
	_Atomic uint32_t busy;
	alignas(URDMA_CACHELINE) uint8_t rq[];
};
static_assert(sizeof(struct urdma_shm_qp) == 4 * URDMA_CACHELINE, "qp header");

#endif
