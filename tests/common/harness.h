/* SPDX-License-Identifier: MIT */
/*
 * urdma test harness: a tiny C11 helper library for (multi-process) verbs
 * tests.  It uses nothing but <infiniband/verbs.h> and POSIX.
 *
 * Execution model
 * ---------------
 * A test program is a list of "cases".  main() calls t_init(), then
 * t_case()/t_pair() for each case, then returns t_finish().
 *
 *  - Every case runs in its own forked process (the "case process"), so a
 *    crash, a fatal REQUIRE or a hang in one case cannot take the other cases
 *    down, and every case starts with no verbs state at all.
 *  - t_pair() cases fork once more: the case process plays the "parent" side,
 *    the forked process the "child" side.  The two sides talk over a
 *    socketpair (struct t_peer): exchange of connection data, barriers, small
 *    messages.  Every socket wait has a timeout and detects a dead peer.
 *  - The child's result is folded into the case result: a non-zero exit or a
 *    death by signal is a failure (unless the parent killed it on purpose
 *    with t_peer_kill()).
 *  - Nothing can hang: every case process and every child runs under an
 *    alarm() watchdog (t_set_case_timeout(), default 30 s), and the whole
 *    program runs under a global one (T_GLOBAL_TIMEOUT_S).
 *
 * Reporting
 * ---------
 *  CHECK(cond, fmt, ...)   records a failure (file:line, the condition, the
 *                          message) and carries on; evaluates to cond.
 *  REQUIRE(cond, fmt, ...) like CHECK, but ends the case on failure.
 *  t_skip(fmt, ...)        ends the case as skipped.
 * t_finish() returns 1 if any case failed, 77 if every case was skipped,
 * 0 otherwise: return it from main().
 *
 * Running a single case:  ./conf_xxx case_name [case_name...]
 */
#ifndef URDMA_TEST_HARNESS_H
#define URDMA_TEST_HARNESS_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define T_EXIT_SKIP 77
/* Default bound for any single wait (a completion, a peer message). */
#define T_WAIT_MS 10000
/* Bound for the whole test program (ctest's TIMEOUT is 120 s). */
#define T_GLOBAL_TIMEOUT_S 115

/* ------------------------------------------------------------------ */
/* Reporting                                                          */
/* ------------------------------------------------------------------ */

