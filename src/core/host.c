// SPDX-License-Identifier: MIT
/*
 * The host: how the urdma processes of one user on this host find each
 * other: the host directory, the QP records, and our contexts' sockets.
 * The peers (other urdma contexts) we share memory with: core/peer.c.
 * Registered memory and the window tables: core/backing.c.
 *
 * Only processes of the same user share memory, and the kernel vouches for
 * each step (a process of another user is reached over TCP instead, see
 * transport/transport.c):
 *  - the host directory is the user's own: /dev/shm/urdma-<euid> (or
 *    URDMA_SHM_DIR), a directory owned by us that nobody else may write
 *    (checked, never followed through a link, else shared memory is off).
 *    Everything in it is opened relative to it, without following links,
 *    without blocking, and checked for type and owner.
 *  - each context listens on a Unix socket there, ctx-<id>.  A peer that
 *    connects is checked with SO_PEERCRED (our effective uid, on both
 *    sides) and gets, by SCM_RIGHTS, the context's MR table (a memfd sealed
 *    read-only for everyone but us) and the identity memfd (sealed against
 *    resizing, so no mapping of it can fault).  No path, pid or fd number
 *    that a file names is ever opened: a process can only hand over what it
 *    holds.
 *  - a QP publishes qp-<qpn> (struct urdma_qp_rec): its context and where
 *    its shared block is in that process's memfd; an XRC SRQ, srq-<srqn>,
 *    the same.  A record is a hint: what it leads to is checked
 *    (urdma_shm_qp_check, urdma_shm_srq_check) before use.
 * The connection also carries wake-ups (a byte) and says when the peer is
 * gone (hang-up: its process died or it closed the context), so staleness
 * is certain: a ctx-<id> nobody listens on refuses connections, and the
 * records naming it are stale too (urdma_host_sweep).

 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/host_dir.h"
#include "util/log.h"

/* Our side of a context: its socket, MR table and connected peers. */
struct urdma_host_ctx {
	struct urdma_watcher w; /* the listening socket */
	struct list_head node;	/* in hctxs, under urdma_proc.lock */
	int lfd;
	int mrs_fd;
	uint32_t ctx_id;
	pthread_mutex_t lock; /* guests */
	struct list_head guests;
	int nguests;
	bool closed;
};

/* A peer connected to one of our contexts; what it writes wakes us. */
struct guest {
	struct urdma_watcher w;
	struct list_head node;
	struct urdma_host_ctx *hc;
	int fd;
};

#define MAX_GUESTS 4096 /* connections a context accepts at a time */

struct urdma_proc urdma_proc = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.memfd = -1,
	.dirfd = -1,
};

static struct list_head hctxs = LIST_HEAD_INIT(hctxs);
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static int host_err;

uint32_t urdma_random32(void)
{
	uint32_t r;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint32_t)urdma_now_ns() * 2654435761u;
	return r;
}

/* Contexts, peers and the progress thread belong to the parent; so do the
 * sockets (closed, so that they tell the parent's peers nothing wrong). */
static void host_atfork_child(void)
{
	urdma_peer_atfork_child();
	list_init(&hctxs);
	pthread_mutex_init(&urdma_proc.lock, NULL);
}

/*
 * Open the host directory: ours, and writable by nobody else.  A directory
 * another user made (or a link to one) is refused: shared memory is then
 * off for this process, and local peers are reached over TCP.
 */
