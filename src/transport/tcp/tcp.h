/* SPDX-License-Identifier: MIT */
/*
 * What the TCP transport's files share (tcp_*.c): its limits, the
 * connection and listener objects, and the functions one engine calls in
 * another.  Private to src/transport/tcp.
 */
#ifndef URDMA_TCP_H
#define URDMA_TCP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"

#define RBUF_SIZE (256 * 1024)
#define TX_IOV 64
#define TX_TAILS 2 /* FPDUs riding at a message's end (tx_tail) */
#define TX_GATHER 4608 /* a write that goes out from one buffer (tx_flat) */
/* Small messages held back in user space (tx_hold): one of at most
 * TX_HOLD_MSG bytes (its FPDUs and those riding with it), posted within
 * TX_HOLD_GAP_NS of the end of the last write, waits for the next write,
 * up to TX_HOLD_MAX bytes, or for the application's next poll of a CQ,
 * or TX_HOLD_NS at most (the progress thread). */
#define TX_HOLD_MSG 512
#define TX_HOLD_MAX 4096
#define TX_HOLD_GAP_NS 4000ull
#define TX_HOLD_NS 50000ull
#define RSP_SEGS 16	     /* FPDUs (and responses) per response write */
#define RSP_TAKE 8	     /* data-less responses sent with a message */
#define RSP_MAX (1u << 16) /* queued responses before the peer is cut off */
/* An FPDU at most: MPA length, the largest header, payload, pad, CRC */
#define RES_SIZE (sizeof(((struct tx_seg *)0)->hdr) + IWARP_SEG_PAYLOAD + 8)
/* Accepted connections still in their handshake hold an fd and a buffer
 * each: at most PENDING_MAX, none for longer than PENDING_TIMEOUT_NS.  At
 * the limit, the oldest that has had PENDING_GRACE_NS to send its Request
 * is closed (a legitimate initiator reconnects); when none has, listeners
 * stop accepting until one settles: new connections wait in the kernel's
 * backlog rather than push out those being served (pending_admit). */
#define PENDING_MAX 64
#define PENDING_GRACE_NS (1000000000ull)
#define PENDING_TIMEOUT_NS (60ull * 1000000000ull)
/* While paused, how often to look for room; after accept() failed for want
 * of fds or memory, how long to wait. */
#define PENDING_LOOK_NS (1000000ull)
#define ACCEPT_RETRY_NS (100ull * 1000000ull)
#define RETRY_CONNECT_NS (20ull * 1000000ull)

enum conn_state {
	C_CONNECTING,	/* active: TCP connect in progress */
	C_RETRY,	/* active: wait, then connect again */
	C_REQ_SENT,	/* active: MPA Request sent, Reply awaited */
	C_WAIT_REQ,	/* passive: accepted, MPA Request awaited */
	C_PENDING_QP,	/* passive: Request read, its QP not at RTR yet */
	C_UP,		/* FPDUs flow */
	C_CLOSED,	/* retired: the progress thread frees it */
};

/* Where an outstanding RDMA Read or atomic we issued lands. */
struct tcp_ord {
	bool used, atomic;
	uint32_t tag; /* sink STag (Read) or request identifier (atomic) */
	uint64_t len, got;
	int n;
	struct urdma_span sp[URDMA_MAX_SGE];
};

/*
 * A message we sent that the peer has not yet confirmed.  iWARP has no
 * acknowledgements, but the responder processes a stream in order, so a
 * response (Read or atomic) confirms every message sent before its
 * request.  A signaled Send or Write is followed by a zero-length Read
 * (a "flush"), and completes when that Read's response arrives: then the
 * data is placed, as on InfiniBand, and a remote error (a Terminate)
 * lands on the WR that caused it.
 */
enum { K_SEND, K_WRITE, K_READ, K_ATOMIC, K_FLUSH };
struct tcp_unc {
	uint32_t wr_idx;
	uint8_t kind;
	uint32_t tag; /* K_READ, K_ATOMIC, K_FLUSH: the response's tag */
	uint32_t msn; /* of the request on its DDP queue */
	uint32_t stag, len;
	uint64_t to;
};

/* One FPDU being sent: its header bytes and its pad + CRC. */
struct tx_seg {
	uint8_t hdr[2 + sizeof(struct ddp_untagged_hdr) +
		    sizeof(struct rdmap_atomic_req)];
	uint8_t trailer[8];
	uint32_t hlen, tlen; /* bytes used in hdr and trailer */
};

