// SPDX-License-Identifier: MIT
/*
 * The host: the directory of shared objects and the peers (other urdma
 * contexts on this host) we talk to.  Registered memory and the window
 * tables through which peers are reached: core/backing.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"


struct urdma_peer {
	struct list_head node;
	uint32_t ctx_id;
	pid_t pid;
	int refcnt;
	int pidfd;
	int memfd;
	int wake_fd;
	_Atomic bool dead;
	struct urdma_shm_ctx *shm;
	pthread_mutex_t lock;
	struct urdma_wintab win;
};

struct urdma_proc urdma_proc = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.contexts = LIST_HEAD_INIT(urdma_proc.contexts),
	.memfd = -1,
};

static struct list_head peers = LIST_HEAD_INIT(peers);
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static int host_err;

uint64_t urdma_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}



/* Contexts, peers and the progress thread belong to the parent. */
static void host_atfork_child(void)
{
	list_init(&urdma_proc.contexts);
	list_init(&peers);
	pthread_mutex_init(&urdma_proc.lock, NULL);
}

static void host_setup(void)
{
	const char *dir = getenv("URDMA_SHM_DIR");

	urdma_log_init();
	snprintf(urdma_proc.dir, sizeof(urdma_proc.dir), "%s",
		 dir && *dir ? dir : "/dev/shm/urdma");
	if (mkdir(urdma_proc.dir, 01777) == 0)
		chmod(urdma_proc.dir, 01777); /* umask must not narrow it */
	else if (errno != EEXIST) {
		urdma_err("can't create %s: %m", urdma_proc.dir);
		host_err = errno;
		return;
	}
	pthread_atfork(NULL, NULL, urdma_backing_atfork_child);
	pthread_atfork(NULL, NULL, host_atfork_child);
}

int urdma_host_init(void)
{
	pthread_once(&host_once, host_setup);
	return host_err;
}

static void host_path(char *buf, size_t len, const char *prefix, uint32_t id)
{
	snprintf(buf, len, "%s/%s-%x", urdma_proc.dir, prefix, id);
}

/* The owner pid of an object file, 0 if unknown yet. */
static pid_t file_owner(const char *path, const char *prefix)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	union {
		struct urdma_shm_qp qp;
		struct {
			uint32_t magic, version, ctx_id;
			int32_t pid;
		} ctx;
	} u;
	ssize_t n;

	if (fd < 0)
		return 0;
	n = pread(fd, &u, sizeof(u), 0);
	close(fd);
	if (n < 32)
		return 0;
	if (!strcmp(prefix, "qp"))
		return u.qp.magic == URDMA_SHM_MAGIC ? u.qp.pid : 0;
	return u.ctx.magic == URDMA_SHM_MAGIC ? u.ctx.pid : 0;
}

static bool pid_dead(pid_t pid)
{
	return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH;
}

static bool file_stale(const char *path, const char *prefix)
{
	struct stat st;
	pid_t pid = file_owner(path, prefix);

	if (pid)
		return pid_dead(pid);
	/* Never initialised: stale once it is old. */
	return stat(path, &st) == 0 && time(NULL) - st.st_mtime > 60;
}

int urdma_host_create(const char *prefix, uint32_t *id, uint32_t id_mask,
		      size_t size, void **map)
{
	char path[300];
	int fd = -1;

	/* id_mask 0: exactly *id, once. */
	for (int tries = 0; tries < (id_mask ? 1000 : 1); tries++) {
		uint32_t r = *id;

		if (id_mask && getrandom(&r, sizeof(r), 0) != sizeof(r))
			r = (uint32_t)urdma_now_ns() * 2654435761u;
		if (id_mask)
			r &= id_mask;
		if (r < 2)
			continue;
		host_path(path, sizeof(path), prefix, r);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0) {
			*id = r;
			break;
		}
		if (errno != EEXIST)
			return -errno;
		if (file_stale(path, prefix)) {
			urdma_dbg("removing stale %s", path);
			unlink(path);
		}
	}
	if (fd < 0)
		return -EAGAIN;
	if (ftruncate(fd, size) < 0)
		goto err_unlink;
	*map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED)
		goto err_unlink;
	close(fd);
	return 0;