static int host_dir_open(void)
{
	struct stat st = { 0 };
	int fd;

	urdma_host_dir_path(urdma_proc.dir, sizeof(urdma_proc.dir));
	fd = urdma_private_dir_open(urdma_proc.dir, &st);
	if (fd == -EPERM)
		urdma_err("%s belongs to uid %u with mode %o, not to uid %u "
			  "alone: shared memory is off (remove it, or set "
			  "URDMA_SHM_DIR)",
			  urdma_proc.dir, (unsigned)st.st_uid,
			  (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
	else if (fd < 0)
		urdma_err("can't open %s: %s; shared memory is off",
			  urdma_proc.dir, strerror(-fd));
	return fd;
}

static void host_setup(void)
{
	urdma_log_init();
	urdma_proc.dirfd = host_dir_open();
	pthread_atfork(NULL, NULL, host_atfork_child);
}

int urdma_host_init(void)
{
	pthread_once(&host_once, host_setup);
	return host_err;
}

bool urdma_host_shm_ok(void)
{
	return urdma_proc.dirfd >= 0;
}

/* A name in the host directory as a path for bind and connect (which have
 * no *at form): through our directory fd, whatever the directory's path. */
static socklen_t host_sun(struct sockaddr_un *sa, const char *name)
{
	*sa = (struct sockaddr_un){ .sun_family = AF_UNIX };
	snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s",
		 urdma_proc.dirfd, name);
	return sizeof(*sa);
}

/* Open a regular file of ours in the directory, not following links and
 * never blocking (a FIFO planted there is refused, not waited on). */
static int host_open_file(const char *name, int flags, struct stat *st)
{
	int fd = openat(urdma_proc.dirfd, name,
			flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	if (fstat(fd, st) || !S_ISREG(st->st_mode) ||
	    st->st_uid != geteuid()) {
		close(fd);
		return -EPERM;
	}
	return fd;
}

/* ---- records: qp-<qpn>, and srq-<srqn> of XRC SRQs ---- */

int urdma_host_rec_publish(const char *kind, uint32_t num, uint32_t ctx_id,
			   uint64_t va, uint64_t size)
{
	struct urdma_qp_rec rec = {
		.magic = URDMA_SHM_MAGIC,
		.version = URDMA_SHM_VERSION,
		.qpn = num,
		.ctx_id = ctx_id,
		.va = va,
		.size = size,
	};
	char tmp[64], name[64];
	int fd, ret = 0;

	if (!urdma_host_shm_ok())
		return 0;
	snprintf(tmp, sizeof(tmp), "tmp-%x-%x", (unsigned)getpid(),
		 urdma_random32());
	snprintf(name, sizeof(name), "%s-%x", kind, num);
	fd = openat(urdma_proc.dirfd, tmp,
		    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, &rec, sizeof(rec)) != sizeof(rec))
		ret = -EIO;
	close(fd);
	/* Whole, or not there at all: a reader never sees half a record. */
	if (!ret && renameat2(urdma_proc.dirfd, tmp, urdma_proc.dirfd, name,
			      RENAME_NOREPLACE))
		ret = -errno;
	if (ret == -EEXIST && urdma_host_rec_stale(kind, num)) {
		urdma_dbg("removing stale %s", name);
		unlinkat(urdma_proc.dirfd, name, 0);
		if (!renameat2(urdma_proc.dirfd, tmp, urdma_proc.dirfd, name,
			       RENAME_NOREPLACE))
			ret = 0;
	}
	if (ret)
		unlinkat(urdma_proc.dirfd, tmp, 0);
	return ret;
}

void urdma_host_rec_unpublish(const char *kind, uint32_t num)
{
	char name[64];

	if (!urdma_host_shm_ok())
		return;
	snprintf(name, sizeof(name), "%s-%x", kind, num);
	unlinkat(urdma_proc.dirfd, name, 0);
}

int urdma_host_rec_find(const char *kind, uint32_t num,
			struct urdma_qp_rec *rec)
{
	char name[64];
	struct stat st;
	int fd;
	ssize_t n;

	if (!urdma_host_shm_ok())
		return -ENOENT;
	snprintf(name, sizeof(name), "%s-%x", kind, num);
	fd = host_open_file(name, O_RDONLY, &st);
	if (fd < 0)
		return fd == -ENOENT ? fd : -EPERM;
	n = st.st_size == sizeof(*rec) ? pread(fd, rec, sizeof(*rec), 0) : -1;
	close(fd);
	if (n != sizeof(*rec) || rec->magic != URDMA_SHM_MAGIC ||
	    rec->version != URDMA_SHM_VERSION || rec->qpn != num)
		return -EINVAL;
	return 0;
}

int urdma_host_qp_publish(uint32_t qpn, uint32_t ctx_id, uint64_t va,
			  uint64_t size)
{
	return urdma_host_rec_publish("qp", qpn, ctx_id, va, size);
}

void urdma_host_qp_unpublish(uint32_t qpn)
{
	urdma_host_rec_unpublish("qp", qpn);
}

int urdma_host_qp_find(uint32_t qpn, struct urdma_qp_rec *rec)
{
	return urdma_host_rec_find("qp", qpn, rec);
}

/* ---- contexts: the socket, the MR table, the peers that connect ---- */

static void guest_release(struct urdma_watcher *w)
{
	struct guest *g = (struct guest *)w;

	close(g->fd);
	urdma_free(g);
}

/* Under hc->lock. */
static void guest_drop(struct guest *g)
{
	list_del(&g->node);
	g->hc->nguests--;
	urdma_progress_retire(g->fd, &g->w);
}

/* A byte from a peer: a wake-up, which the progress thread's pass after
 * this batch acts on.  A hang-up: the peer let go of us. */
static void guest_cb(struct urdma_watcher *w, uint32_t events)
{
	struct guest *g = (struct guest *)w;
	char buf[64];

	for (int i = 0; i < 64; i++) /* the rest on the next event */
		if (recv(g->fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
			break;
	if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) {
		pthread_mutex_lock(&g->hc->lock);
		if (!g->hc->closed)
			guest_drop(g);
		pthread_mutex_unlock(&g->hc->lock);
	}
}

/* Check a connected Unix socket's other end: our own effective uid. */
bool urdma_host_peer_is_us(int fd, pid_t *pid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) ||
	    cr.uid != geteuid())
		return false;
	*pid = cr.pid;
	return true;
}

