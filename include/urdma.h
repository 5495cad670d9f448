/* SPDX-License-Identifier: MIT */
/*
 * The urdma API: RDMA connections, messages and one-sided operations in a
 * few calls.  Built only on the public verbs and rdma_cm APIs, so a program
 * runs on urdma's software device (`urdma run PROGRAM`) and on any RDMA NIC
 * with rdma-core.  urdma(7) is the overview; each call has its man page.
 *
 * Objects: a context (urdma_ctx: device, protection domain, one completion
 * queue, a pool of registered message buffers, one file descriptor) and its
 * connections (urdma_conn: an RC queue pair, or a listener).
 *
 * Model: calls never block, except urdma_wait (and urdma_poll with a
 * timeout).  What happens (a connection made, a message received, an
 * operation done, a connection closed) comes back as events from
 * urdma_poll, each with the connection and the user pointer given to the
 * call.  Once asked for, urdma_ctx_fd is readable whenever urdma_poll has
 * something to do: put it in epoll, libuv, libevent or io_uring, and call
 * urdma_poll when it is.  There is nothing to arm.  A blocking call polls
 * for up to spin_us before it sleeps (urdma_cfg).
 *
 * Errors: calls return 0 (or a count) or a negative errno; calls that
 * return a pointer return NULL and set errno.  urdma_strerror names them.
 * The library prints nothing unless asked: URDMA_LOG_LEVEL=info says why
 * connections fail (URDMA_LOG_FILE sends it to a file).
 *
 * Threads: a context is used by one thread at a time, unless it was made
 * with URDMA_CFG_THREADSAFE (then any thread may call anything; calls are
 * serialized by one lock).  Contexts share nothing: one per thread scales.
 */
#ifndef URDMA_API_H
#define URDMA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct urdma_ctx urdma_ctx;
typedef struct urdma_conn urdma_conn;
typedef struct urdma_mem urdma_mem;

/* Configuration: zero (or a NULL pointer) means the default, in brackets. */
typedef struct urdma_cfg {
	uint32_t queue_depth;	 /* messages in flight per connection, each
				  * way: receives posted, send credits (64) */
	uint32_t buf_size;	 /* the largest message, bytes; a
				  * connection's is the smaller of its two
				  * sides' (8192) */
	uint32_t buf_count;	 /* pool buffers at most, >= queue_depth
				  * (16384); the pool grows as needed */
	uint32_t inline_max;	 /* sends up to this size go inline, not
				  * copied into a pool buffer; less if the
				  * device takes less (128, or buf_size) */
	int connect_timeout_ms;	 /* resolve and connect (5000) */
	int op_timeout_ms;	 /* no answer from the peer for this long:
				  * the connection fails (2000, about) */
	const char *device;	 /* the RDMA device by name (the first) */
	uint32_t flags;		 /* URDMA_CFG_* */
	int spin_us;		 /* a blocking urdma_poll or urdma_wait
				  * polls the CQ this long before it
				  * sleeps; -1: never (0: 30, longer
				  * for waits that lately took up to
				  * 250, unless THREADSAFE) */
	uint32_t reserved[6];	 /* zero */
} urdma_cfg;

enum {
	URDMA_CFG_THREADSAFE = 1, /* any thread may call; one lock */
};

/* A region of a peer's memory, as urdma_reg describes it: plain bytes, in
 * the byte order of the machine that made it (little-endian on x86).
 * Send it to the peer any way (a message, the connect hello). */
typedef struct urdma_rmem {
	uint64_t addr;
	uint64_t len;
	uint32_t rkey;
	uint32_t access; /* URDMA_REMOTE_* */
} urdma_rmem;

/* urdma_reg's access: what peers may do, and whether urdma_read may read
 * into the region (LOCAL_WRITE; implied by REMOTE_WRITE and ATOMIC). */
enum {
	URDMA_REMOTE_READ = 1,
	URDMA_REMOTE_WRITE = 2,
	URDMA_REMOTE_ATOMIC = 4,
	URDMA_LOCAL_WRITE = 8,
};

enum urdma_event_type {
	URDMA_EV_ACCEPTED = 1, /* a listener's new connection (ev.conn);
				* buf/len: the peer's hello */
	URDMA_EV_CONNECTED,    /* urdma_connect succeeded; buf/len: hello */
	URDMA_EV_RECV,	       /* a message: buf (a pool buffer, now the
				* application's: urdma_buf_free or send it
				* back) and len */
	URDMA_EV_SEND,	       /* a send with a user pointer is done */
	URDMA_EV_WRITE,	       /* a write with a user pointer is done */
	URDMA_EV_READ,	       /* a read is done */
	URDMA_EV_ATOMIC,       /* an atomic is done; value: the old value */
	URDMA_EV_WRITABLE,     /* a send, write, read or atomic that got
				* -EAGAIN may go now */
	URDMA_EV_CLOSED,       /* the last event of a connection; status 0
				* for an orderly close by either side */
};

typedef struct urdma_event {
	int type;	  /* enum urdma_event_type */
	int status;	  /* 0 or a negative errno */
	urdma_conn *conn; /* whose event */
	void *user;	  /* the operation's user pointer, or the
			   * connection's for connection events */
	void *buf;	  /* RECV, ACCEPTED, CONNECTED */
	size_t len;
	uint64_t value;	  /* ATOMIC: the value before */
} urdma_event;

/* Contexts.  urdma_ctx_destroy closes what is open as urdma_close does
 * (for up to op_timeout_ms), then frees everything. */
urdma_ctx *urdma_ctx_create(const urdma_cfg *cfg);
void urdma_ctx_destroy(urdma_ctx *ctx);
int urdma_ctx_fd(urdma_ctx *ctx);
int urdma_poll(urdma_ctx *ctx, urdma_event *ev, int max, int timeout_ms);
int urdma_wait(urdma_ctx *ctx, urdma_conn *conn, int type, urdma_event *ev,
	       int timeout_ms);

/* Connections.  A host name is looked up with getaddrinfo(3), which may
 * block; a numeric address never does. */
urdma_conn *urdma_listen(urdma_ctx *ctx, const char *hostport,
			 const void *hello, size_t len, void *user);
urdma_conn *urdma_connect(urdma_ctx *ctx, const char *hostport,
			  const void *hello, size_t len, void *user);
void urdma_close(urdma_conn *conn);
void urdma_set_user(urdma_conn *conn, void *user);
void *urdma_user(const urdma_conn *conn);
int urdma_conn_port(const urdma_conn *conn);
/* The most hello bytes urdma_listen and urdma_connect carry. */
#define URDMA_HELLO_MAX 44

/* Messages */
void *urdma_buf_alloc(urdma_ctx *ctx);
void urdma_buf_free(urdma_ctx *ctx, void *buf);
size_t urdma_buf_size(const urdma_ctx *ctx);
int urdma_send(urdma_conn *conn, const void *buf, size_t len, void *user);

/* One-sided */
urdma_mem *urdma_reg(urdma_ctx *ctx, void *addr, size_t len, int access,
		     urdma_rmem *desc);
int urdma_dereg(urdma_mem *mem);
int urdma_write(urdma_conn *conn, const void *local, size_t len,
		const urdma_rmem *rm, uint64_t off, void *user);
int urdma_read(urdma_conn *conn, void *local, size_t len,
	       const urdma_rmem *rm, uint64_t off, void *user);
enum { URDMA_FADD = 1, URDMA_CAS = 2 };
int urdma_atomic(urdma_conn *conn, int op, const urdma_rmem *rm, uint64_t off,
		 uint64_t add_or_compare, uint64_t swap, void *user);

const char *urdma_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
