// SPDX-License-Identifier: MIT
/*
 * Peers: the other urdma contexts on this host we share memory with (or
 * one of our own).  A peer is reached over its context's socket
 * (core/host.c), which hands over its MR table and its identity memfd in a
 * hello and later says when the peer is gone; both are mapped here, and
 * urdma_peer_ptr() turns an address in the peer into one of ours.
 *
 * Direct MRs of a peer (not in its memfd, core/backing.c) are reached
 * with process_vm_readv/writev on its pid, as the kernel's ptrace rules
 * allow (same user; Yama's ptrace_scope may refuse).  A pidfd, opened
 * while the connection proves the process alive, is polled first (once a
 * millisecond at most), so a pid the peer's death set free is never
 * written to.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/fdpoll.h"
#include "util/log.h"

/* A peer context, reached over its socket (or ourselves: sock -1). */
enum { PEER_CONNECTING, PEER_READY, PEER_FAILED };

struct urdma_peer {
	struct urdma_watcher w; /* the socket: the hello, then a hang-up */
	struct list_head node;	/* in peers, under urdma_proc.lock */
	uint32_t ctx_id;
	pid_t pid;
	int pidfd; /* -1 for our own contexts */
	_Atomic uint64_t alive_at; /* when pidfd last said it runs (ns) */
	int refcnt; /* under urdma_proc.lock */
	int sock;
	int memfd;
	_Atomic int state;
	_Atomic bool dead;
	const struct urdma_shm_ctx *mrs; /* mapped read-only */
	pthread_mutex_t lock;		 /* the hello, the windows */
	struct urdma_wintab win;
};

static struct list_head peers = LIST_HEAD_INIT(peers);

/* The child of a fork: the parent's peers are not ours (their sockets
 * closed, so that they tell the parent's peers nothing wrong). */
void urdma_peer_atfork_child(void)
{
	struct urdma_peer *p;

	list_for_each_entry(p, &peers, node) {
		if (p->pidfd >= 0)
			close(p->pidfd);
		if (p->sock >= 0) {
			close(p->sock);
			close(p->memfd);
		}
	}
	list_init(&peers);
}

/* Our own context ctx_id closed (under urdma_proc.lock): QPs of ours
 * connected to it see it go, as others do when the socket hangs up. */
void urdma_peer_own_closed(uint32_t ctx_id)
{
	struct urdma_peer *p;

	list_for_each_entry(p, &peers, node)
		if (p->sock < 0 && p->ctx_id == ctx_id)
			atomic_store(&p->dead, true);
}

static int peer_wait_locked(struct urdma_peer *p, int timeout_ms);

static void peer_release(struct urdma_watcher *w)
{
	struct urdma_peer *p = (struct urdma_peer *)w;

	urdma_wintab_release(&p->win);
	if (p->pidfd >= 0)
		close(p->pidfd);
	if (p->sock >= 0) {
		close(p->sock);
		if (p->memfd >= 0)
			close(p->memfd);
	}
	if (p->mrs)
		munmap((void *)p->mrs, sizeof(*p->mrs));
	pthread_mutex_destroy(&p->lock);
	urdma_free(p);
}

/* The socket: the hello when it comes (if nobody waits for it), then a
 * hang-up when the peer goes.  Progress thread. */