static int send_hello(struct urdma_host_ctx *hc, int fd)
{
	struct urdma_hello h = {
		.magic = URDMA_SHM_MAGIC,
		.version = URDMA_SHM_VERSION,
		.ctx_id = hc->ctx_id,
		.nfds = URDMA_HELLO_FDS,
	};
	union {
		char buf[CMSG_SPACE(sizeof(int) * URDMA_HELLO_FDS)];
		struct cmsghdr align;
	} u = { 0 };
	struct iovec iov = { .iov_base = &h, .iov_len = sizeof(h) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	int fds[URDMA_HELLO_FDS] = { hc->mrs_fd, urdma_proc.memfd };

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	return sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == sizeof(h) ? 0 :
									  -errno;
}

static void listener_cb(struct urdma_watcher *w, uint32_t events)
{
	struct urdma_host_ctx *hc = (struct urdma_host_ctx *)w;
	static _Atomic bool warned;

	for (;;) {
		struct guest *g;
		pid_t pid;
		int fd = accept4(hc->lfd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		if (!urdma_host_peer_is_us(fd, &pid)) {
			/* Only possible with the directory's permissions
			 * changed under us: nothing is handed over. */
			if (!atomic_exchange(&warned, true))
				urdma_warn("context %x: refused a connection "
					   "from another user", hc->ctx_id);
			close(fd);
			continue;
		}
		g = urdma_zalloc(sizeof(*g));
		pthread_mutex_lock(&hc->lock);
		if (!g || hc->closed || hc->nguests >= MAX_GUESTS ||
		    send_hello(hc, fd)) {
			pthread_mutex_unlock(&hc->lock);
			if (g && hc->nguests >= MAX_GUESTS)
				urdma_warn("context %x: %d peers connected, "
					   "refusing process %d",
					   hc->ctx_id, MAX_GUESTS, (int)pid);
			urdma_free(g);
			close(fd);
			continue;
		}
		g->w.fn = guest_cb;
		g->w.release = guest_release;
		g->hc = hc;
		g->fd = fd;
		list_add_tail(&g->node, &hc->guests);
		hc->nguests++;
		if (urdma_progress_watch_events(fd, EPOLLIN | EPOLLRDHUP,
						URDMA_WATCH_FN, &g->w, false))
			guest_drop(g);
		pthread_mutex_unlock(&hc->lock);
	}
}

static void hctx_release(struct urdma_watcher *w)
{
	struct urdma_host_ctx *hc = (struct urdma_host_ctx *)w;

	if (hc->lfd >= 0)
		close(hc->lfd);
	pthread_mutex_destroy(&hc->lock);
	urdma_free(hc);
}

/* The MR table: a memfd that we map writable, then seal so that nobody
 * can map it writable again (peers get it read-only) or resize it. */
static int mrs_create(struct urdma_context *uctx, int *fdp)
{
	int fd = memfd_create("urdma-mrs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, sizeof(struct urdma_shm_ctx)))
		goto err;
	p = mmap(NULL, sizeof(struct urdma_shm_ctx), PROT_READ | PROT_WRITE,
		 MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto err;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
				       F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)) {
		munmap(p, sizeof(struct urdma_shm_ctx));
		goto err;
	}
	uctx->shm = p;
	*fdp = fd;
	return 0;
err:
	close(fd);
	return -errno;
}

/* Listen on ctx-<id>, for a fresh random id: bound under a temporary name
 * and renamed when it listens, so a ctx-<id> that refuses connections is
 * certainly stale. */
static int hctx_listen(struct urdma_host_ctx *hc, uint32_t *id)
{
	struct sockaddr_un sa;
	char tmp[64], name[64];

	for (int tries = 0; tries < 64; tries++) {
		uint32_t r = urdma_random32() & 0x7fffffff;

		if (r < 2)
			continue;
		snprintf(tmp, sizeof(tmp), "tmp-%x-%x", (unsigned)getpid(), r);
		snprintf(name, sizeof(name), "ctx-%x", r);
		hc->lfd = socket(AF_UNIX,
				 SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC,
				 0);
		if (hc->lfd < 0)
			return -errno;
		if (bind(hc->lfd, (struct sockaddr *)&sa, host_sun(&sa, tmp)) ||
		    listen(hc->lfd, 128)) {
			int err = -errno;

			close(hc->lfd);
			unlinkat(urdma_proc.dirfd, tmp, 0);
			return err;
		}
		if (!renameat2(urdma_proc.dirfd, tmp, urdma_proc.dirfd, name,
			       RENAME_NOREPLACE)) {
			*id = r;
			return 0;
		}
		unlinkat(urdma_proc.dirfd, tmp, 0);
		close(hc->lfd);
		hc->lfd = -1;
		if (errno != EEXIST)
			return -errno;
	}
	return -EAGAIN;
}

int urdma_host_ctx_open(struct urdma_context *uctx)
{
	struct urdma_host_ctx *hc = urdma_zalloc(sizeof(*hc));
	int ret, memfd = urdma_memfd();

	if (!hc)
		return -ENOMEM;
	if (memfd < 0) {
		urdma_free(hc);
		return memfd;
	}
	hc->lfd = -1;
	pthread_mutex_init(&hc->lock, NULL);
	list_init(&hc->guests);
	hc->w.fn = listener_cb;
	hc->w.release = hctx_release;
	ret = mrs_create(uctx, &hc->mrs_fd);
	if (ret)
		goto err_free;
	if (urdma_host_shm_ok()) {
		ret = hctx_listen(hc, &uctx->ctx_id);
		if (ret) {
			urdma_warn("can't listen in %s: %s; shared memory is "
				   "off for this context", urdma_proc.dir,
				   strerror(-ret));
			hc->lfd = -1;
		}
	}
	if (hc->lfd < 0) {
		/* Named nowhere: any id but 0 and 1 does. */
		uctx->ctx_id = (urdma_random32() & 0x7fffffff) | 2;
	}
	hc->ctx_id = uctx->ctx_id;
	*uctx->shm = (struct urdma_shm_ctx){ .version = URDMA_SHM_VERSION,
					     .ctx_id = uctx->ctx_id };
	__atomic_store_n(&uctx->shm->magic, URDMA_SHM_MAGIC, __ATOMIC_RELEASE);
	uctx->host = hc;
	pthread_mutex_lock(&urdma_proc.lock);
	list_add_tail(&hc->node, &hctxs);
	pthread_mutex_unlock(&urdma_proc.lock);
	return 0;

err_free:
	pthread_mutex_destroy(&hc->lock);
	urdma_free(hc);
	return ret;
}

/* Called once the progress thread runs (urdma_progress_add_ctx). */
int urdma_host_ctx_start(struct urdma_context *uctx)
{
	struct urdma_host_ctx *hc = uctx->host;

	if (hc->lfd < 0)
		return 0;
	return urdma_progress_watch(hc->lfd, URDMA_WATCH_FN, &hc->w);
}

void urdma_host_ctx_close(struct urdma_context *uctx)
{
	struct urdma_host_ctx *hc = uctx->host;
	struct guest *g, *n;
	char name[64];

	if (!hc)
		return;
	pthread_mutex_lock(&urdma_proc.lock);
	list_del(&hc->node);
	urdma_peer_own_closed(hc->ctx_id);
	pthread_mutex_unlock(&urdma_proc.lock);
	if (hc->lfd >= 0) {
		snprintf(name, sizeof(name), "ctx-%x", hc->ctx_id);
		unlinkat(urdma_proc.dirfd, name, 0);
	}
	pthread_mutex_lock(&hc->lock);
	hc->closed = true;
	list_for_each_entry_safe(g, n, &hc->guests, node)
		guest_drop(g);
	pthread_mutex_unlock(&hc->lock);
	close(hc->mrs_fd);
	munmap(uctx->shm, sizeof(*uctx->shm));
	uctx->shm = NULL;
	uctx->host = NULL;
	urdma_progress_retire(hc->lfd, &hc->w);
}

/* ---- sweeping ---- */

int urdma_host_ctx_connect(uint32_t ctx_id)
{
	struct sockaddr_un sa;
	char name[64];
	struct stat st;
	int fd;

	snprintf(name, sizeof(name), "ctx-%x", ctx_id);
	if (fstatat(urdma_proc.dirfd, name, &st, AT_SYMLINK_NOFOLLOW))
		return -errno;
	if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
		return -EPERM;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, host_sun(&sa, name))) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

/* Does anyone listen on ctx-<id>?  -1: no, certainly (stale); 0: yes, or
 * it can't be told. */
static int ctx_alive(uint32_t ctx_id)
{
	int fd = urdma_host_ctx_connect(ctx_id);

	if (fd >= 0)
		close(fd);
	return fd == -ENOENT || fd == -ECONNREFUSED ? -1 : 0;
}

int urdma_host_rec_live(const char *kind, uint32_t num,
			struct urdma_qp_rec *rec)
{
	int ret = urdma_host_rec_find(kind, num, rec);

	if (ret == -EINVAL)
		return -ESTALE;
	if (ret)
		return ret;
	/* A context we hold a live connection to, or one of our own, needs
	 * no knock on its socket (which wakes its process). */
	if (urdma_peer_known(rec->ctx_id))
		return 0;
	return ctx_alive(rec->ctx_id) < 0 ? -ESTALE : 0;
}

bool urdma_host_rec_stale(const char *kind, uint32_t num)
{
	return urdma_host_rec_live(kind, num, &(struct urdma_qp_rec){ 0 }) ==
	       -ESTALE;
}

DIR *urdma_host_opendir(void)
{
	/* (its own open file: a dup would share the directory's offset) */
	int fd = urdma_host_shm_ok() ?
			 openat(urdma_proc.dirfd, ".",
				O_RDONLY | O_DIRECTORY | O_CLOEXEC) :
			 -1;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d && fd >= 0)
		close(fd);
	return d;
}