/* A message being sent (tx_msg): its DDP/RDMAP header (and a control
 * message's body), the spans of its data, how far its FPDUs have gone;
 * begun once the responses that go before it went (tx_job_run). */
#define CTRL_BODY 64 /* a control message's body at most (tcp_ctrl_put) */
struct tx_job {
	uint8_t h[sizeof(struct ddp_untagged_hdr) + CTRL_BODY];
	uint32_t hlen;
	struct urdma_span sp[URDMA_MAX_SGE];
	int nsp;
	uint64_t len, off;
	bool begun, late;
};

/* When a send that finds no room may stop and leave the rest for later
 * (tx_wait): never; when our own receiving stalled (a Send waits for a
 * receive WR the application would post if it were not sending); always
 * (what the progress thread resumes). */
enum txc { TXC_NEVER, TXC_STALLED, TXC_ALWAYS };
#define TX_CUT 1 /* tx_wait: stop here */

/* A response queued by the receive path: a Read Response (from va, off
 * bytes of len sent so far) or a control message (hdr is all of it). */
struct tcp_rsp {
	uint8_t hdr[sizeof(struct ddp_untagged_hdr) +
		    sizeof(struct rdmap_atomic_resp)];
	uint32_t hlen, len;
	uint64_t va, off;
	bool read;
	bool direct; /* va is in a direct MR */
};

/* Why a stream stays parked until our next send ends (tx_unpark): */
enum txp {
	TXP_NONE,
	TXP_SEND, /* a long send parked it; the sender then reads (tx_park) */
	/* A poll that received a message or a Write (tcp_poll); it waits for
	 * the application's answer, and ends as that send starts
	 * (tcp_execute), the unpark following the send. */
	TXP_RECV,
};