static void peer_cb(struct urdma_watcher *w, uint32_t events)
{
	struct urdma_peer *p = (struct urdma_peer *)w;

	int state = atomic_load(&p->state);

	if (state == PEER_CONNECTING && !pthread_mutex_trylock(&p->lock)) {
		peer_wait_locked(p, 0);
		pthread_mutex_unlock(&p->lock);
	} else if (state == PEER_READY) {
		char buf[64];

		/* A peer sends nothing after its hello: drop it. */
		for (int i = 0; i < 64; i++)
			if (recv(p->sock, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
				break;
	}
	if (state == PEER_FAILED ||
	    (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
		urdma_dbg("peer context %x (process %d) is gone", p->ctx_id,
			  (int)p->pid);
		atomic_store(&p->dead, true);
		urdma_progress_unwatch(p->sock);
	}
}

static int fd_sealed(int fd, uint64_t size)
{
	int seals = fcntl(fd, F_GET_SEALS);
	struct stat st;

	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
				 (F_SEAL_SHRINK | F_SEAL_GROW) ||
	    fstat(fd, &st) || (uint64_t)st.st_size != size)
		return -EPROTO;
	return 0;
}

/* Take the hello: check it and the two fds, map the MR table.  Under
 * p->lock.  0, -EAGAIN (not there yet), or another -errno (failed). */
static int peer_hello(struct urdma_peer *p)
{
	struct urdma_hello h;
	union {
		char buf[CMSG_SPACE(sizeof(int) * (URDMA_HELLO_FDS + 4))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = &h, .iov_len = sizeof(h) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	int fds[URDMA_HELLO_FDS + 4], nfds = 0, ret = 0;
	const struct urdma_shm_ctx *mrs;
	ssize_t n;

	n = recvmsg(p->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return -EAGAIN;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n >= 0 && c;
	     c = CMSG_NXTHDR(&m, c)) {
		size_t k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		if (nfds + k > URDMA_HELLO_FDS + 4)
			k = URDMA_HELLO_FDS + 4 - nfds;
		memcpy(fds + nfds, CMSG_DATA(c), k * sizeof(int));
		nfds += k;
	}
	if (n != sizeof(h) || (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) ||
	    h.magic != URDMA_SHM_MAGIC || h.version != URDMA_SHM_VERSION ||
	    h.ctx_id != p->ctx_id || h.nfds != URDMA_HELLO_FDS ||
	    nfds != URDMA_HELLO_FDS) {
		ret = n < 0 ? -errno : -EPROTO;
		goto out;
	}
	ret = fd_sealed(fds[0], sizeof(*mrs));
	if (!ret)
		ret = fd_sealed(fds[1], 1ULL << URDMA_VA_BITS);
	if (ret)
		goto out;
	mrs = mmap(NULL, sizeof(*mrs), PROT_READ, MAP_SHARED, fds[0], 0);
	if (mrs == MAP_FAILED) {
		ret = -errno;
		goto out;
	}
	if (mrs->magic != URDMA_SHM_MAGIC || mrs->version != URDMA_SHM_VERSION ||
	    mrs->ctx_id != p->ctx_id) {
		munmap((void *)mrs, sizeof(*mrs));
		ret = -EPROTO;
		goto out;
	}
	p->mrs = mrs;
	p->memfd = fds[1];
	nfds = 1; /* fds[0] is closed below; the mapping stays */
	atomic_store(&p->state, PEER_READY);
out:
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (ret && ret != -EAGAIN) {
		urdma_warn("peer context %x (process %d): bad hello: %s",
			   p->ctx_id, (int)p->pid, strerror(-ret));
		atomic_store(&p->state, PEER_FAILED);
	}
	return ret;
}

static int peer_wait_locked(struct urdma_peer *p, int timeout_ms)
{
	uint64_t end = urdma_now_ns() + (uint64_t)timeout_ms * 1000000;
	int ret;

	switch (atomic_load_explicit(&p->state, memory_order_acquire)) {
	case PEER_READY:
		return 0;
	case PEER_FAILED:
		return -ECONNREFUSED;
	}
	for (;;) {
		struct pollfd pf = { .fd = p->sock, .events = POLLIN };
		int64_t left = (int64_t)(end - urdma_now_ns());

		ret = peer_hello(p);
		if (ret != -EAGAIN || left <= 0)
			return ret;
		poll(&pf, 1, (int)(left / 1000000) + 1);
	}
}

/* Wait up to timeout_ms for the peer's hello: 0 ready, -EAGAIN not yet,
 * another -errno if it failed. */
int urdma_peer_wait(struct urdma_peer *p, int timeout_ms)
{
	int ret;

	if (urdma_peer_ready(p))
		return 0;
	pthread_mutex_lock(&p->lock);
	ret = peer_wait_locked(p, timeout_ms);
	pthread_mutex_unlock(&p->lock);
	return ret;
}

/* Connect to ctx-<id>: a socket of ours, listened on by our own user. */
static int peer_connect(struct urdma_peer *p)
{
	p->sock = urdma_host_ctx_connect(p->ctx_id);
	if (p->sock < 0)
		return p->sock;
	if (!urdma_host_peer_is_us(p->sock, &p->pid))
		return -EPERM;
	/* The listener's process, still there: its end of the connection
	 * is open (it would be reset otherwise). */
	p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
	if (p->pidfd >= 0 && urdma_poll_fd(p->sock, POLLRDHUP, 0) != 0) {
		close(p->pidfd);
		p->pidfd = -1;
	}
	if (p->pidfd < 0)
		urdma_info("context %x: process %d can't be watched: its "
			   "direct memory regions are out of reach", p->ctx_id,
			   (int)p->pid);
	return 0;
}

/* Our live peer for ctx_id, or NULL.  Under urdma_proc.lock. */
static struct urdma_peer *peer_find(uint32_t ctx_id)
{
	struct urdma_peer *p;

	list_for_each_entry(p, &peers, node)
		if (p->ctx_id == ctx_id && !atomic_load(&p->dead) &&
		    atomic_load(&p->state) != PEER_FAILED)
			return p;
	return NULL;
}

struct urdma_peer *urdma_peer_get(uint32_t ctx_id)
{
	struct urdma_peer *p;
	int own, ret;

	pthread_mutex_lock(&urdma_proc.lock);
	p = peer_find(ctx_id);
	if (p) {
		p->refcnt++;
		pthread_mutex_unlock(&urdma_proc.lock);
		return p;
	}
	p = urdma_zalloc(sizeof(*p));
	if (!p) {
		pthread_mutex_unlock(&urdma_proc.lock);
		return NULL;
	}
	p->ctx_id = ctx_id;
	p->refcnt = 1;
	p->sock = p->memfd = p->pidfd = -1;
	p->w.fn = peer_cb;
	p->w.release = peer_release;
	pthread_mutex_init(&p->lock, NULL);
	own = urdma_host_own_mrs(ctx_id);
	if (own >= 0) {
		/* One of our own contexts: no socket, our own memory; its MR
		 * table mapped again, so that it outlives the context. */
		p->pid = getpid();
		p->mrs = mmap(NULL, sizeof(*p->mrs), PROT_READ, MAP_SHARED,
			      own, 0);
		if (p->mrs == MAP_FAILED) {
			ret = errno;
			p->mrs = NULL;
			pthread_mutex_unlock(&urdma_proc.lock);
			peer_release(&p->w);
			errno = ret;
			return NULL;
		}
		p->memfd = urdma_proc.memfd;
		atomic_store(&p->state, PEER_READY);
	} else {
		ret = peer_connect(p);
		if (ret) {
			urdma_info("can't reach context %x on this host: %s",
				   ctx_id, strerror(-ret));
			pthread_mutex_unlock(&urdma_proc.lock);
			peer_release(&p->w);
			errno = -ret;
			return NULL;
		}
	}
	list_add_tail(&p->node, &peers);
	pthread_mutex_unlock(&urdma_proc.lock);
	if (p->sock >= 0 &&
	    urdma_progress_watch_events(p->sock, EPOLLIN | EPOLLRDHUP,
					URDMA_WATCH_FN, &p->w, false))
		atomic_store(&p->dead, true);
	return p;
}

void urdma_peer_put(struct urdma_peer *p)
{
	bool last;

	if (!p)
		return;
	pthread_mutex_lock(&urdma_proc.lock);
	last = --p->refcnt == 0;
	if (last)
		list_del(&p->node);
	pthread_mutex_unlock(&urdma_proc.lock);
	if (!last)
		return;
	/* Freed by the progress thread between batches: an event already
	 * fetched may name it, and its own passes may be reading it. */
	urdma_progress_retire(p->sock, &p->w);
}

struct urdma_peer *urdma_peer_ref(struct urdma_peer *const *slot)
{
	struct urdma_peer *p;

	pthread_mutex_lock(&urdma_proc.lock);
	p = *slot;
	if (p)
		p->refcnt++;
	pthread_mutex_unlock(&urdma_proc.lock);
	return p;
}

void urdma_peer_set(struct urdma_peer **slot, struct urdma_peer *p)
{
	struct urdma_peer *old;

	pthread_mutex_lock(&urdma_proc.lock);
	old = *slot;
	*slot = p;
	pthread_mutex_unlock(&urdma_proc.lock);
	urdma_peer_put(old);
}

bool urdma_peer_known(uint32_t ctx_id)
{
	bool known;

	pthread_mutex_lock(&urdma_proc.lock);
	known = urdma_host_own_mrs(ctx_id) >= 0 || peer_find(ctx_id);
	pthread_mutex_unlock(&urdma_proc.lock);
	return known;
}

bool urdma_peer_dead(struct urdma_peer *p)
{
	return atomic_load_explicit(&p->dead, memory_order_relaxed);
}

pid_t urdma_peer_pid(struct urdma_peer *p)
{
	return p->pid;
}

bool urdma_peer_ready(struct urdma_peer *p)
{
	return atomic_load_explicit(&p->state, memory_order_acquire) ==
	       PEER_READY;
}

int urdma_peer_wake(struct urdma_peer *p)
{
	char c = 0;

	if (p->sock < 0) {
		urdma_progress_kick();
		return 0;
	}
	/* EAGAIN: the owner has bytes to read, so a wake-up is pending. */
	if (send(p->sock, &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
	    errno != EAGAIN)
		return -errno;
	return 0;
}

int urdma_mr_lookup(const struct urdma_shm_ctx *shm, uint32_t key,
		    uint64_t addr, uint64_t len, uint32_t access, uint32_t pd_id,
		    uint32_t via, uint64_t *va, bool *direct)
{
	const struct urdma_shm_mr *e = &shm->mr[URDMA_MR_IDX(key)];
	uint64_t iova, length, base;
	uint32_t acc, pd, flags, seq, qpn;

	seq = atomic_load_explicit(&e->seq, memory_order_acquire);
	if (!key || (seq & 1) ||
	    atomic_load_explicit(&e->key, memory_order_acquire) != key)
		return -EINVAL;
	iova = e->iova;
	length = e->length;
	base = e->va;
	acc = e->access;
	pd = e->pd_id;
	qpn = e->qpn;
	flags = atomic_load_explicit(&e->flags, memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&e->key, memory_order_relaxed) != key ||
	    atomic_load_explicit(&e->seq, memory_order_relaxed) != seq)
		return -EINVAL;
	/* A window is a remote key, and a type 2 one serves its QP only. */
	if ((flags & URDMA_MR_F_MW) &&
	    (via == URDMA_VIA_LOCAL || (qpn && qpn != via)))
		return -EINVAL;
	if (pd != pd_id || (acc & access) != access)
		return -EACCES;
	if (flags & URDMA_MR_F_UNMAPPED)
		return -EFAULT;
	if (addr < iova || len > length || addr - iova > length - len)
		return -ERANGE;
	*va = base + (addr - iova);
	*direct = flags & URDMA_MR_F_DIRECT;
	return 0;
}

bool urdma_peer_is_self(const struct urdma_peer *p)
{
	return !p || p->sock < 0;
}

int urdma_peer_vm(struct urdma_peer *p, bool write, void *local,
		  uint64_t remote, uint64_t n)
{
	struct iovec l = { .iov_base = local, .iov_len = n };
	struct iovec r = { .iov_base = (void *)(uintptr_t)remote,
			   .iov_len = n };
	static _Atomic bool told;
	uint64_t now = urdma_now_ns();
	ssize_t got;

	/* Asked at most once a millisecond (a poll costs about as much as
	 * the copy): the kernel hands out pids in turn, so a pid set free
	 * comes back only after all the others were taken, which takes far
	 * longer than that. */
	if (urdma_peer_dead(p) || p->pidfd < 0)
		return -ESRCH;
	if (now - atomic_load_explicit(&p->alive_at, memory_order_relaxed) >
	    1000000) {
		if (urdma_poll_fd(p->pidfd, POLLIN, 0))
			return -ESRCH; /* it exited: its pid may be another's */
		atomic_store_explicit(&p->alive_at, now, memory_order_relaxed);
	}
	got = write ? process_vm_writev(p->pid, &l, 1, &r, 1, 0)
		    : process_vm_readv(p->pid, &l, 1, &r, 1, 0);
	if (got < 0 && errno == EPERM && !atomic_exchange(&told, true))
		urdma_warn("process %d: the kernel refuses access to its "
			   "memory (ptrace rules: /proc/sys/kernel/yama/"
			   "ptrace_scope?): its direct memory regions are out "
			   "of reach", (int)p->pid);
	if (got < 0)
		return -errno;
	return (uint64_t)got == n ? 0 : -EFAULT;
}

const struct urdma_shm_ctx *urdma_peer_shm(struct urdma_peer *p)
{
	return p->mrs;
}

void *urdma_peer_ptr(struct urdma_peer *p, uint64_t va, uint64_t *avail)
{
	if (p->sock < 0)
		return urdma_self_ptr(va, avail);
	if (!urdma_peer_ready(p))
		return NULL;
	return urdma_wintab_ptr(&p->win, &p->lock, p->memfd, va, avail);
}

void *urdma_peer_block(struct urdma_peer *p, uint64_t va, uint64_t size,
		       uint32_t magic)
{
	const uint32_t *h;
	uint64_t avail;

	if (!va || (va & 4095) || va >> URDMA_VA_BITS)
		return NULL;
	h = urdma_peer_ptr(p, va, &avail);
	if (!h || avail < size || READ_ONCE(h[0]) != magic ||
	    READ_ONCE(h[1]) != URDMA_SHM_VERSION)
		return NULL;
	return (void *)h;
}