bool t_check_impl(bool ok, const char *file, int line, const char *expr,
		  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
_Noreturn void t_abort(void);
_Noreturn void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Informational line, prefixed with the role and the case name. */
void t_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* cond is evaluated before the message's arguments: a message that says
 * strerror(errno) tells the errno of the call in cond (as arguments of one
 * call, the order is unspecified: gcc took errno first). */
#define T_CHECK_(cond, text, ...)                                           \
	({                                                                  \
		bool t_ok_ = !!(cond);                                      \
		t_check_impl(t_ok_, __FILE__, __LINE__, text, __VA_ARGS__); \
	})
#define CHECK(cond, ...) T_CHECK_(cond, #cond, __VA_ARGS__)
#define REQUIRE(cond, ...)                                                  \
	do {                                                                \
		if (!T_CHECK_(cond, #cond, __VA_ARGS__))                    \
			t_abort();                                          \
	} while (0)

/* Number of failed CHECKs so far in this process (this case). */
int t_failures(void);

/* ------------------------------------------------------------------ */
/* Cases                                                              */
/* ------------------------------------------------------------------ */

struct t_peer {
	int fd;		  /* socketpair end */
	bool is_child;	  /* which side this process plays */
	pid_t child_pid;  /* parent side: the child's pid, 0 once reaped */
	uint32_t barrier; /* barrier sequence number */
};

typedef void (*t_case_fn)(void *arg);
typedef void (*t_side_fn)(struct t_peer *peer, void *arg);

void t_init(int argc, char **argv);
/* Watchdog of each following case process and child, in seconds. */
void t_set_case_timeout(unsigned seconds);
/* A single-process case. */
void t_case(const char *name, t_case_fn fn, void *arg);
/* A two-process case: parent_fn runs in one process, child_fn in another. */
void t_pair(const char *name, t_side_fn parent_fn, t_side_fn child_fn, void *arg);
/* t_pair as name with the transport the environment picks, then as
 * tcp_name with URDMA_TRANSPORT=tcp. */
void t_pair_and_tcp(const char *name, t_side_fn parent_fn, t_side_fn child_fn, void *arg);
int t_finish(void);

/* The role of this process: "main", "solo", "parent" or "child". */
const char *t_role(void);

/* ------------------------------------------------------------------ */
/* Peer communication (all waits bounded; a broken link is fatal)      */
/* ------------------------------------------------------------------ */

void t_send_msg(struct t_peer *p, const void *buf, size_t len);
void t_recv_msg(struct t_peer *p, void *buf, size_t len, int timeout_ms);
void t_send_u64(struct t_peer *p, uint64_t v);
uint64_t t_recv_u64(struct t_peer *p, int timeout_ms);
/* Both sides must call it the same number of times; bounded by T_WAIT_MS. */
void t_barrier(struct t_peer *p);
/* Like t_barrier but with an explicit bound. */
void t_barrier_timeout(struct t_peer *p, int timeout_ms);
/* Parent only: SIGKILL the child now and reap it; its death is expected. */
void t_peer_kill(struct t_peer *p);

/* ------------------------------------------------------------------ */
/* Verbs resources                                                    */
/* ------------------------------------------------------------------ */

struct t_opts {
	int cq_size;		/* entries of each CQ */
	bool use_channel;	/* create a completion channel for the CQ(s) */
	bool separate_cqs;	/* a send CQ and a recv CQ instead of one */
	bool create_qp;		/* create the RC QP (left in RESET) */
	uint32_t max_send_wr, max_recv_wr;
	uint32_t max_send_sge, max_recv_sge;
	uint32_t max_inline_data;
	bool sq_sig_all;
	/* connection */
	bool use_gid;		/* ah_attr.is_global = 1, addressed by GID */
	uint8_t sgid_index;
	enum ibv_mtu path_mtu;
	uint8_t retry_cnt, rnr_retry, min_rnr_timer, timeout;
	uint8_t max_rd_atomic;	/* and max_dest_rd_atomic */
	unsigned int qp_access;	/* qp_access_flags given at INIT */
};

/* IBV_MTU_1024, retry_cnt 7, rnr_retry 7, min_rnr_timer 12, timeout 14,
 * max_rd_atomic 1, GID addressing with sgid_index 1, one CQ of 256, 64 WRs
 * and 1 SGE per queue, no inline, all remote access rights on the QP. */
struct t_opts t_opts_default(void);

#define T_MAX_MRS 32

struct t_res {
	struct ibv_context *ctx;
	struct ibv_device_attr dev_attr;
	struct ibv_port_attr port_attr;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *send_cq, *recv_cq; /* the same CQ unless separate_cqs */
	struct ibv_qp *qp;
	struct ibv_qp_cap cap; /* what ibv_create_qp reported */
	struct t_opts opts;
	uint32_t psn;
	struct ibv_mr *mrs[T_MAX_MRS];
};

/* What each side tells the other. */
struct t_conn {
	uint32_t qpn;
	uint32_t psn;
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr; /* a buffer the peer may access */
	uint64_t len;
	uint32_t rkey;
};

/* Opens the first device; fatal (REQUIRE) if there is none. */
struct ibv_context *t_open_first_device(void);
/* Opens the device and creates PD, channel, CQ(s), QP as opts says. */
void t_res_open(struct t_res *r, const struct t_opts *o);
/* Destroys all of it (registered MRs first), CHECKing every return. */
void t_res_close(struct t_res *r);
/* Registers a buffer (fatal on failure); t_res_close deregisters it. */
struct ibv_mr *t_reg(struct t_res *r, void *buf, size_t len, unsigned int access);
/* Deregisters an MR registered with t_reg (CHECKs the result). */
void t_dereg(struct t_res *r, struct ibv_mr *mr);
/* Page-aligned, zeroed memory; fatal on failure. free() it. */
void *t_alloc(size_t len);
/* Registers len bytes of fresh private memory (mmap'ed, filled with
 * fill), deregisters and unmaps them: a registration that moves pages,
 * and so stops the process's other running threads for a moment with a
 * signal (core/stop.c).  Fatal on failure. */
void t_reg_fresh(struct ibv_pd *pd, size_t len, int fill);

void t_conn_local(struct t_res *r, const struct ibv_mr *mr, struct t_conn *out);
void t_exchange(struct t_peer *p, const struct t_conn *local, struct t_conn *remote);

/* Each returns ibv_modify_qp's result (0 or an errno value). */
int t_modify_init(struct t_res *r);
int t_modify_rtr(struct t_res *r, const struct t_conn *remote);
int t_modify_rts(struct t_res *r);
/* INIT, RTR, RTS; fatal on failure. */
void t_connect(struct t_res *r, const struct t_conn *remote);
/* t_conn_local + t_exchange + t_connect + t_barrier: on return both QPs
 * are in RTS.  mr may be NULL; remote may be NULL. */
void t_connect_pair(struct t_peer *p, struct t_res *r, const struct ibv_mr *mr,
		    struct t_conn *remote);

/* The whole life of a passive target: open resources, register len bytes
 * with `access`, connect, then sleep in a barrier (up to timeout_ms) while
 * the other side works on its memory; then tear down. */
void t_passive_target(struct t_peer *p, size_t len, unsigned int access,
		      int timeout_ms);

/* Current state of the QP as ibv_query_qp reports it, or -1 on error. */
int t_qp_state(struct ibv_qp *qp);
/* Moves the QP to a state with only IBV_QP_STATE; returns the errno. */
int t_modify_state(struct ibv_qp *qp, enum ibv_qp_state state);

/* ------------------------------------------------------------------ */
/* Posting and polling                                                */
/* ------------------------------------------------------------------ */

/* A single WR with a single SGE (len 0 means num_sge = 0). */
int t_post_send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		void *addr, uint32_t len, uint32_t lkey, unsigned int flags,
		uint64_t raddr, uint32_t rkey);
int t_post_recv(struct ibv_qp *qp, uint64_t wr_id, void *addr, uint32_t len,
		uint32_t lkey);
/* A signaled atomic (IBV_WR_ATOMIC_CMP_AND_SWP or _FETCH_AND_ADD) on the
 * 8 bytes at raddr, the old value into *res. */
int t_post_atomic(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		  uint64_t *res, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		  uint64_t compare_add, uint64_t swap);

/* Polls until n completions or timeout_ms elapsed; returns how many it got.
 * A negative ibv_poll_cq return is recorded as a failure. */
int t_poll(struct ibv_cq *cq, struct ibv_wc *wc, int n, int timeout_ms);
/* Waits for one completion (a failure is recorded if none comes within
 * timeout_ms); returns true if one was polled. */
bool t_poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int timeout_ms, const char *what);
/* Waits for one completion and CHECKs its status, wr_id and (if opcode is
 * >= 0) its opcode. Returns true if all matched. */
bool t_expect_wc(struct ibv_cq *cq, struct ibv_wc *wc, uint64_t wr_id,
		 enum ibv_wc_status status, int opcode, const char *what);
/* Polls for ms milliseconds; returns the number of completions seen (0 if
 * the CQ stayed empty). Completions seen are stored in wc (if not NULL). */
int t_cq_drain(struct ibv_cq *cq, struct ibv_wc *wc, int max, int ms);

/* Waits for a completion event on channel (poll() with a bound, then
 * ibv_get_cq_event); acks it. Returns true if one came. */
bool t_wait_cq_event(struct ibv_comp_channel *ch, struct ibv_cq *expect_cq,
		     int timeout_ms);
/* Is the fd readable within ms? (poll()) */
bool t_fd_readable(int fd, int ms);

/* ------------------------------------------------------------------ */
/* Misc                                                               */
/* ------------------------------------------------------------------ */

uint64_t t_now_ms(void);
uint64_t t_now_us(void);
/* Voluntary context switches so far of this process's threads other than
 * the caller (the library's: how often they slept). */
long t_other_threads_switches(void);
void t_sleep_ms(unsigned ms);
/* The number of open fds of this process, or -1 if /proc/self/fd can't be
 * read. */
int t_count_fds(void);
/* Deterministic byte pattern. t_pattern_check returns the offset of the
 * first mismatch, or -1. */
void t_pattern_fill(void *buf, size_t len, unsigned seed);
long t_pattern_check(const void *buf, size_t len, unsigned seed);
unsigned char t_pattern_byte(size_t i, unsigned seed);

const char *t_wc_status_str(enum ibv_wc_status s);
const char *t_wc_opcode_str(enum ibv_wc_opcode op);
const char *t_qp_state_str(int s);

#ifdef __cplusplus
}
#endif
#endif