struct tcp_conn {
	struct urdma_watcher w;
	struct list_head node; /* in T.pending while being set up */
	int fd;
	_Atomic int state;
	bool crc;
	/* The QP lets go: a sender waiting for room gives up (tx_wait). */
	_Atomic bool closing;
	struct urdma_qp *qp;
	uint32_t local_qpn, peer_qpn;
	uint8_t src_gid[16]; /* active side: the address it connects from */
	uint64_t since_ns; /* when the current state began */
	struct sockaddr_in6 sa;
	pthread_mutex_t rx_lock, tx_lock, ord_lock;
	/* receive side, under rx_lock */
	uint8_t *rbuf;
	size_t rlen;
	uint32_t rx_msn[DDP_NUM_QN];
	bool rcv_active; /* a Send is being placed into receive rcv_idx */
	struct urdma_srq *rcv_srq; /* ... of this SRQ (or NULL), entry rcv_e */
	/* ... or of another process's XRC SRQ (rcv_xref, kept while
	 * messages name it) */
	struct urdma_shm_srq *rcv_xsrq;
	struct urdma_xsrq_ref rcv_xref;
	bool rcv_se;		   /* ... by a solicited message */
	uint32_t rx_recvs; /* receives completed (tcp_park.c looks) */
	struct urdma_shm_rqe *rcv_e;
	uint32_t rcv_idx;
	int rcv_n;
	struct urdma_span rcv_sp[URDMA_MAX_SGE];
	uint64_t rcv_room, rcv_got;
	bool imm_pending;
	uint32_t imm;
	/* receives completed in this pass: their CQ is notified at its end
	 * (rx_locked), after the requests that came with them are queued */
	bool note, note_solicited;
	uint64_t write_len, last_write_len;
	/* UC drops what it can't take: the rest of a Send (rx_dropping),
	 * a Write's segments (write_dropped, then last_write_dropped for its
	 * Immediate Data). */
	bool rx_dropping, write_dropped, last_write_dropped;
	/* An XRC target's: the PDs of its domain's XRC SRQs in its context,
	 * as of XRC SRQ generation xpds_gen (tcp_rx.c: remote_access) */
	uint32_t xpds[URDMA_XRC_PDS], xpds_gen;
	int nxpds;
	_Atomic bool stalled; /* a Send waits for a receive WR */
	_Atomic uint64_t last_poll_ns; /* an application thread polled */
	uint64_t rx_bytes;     /* received so far (rx_lock) */
	uint32_t rx_writes;    /* Writes placed whole (rx_lock) */
	uint32_t rx_msgs;      /* messages of any kind taken whole (rx_lock) */
	unsigned quiet_polls;  /* application polls that took no message */
	unsigned idle_polls;   /* the same, however far apart */
	/* Until then (urdma_now_ns), a receiving poll unparks at once: its
	 * application left a TXP_RECV park to tcp_maintain while bytes came
	 * that it did not read, so it does not answer what it receives (it
	 * spins on memory for more).  For SPINS_NS only (rx_lock). */
	uint64_t spins_until;
	/* The progress thread does not watch for data: the application
	 * polls (conn_park, under rx_lock). */
	_Atomic bool parked;
	/* Parked until our next send ends (enum txp, under rx_lock). */
	_Atomic uint8_t tx_parked;
	/* send side, under tx_lock */
	uint32_t tx_msn[DDP_NUM_QN];
	/* FPDUs to send with the next message, in the same write: before
	 * its start (a Send's Immediate Data), after its end (a Write's
	 * Immediate Data, then a flush Read): tx_msg. */
	struct tx_seg tx_head, tx_tail[TX_TAILS];
	uint8_t ntail;
	/* WRs follow this one in the engine's run: its last write goes with
	 * MSG_MORE (tx_msg), and corked says so until tcp_flush pushes. */
	bool tx_more;
	_Atomic bool corked;
	/* Small messages held back for the next write (tx_hold): whole
	 * FPDUs, hold_off of hold_len bytes of them sent; held says there
	 * are some, for a look without tx_lock.  last_tx_ns: when the last
	 * write ended. */
	uint8_t *hold;
	uint32_t hold_len, hold_off;
	_Atomic bool held;
	uint64_t last_tx_ns;
	uint8_t tx_buf[TX_GATHER]; /* a small write, as one buffer (tx_flat) */
	/*
	 * A message a full socket cut (tx_cut, tx_wait): rest_off of the
	 * rest_len bytes of the write it cut, kept in rest (rest_cap
	 * allocated), then, with rest_job_on, its FPDUs from rest_job.off
	 * on.  The sender went back to its application, which may post the
	 * receives the peer's Sends wait for: two sides each inside
	 * ibv_post_send, each waiting for the other to read, neither
	 * reading, was a deadlock (qperf rc_bi_bw).  The progress thread
	 * sends the rest when there is room (conn_cb), or the next WR's
	 * execution does; nothing else goes before it (tx_rest_push).
	 * resting says there is one, for a look without tx_lock.
	 */
	uint8_t *rest;
	uint32_t rest_len, rest_off, rest_cap;
	struct tx_job rest_job;
	bool rest_job_on;
	uint8_t tx_cut; /* enum txc, for the send under way */
	_Atomic bool resting;
	/* The unsent end of an FPDU that a non-blocking write cut: it goes
	 * before anything else. */
	uint8_t *res;
	uint32_t res_off, res_len;
	/* Responses, in order (rsp_lock; sent under tx_lock, rsp_pump).
	 * rsp_n counts them and a cut FPDU, rsp_data those with data (Read
	 * Responses: tx_msg).  rsp_due: when the oldest must go at the latest
	 * (rsp_push). */
	pthread_mutex_t rsp_lock;
	struct tcp_rsp *rsp;
	uint32_t rsp_head, rsp_tail, rsp_size;
	_Atomic uint32_t rsp_n, rsp_data;
	_Atomic uint64_t rsp_due;
	uint64_t rx_hold_ns; /* what this receive pass holds answers for */
	bool rx_answer; /* this pass queued an answer due now (rx_answers) */
	/* The progress thread watches for room to send them (EPOLLOUT);
	 * the watch's events change under watch_lock (conn_watch). */
	_Atomic bool want_out;
	pthread_mutex_t watch_lock;
	/* A write gave up inside an FPDU: the stream takes nothing more. */
	_Atomic bool tx_broken;
	/* The stream's end once given up (conn_shut): the Terminate the
	 * receive path framed (term_off of its term_len bytes sent), then
	 * the FIN; whoever has tx_lock sends them (tx_fin). */
	uint8_t term[sizeof(((struct tx_seg *)0)->hdr) + 8];
	uint32_t term_len, term_off, term_ctrl;
	_Atomic bool fin_want;
	unsigned timeout_ms; /* TCP_USER_TIMEOUT set, + 1 (0: never set) */
	/* outstanding Reads and atomics, unconfirmed messages: ord_lock */
	struct tcp_ord ord[URDMA_MAX_RD_ATOM];
	uint32_t next_tag;
	struct tcp_unc *unc;
	uint32_t unc_head, unc_tail, unc_size;
	/* failure */
	_Atomic bool dead;
	uint64_t dead_ns; /* when it was found dead */
	/* found dead by a timeout (conn_set_dead_err): the retry budget has
	 * passed already, the WRs fail at once (no loss grace) */
	_Atomic bool timed_out;
	bool dead_handled;
	/* A WR, or the QP, failed for it already: WRs that find it dead from
	 * now on are flushed.  Not so when tcp_maintain's timer found no
	 * unconfirmed message: the next WR to find it is the one that fails
	 * with RETRY_EXC_ERR (tcp_execute, or urdma_qp_lost, whichever runs
	 * first). */
	_Atomic bool dead_reported;
	bool shut; /* given up (conn_shut): what arrives is dropped */
	/* tcp_maintain's watch on the oldest unconfirmed message */
	uint32_t watch_head;
	uint64_t watch_ns;
};