err_unlink: {
	int err = errno;

	unlink(path);
	close(fd);
	return -err;
}
}

void urdma_host_remove(const char *prefix, uint32_t id, void *map,
		       size_t size)
{
	char path[300];

	host_path(path, sizeof(path), prefix, id);
	unlink(path);
	if (map)
		munmap(map, size);
}

void *urdma_host_open(const char *prefix, uint32_t id, size_t *size)
{
	char path[300];
	struct stat st;
	void *map;
	int fd;

	host_path(path, sizeof(path), prefix, id);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || st.st_size < 64) {
		close(fd);
		errno = ENOENT;
		return NULL;
	}
	map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		   0);
	close(fd);
	if (map == MAP_FAILED)
		return NULL;
	*size = st.st_size;
	return map;
}

/* Remove the objects of processes that died without cleaning up. */
void urdma_host_sweep(void)
{
	DIR *d = opendir(urdma_proc.dir);
	struct dirent *e;
	char path[600];

	while (d && (e = readdir(d))) {
		const char *prefix;
		unsigned int id;
		char tail[8] = "";

		if (sscanf(e->d_name, "ctx-%x%7s", &id, tail) >= 1)
			prefix = "ctx";
		else if (sscanf(e->d_name, "qp-%x", &id) == 1)
			prefix = "qp";
		else
			continue;
		if (tail[0])
			continue; /* the .wake FIFO goes with its ctx */
		snprintf(path, sizeof(path), "%s/%s", urdma_proc.dir,
			 e->d_name);
		if (!file_stale(path, prefix))
			continue;
		urdma_dbg("removing stale %s", path);
		unlink(path);
		if (prefix[0] == 'c') {
			snprintf(path, sizeof(path), "%s/%s.wake",
				 urdma_proc.dir, e->d_name);
			unlink(path);
		}
	}
	if (d)
		closedir(d);
}



/* ---- peers ---- */

static int peer_open_memfd(struct urdma_peer *p)
{
	char path[64];
	struct stat st;
	int fd;

	if (p->memfd >= 0)
		return 0;
	if (p->shm->memfd < 0)
		return -ENOENT;
	if (p->pid == getpid()) {
		fd = dup(p->shm->memfd);
	} else {
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", p->pid,
			 p->shm->memfd);
		fd = open(path, O_RDWR | O_CLOEXEC);
	}
	if (fd < 0) {
		urdma_warn("can't open the memory of process %d: %m", p->pid);
		return -errno;
	}
	if (fstat(fd, &st) < 0 || st.st_ino != p->shm->memfd_ino) {
		urdma_warn("process %d: memfd changed under us", p->pid);
		close(fd);
		return -ESTALE;
	}
	p->memfd = fd;
	return 0;
}

static void peer_free(struct urdma_peer *p)
{
	if (p->pidfd >= 0) {
		urdma_progress_unwatch(p->pidfd);
		close(p->pidfd);
	}
	urdma_wintab_release(&p->win);
	if (p->memfd >= 0)
		close(p->memfd);
	if (p->wake_fd >= 0)
		close(p->wake_fd);
	if (p->shm)
		munmap(p->shm, sizeof(*p->shm));
	pthread_mutex_destroy(&p->lock);
	urdma_free(p);
}

struct urdma_peer *urdma_peer_get(uint32_t ctx_id, int32_t pid)
{
	struct urdma_peer *p;
	size_t size;