/* Remove what processes left behind: sockets nobody listens on, records
 * of those contexts, temporary names older than a minute.  Only names of
 * ours; anything else there is left alone. */
void urdma_host_sweep(void)
{
	DIR *d = urdma_host_opendir();
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		unsigned int id;
		unsigned long long xid;
		char tail[2];
		struct stat st;
		bool stale = false;

		if (fstatat(urdma_proc.dirfd, e->d_name, &st,
			    AT_SYMLINK_NOFOLLOW) ||
		    st.st_uid != geteuid())
			continue;
		if (sscanf(e->d_name, "ctx-%x%1s", &id, tail) == 1)
			stale = S_ISSOCK(st.st_mode) && ctx_alive(id) < 0;
		else if (sscanf(e->d_name, "qp-%x%1s", &id, tail) == 1)
			stale = S_ISREG(st.st_mode) &&
				urdma_host_rec_stale("qp", id);
		else if (sscanf(e->d_name, "srq-%x%1s", &id, tail) == 1)
			stale = S_ISREG(st.st_mode) &&
				urdma_host_rec_stale("srq", id);
		else if (!strncmp(e->d_name, "mcg-", 4) &&
			 strlen(e->d_name) > 37 && e->d_name[36] == '-' &&
			 sscanf(e->d_name + 37, "%x%1s", &id, tail) == 1) {
			char kind[37];

			memcpy(kind, e->d_name, 36); /* mcg-<32 hex> */
			kind[36] = 0;
			stale = S_ISREG(st.st_mode) &&
				urdma_host_rec_stale(kind, id);
		}
		else if (!strncmp(e->d_name, "tmp-", 4))
			stale = time(NULL) - st.st_mtime > 60;
		else if (sscanf(e->d_name, "xrcd-%16llx%1s", &xid, tail) == 1 &&
			 S_ISREG(st.st_mode)) {
			/* An XRC domain nobody holds: as its last closer (a
			 * name of ours, exactly as xrc.c writes it). */
			char canon[40];
			int fd;

			snprintf(canon, sizeof(canon), "xrcd-%016llx", xid);
			if (strcmp(canon, e->d_name))
				continue;
			fd = host_open_file(e->d_name, O_RDONLY, &st);
			if (fd >= 0)
				urdma_xrcd_let_go(fd, xid);
			continue;
		}
		if (!stale)
			continue;
		urdma_dbg("removing stale %s/%s", urdma_proc.dir, e->d_name);
		unlinkat(urdma_proc.dirfd, e->d_name, 0);
	}
	closedir(d);
}

/* The MR table of our own context ctx_id, or -1 (under urdma_proc.lock). */
int urdma_host_own_mrs(uint32_t ctx_id)
{
	struct urdma_host_ctx *hc;

	list_for_each_entry(hc, &hctxs, node)
		if (hc->ctx_id == ctx_id)
			return hc->mrs_fd;
	return -1;
}