struct tcp_qp_reg {
	struct urdma_qp *qp;
	bool taken;
	bool ready; /* passive side at RTR, waiting for peer_qpn */
	uint32_t peer_qpn;
};

struct tcp_listener {
	struct urdma_watcher w;
	bool closed; /* retired; an event already fetched finds this */
	int fd;
	uint16_t port;
	int nqps;
	struct tcp_qp_reg reg[256];
};

/* The transport's own state: listeners, connections being set up. */
struct tcp_globals {
	pthread_mutex_t lock;
	struct tcp_listener *ls[256];
	struct list_head pending; /* accepted conns being set up */
	atomic_bool paused;	  /* listeners not accepting (pending_admit) */
	_Atomic uint64_t look_ns; /* while paused: pending_admit by then */
	/* When a stream of ours last came up (tcp_setup_moving) */
	_Atomic uint64_t moved_ns;
};
extern struct tcp_globals T;

bool tcp_setup_moving(const struct urdma_qp *qp);

/*
 * How long answers to flushes wait for a message of ours to ride with.
 * Taken by the application's poll: the application is about to see what
 * came and will likely answer; up to HOLD_APP_NS, as a shorter time would
 * wake the progress thread (asleep for 2 ms between passes over a parked
 * stream) for nearly every message.  Taken by the progress thread while
 * the application polls (it may be spinning on memory for a Write):
 * HOLD_NEAR_NS, the progress thread's own timer.  Sent on its own, the
 * answer would complete the peer's message before ours comes, so the peer
 * leaves its poll to spin on memory and our message finds nobody polling:
 * the progress thread takes it, answers it on its own, and so on.
 * Otherwise (nobody polls, or sleeps on the CQ) nobody will answer: now.
 */
#define HOLD_APP_NS 2000000ull
/* How often tcp_maintain looks at a parked stream (the progress thread's
 * pass while something is pending). */
#define PARK_LOOK_NS 2000000ull
/* A send at least this long parks the stream for its length (tx_park). */
#define TX_PARK_MIN (128 * 1024)
#define HOLD_NEAR_NS 50000ull

/* tcp_conn.c */
bool tcp_want_crc(void);
struct tcp_listener *tcp_listener_of(uint32_t qpn);
/* QP numbers: (listening port << 8 | index), the ops' qpn_* hooks. */
int tcp_qpn_reserve(uint32_t *qpn);
void tcp_qpn_bind(struct urdma_qp *qp);
void tcp_qpn_release(uint32_t qpn);
void tcp_set_sock_opts(int fd);
struct tcp_conn *conn_new(int fd);
void conn_release(struct urdma_watcher *w);
void conn_bury(struct tcp_conn *c);
void conn_set_dead(struct tcp_conn *c, const char *why);
void conn_set_dead_err(struct tcp_conn *c, int err);
/* tcp_frame.c */
uint32_t seg_open(struct tcp_conn *c, struct tx_seg *s,
			 const uint8_t *hdr, uint32_t hlen, uint32_t plen,
			 uint64_t off, bool last);
void seg_close(struct tcp_conn *c, struct tx_seg *s, uint32_t crc);
int tcp_frame(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
		 const struct urdma_span *sp, int nsp, uint64_t len,
		 uint64_t *off, bool *end, struct tx_seg *seg, int maxseg,
		 struct iovec *iov, int *niov, int *fiov);
/* An untagged control message with a fixed body (an RDMAP struct: at most
 * CTRL_BODY bytes) into h, its MSN taken now: its length. */
uint32_t tcp_ctrl_put(struct tcp_conn *c, uint8_t *h, unsigned op,
		      uint32_t qn, const void *body, uint32_t blen, uint32_t ulp);