	pthread_mutex_lock(&urdma_proc.lock);
	list_for_each_entry(p, &peers, node) {
		if (p->ctx_id == ctx_id && p->pid == pid && !p->dead) {
			p->refcnt++;
			pthread_mutex_unlock(&urdma_proc.lock);
			return p;
		}
	}
	p = urdma_zalloc(sizeof(*p));
	if (!p)
		goto err_unlock;
	p->ctx_id = ctx_id;
	p->pid = pid;
	p->refcnt = 1;
	p->pidfd = p->memfd = p->wake_fd = -1;
	pthread_mutex_init(&p->lock, NULL);
	p->shm = urdma_host_open("ctx", ctx_id, &size);
	if (!p->shm || size != sizeof(*p->shm) ||
	    p->shm->magic != URDMA_SHM_MAGIC ||
	    p->shm->version != URDMA_SHM_VERSION || p->shm->pid != pid) {
		if (p->shm && size != sizeof(*p->shm)) {
			munmap(p->shm, size);
			p->shm = NULL;
		}
		urdma_warn("peer context %x of process %d is not usable",
			   ctx_id, pid);
		errno = ENOENT;
		goto err_free;
	}
	p->pidfd = syscall(SYS_pidfd_open, pid, 0);
	if (p->pidfd < 0 || pid_dead(pid)) {
		urdma_warn("peer process %d is gone", pid);
		errno = ESRCH;
		goto err_free;
	}
	list_add_tail(&p->node, &peers);
	pthread_mutex_unlock(&urdma_proc.lock);
	if (pid != getpid())
		urdma_progress_watch(p->pidfd, URDMA_WATCH_PEER, p);
	return p;

err_free:
	peer_free(p);
err_unlock:
	pthread_mutex_unlock(&urdma_proc.lock);
	return NULL;
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
	if (last)
		peer_free(p);
}

bool urdma_peer_dead(struct urdma_peer *p)
{
	return atomic_load_explicit(&p->dead, memory_order_relaxed);
}

void urdma_peer_mark_dead(struct urdma_peer *p)
{
	atomic_store(&p->dead, true);
}

int urdma_peer_wake(struct urdma_peer *p)
{
	char c = 0, path[300];
	int fd = __atomic_load_n(&p->wake_fd, __ATOMIC_ACQUIRE);

	if (fd < 0) {
		snprintf(path, sizeof(path), "%s/ctx-%x.wake", urdma_proc.dir,
			 p->ctx_id);
		/* Read-write: with a reader of our own the FIFO never
		 * raises SIGPIPE (nor EPIPE) once its owner has died; what
		 * we write then fills it, and EAGAIN follows. */
		fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		int expected = -1;
		if (!__atomic_compare_exchange_n(&p->wake_fd, &expected, fd,
						 false, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE)) {
			close(fd);
			fd = expected;
		}
	}
	/* EAGAIN: the FIFO is full, so a wake-up is pending anyway. */
	if (write(fd, &c, 1) < 0 && errno != EAGAIN)
		return -errno;
	return 0;
}

int urdma_mr_lookup(const struct urdma_shm_ctx *shm, uint32_t key,
		    uint64_t addr, uint64_t len, uint32_t access, uint32_t pd_id,
		    uint64_t *va)
{
	const struct urdma_shm_mr *e = &shm->mr[URDMA_MR_IDX(key)];
	uint64_t iova, length, base;
	uint32_t acc, pd;

	if (!key || atomic_load_explicit(&e->key, memory_order_acquire) != key)
		return -EINVAL;
	iova = e->iova;
	length = e->length;
	base = e->va;
	acc = e->access;
	pd = e->pd_id;
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&e->key, memory_order_relaxed) != key)
		return -EINVAL;
	if (pd != pd_id || (acc & access) != access)
		return -EACCES;
	if (atomic_load_explicit(&e->flags, memory_order_relaxed) &
	    URDMA_MR_F_UNMAPPED)
		return -EFAULT;
	if (addr < iova || len > length || addr - iova > length - len)
		return -ERANGE;
	*va = base + (addr - iova);
	return 0;
}

const struct urdma_shm_ctx *urdma_peer_shm(struct urdma_peer *p)
{
	return p->shm;
}

void *urdma_peer_ptr(struct urdma_peer *p, uint64_t va, uint64_t *avail)
{
	if (p->memfd < 0) {
		pthread_mutex_lock(&p->lock);
		peer_open_memfd(p);
		pthread_mutex_unlock(&p->lock);
	}
	return urdma_wintab_ptr(&p->win, &p->lock, p->memfd, va, avail);
}

int urdma_peer_pidfd(struct urdma_peer *p)
{
	return p->pidfd;
}