/* tcp_tx.c */
int tx_wait(struct tcp_conn *c);
int rsp_push(struct tcp_conn *c, const struct tcp_rsp *r,
		    uint64_t hold_ns);
void conn_watch(struct tcp_conn *c);
void rsp_send(struct tcp_conn *c);
void rsp_send_due(struct tcp_conn *c);
void tx_unlock(struct tcp_conn *c);
void tx_hold_push(struct tcp_conn *c);
int tx_msg(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
		  const struct urdma_span *sp, int nsp, uint64_t len);
int tx_rest_push(struct tcp_conn *c);
void tx_rest_forget(struct tcp_conn *c);
void tx_rest_resume(struct tcp_conn *c);
uint32_t tcp_put_untagged_inv(uint8_t *h, unsigned op, uint32_t qn,
			      uint32_t msn, uint32_t inval_stag);
uint32_t tcp_put_untagged(uint8_t *h, unsigned op, uint32_t qn,
			     uint32_t msn);
uint32_t tcp_put_tagged(uint8_t *h, unsigned op, uint32_t stag,
			   uint64_t to);
int tx_ctrl(struct tcp_conn *c, unsigned op, uint32_t qn,
		   const void *body, uint32_t blen);
void term_frame(struct tcp_conn *c, uint32_t ctrl, const uint8_t *hdr,
		       uint32_t hdr_len);
void tx_fin(struct tcp_conn *c);
/* tcp_rx.c */
bool unc_alloc(struct tcp_conn *c, struct urdma_qp *qp);
void rcv_abandon(struct tcp_conn *c);
/* tcp_rx.c and tcp_recv.c: what handling a message gives, and the helpers
 * the receive path shares (under rx_lock). */
enum { RX_OK, RX_STALL, RX_ERR };
void rq_note(struct tcp_conn *c, bool solicited);
bool rq_enter(struct urdma_qp *qp);
int spans_put(struct urdma_peer *peer, const struct urdma_span *sp, int n,
	      uint64_t off, const uint8_t *src, uint64_t len);
int rx_send(struct tcp_conn *c, const struct iwarp_msg *m, uint32_t *term);
int rx_imm(struct tcp_conn *c, const struct iwarp_msg *m, uint32_t *term);
struct tcp_unc *unc_push(struct tcp_conn *c, uint32_t wr_idx,
				uint8_t kind, uint32_t msn);
void unc_settle(struct tcp_conn *c, uint32_t f, enum ibv_wc_status st);
void conn_shut(struct tcp_conn *c);
void rx_locked(struct tcp_conn *c, uint64_t hold_ns);
/* tcp_mpa.c */
void conn_sync_timeout(struct tcp_conn *c, struct urdma_qp *qp);
void conn_attach(struct tcp_conn *c, struct urdma_qp *qp);
void tcp_handshake(struct tcp_conn *c, uint32_t events);
int conn_start(struct tcp_conn *c);
/* tcp_park.c */
bool tcp_app_polling(struct tcp_conn *c);
bool tcp_cq_armed(struct tcp_conn *c);
uint64_t tcp_progress_hold_ns(struct tcp_conn *c);
void conn_park(struct tcp_conn *c, bool park);
bool tx_park(struct tcp_conn *c);
void tx_unpark(struct tcp_conn *c, bool wait);
void conn_cb(struct urdma_watcher *w, uint32_t events);
void conn_spins(struct tcp_conn *c);
void tcp_drain(struct urdma_qp *qp);
void tcp_poll(struct urdma_qp *qp, enum urdma_poll_hint hint);
void tcp_armed(struct urdma_qp *qp);
/* tcp_transport.c */
int tcp_peer_addr(struct urdma_qp *qp, const struct ibv_qp_attr *attr,
		     struct sockaddr_in6 *sa);
void tx_frame_ctrl(struct tcp_conn *c, struct tx_seg *s, unsigned op,
		   uint32_t qn, const void *body, uint32_t blen, uint32_t ulp);
enum urdma_tx tcp_execute(struct urdma_qp *qp, struct urdma_swqe *w,
				 enum ibv_wc_status *status);
bool tcp_maintain(struct urdma_qp *qp);
void tcp_tick(void);
void tcp_release(struct urdma_qp *qp);
void tcp_flush(struct urdma_qp *qp);
extern __thread struct tcp_conn *rx_owner; /* tcp_rx.c */

#endif
