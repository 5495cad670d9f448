// SPDX-License-Identifier: MIT
/*
 * Registered memory: this process's identity memfd, the backing of
 * registered pages, the window tables through which the library reaches
 * backed pages (its own and its peers'), and the fork handler.
 *
 * Registered pages are "backed": their private anonymous (or private file)
 * mapping is replaced, in place and with the same contents and protection,
 * by a MAP_SHARED mapping of the identity memfd at file offset == virtual
 * address.  A peer maps the memfd in 1 GiB windows and reaches any backed
 * page of ours through them.  Windows are never unmapped while the peer is
 * known, so a pointer into one stays valid for the whole of an operation.
 *
 * Memory that can't be moved stays where it is and its MR is "direct"
 * (URDMA_MR_F_DIRECT): a shared mapping of another object (a file, SysV
 * or POSIX shared memory, MAP_SHARED|MAP_ANONYMOUS, which other processes
 * may map too), hugetlb pages (which can't be split), or pages a thread
 * of the process may be storing into while they would move (it could not
 * be stopped, or woke meanwhile).  The owner reaches such an MR at its
 * address; a peer with a system call per piece (transport.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"
#include "util/rawmm.h"

static struct urdma_wintab self_win;

void urdma_wintab_release(struct urdma_wintab *t)
{
	for (unsigned int i = 0; i < URDMA_WIN_L1_COUNT; i++) {
		if (!t->l1[i])
			continue;
		for (unsigned int j = 0; j < URDMA_WIN_L2_COUNT; j++)
			if (t->l1[i][j])
				munmap(t->l1[i][j], URDMA_WIN_SIZE);
		urdma_free(t->l1[i]);
		t->l1[i] = NULL;
	}
}

/*
 * A new window maps, in one call, the pages its memfd holds (the owner's
 * registered pages that exist): a first touch of each would otherwise
 * fault, and a NIC's translation of registered memory is ready at
 * registration.  Measured: Open MPI over UCX, whose 4,095 receive buffers
 * a rank reaches a page each at a time, took 3 us per message for its
 * first 4,000 messages and 0.5 us after.  Holes stay holes (no memory
 * taken), pages the owner adds later fault on first touch, and at most
 * WIN_PREFAULT_MAX is mapped so that a peer's huge region costs no long
 * stall in the operation that first reaches it.
 */
#define WIN_PREFAULT_MAX (64ull << 20)
static void window_prefault(uint8_t *base, int memfd, uint64_t start)
{
	uint64_t at = start, end = start + URDMA_WIN_SIZE, left = WIN_PREFAULT_MAX;

	while (at < end && left) {
		off_t d = lseek(memfd, (off_t)at, SEEK_DATA);
		off_t h = d < 0 ? -1 : lseek(memfd, d, SEEK_HOLE);
		uint64_t e, len;

		if (d < 0 || (uint64_t)d >= end || h < 0)
			break;
		e = (uint64_t)h > end ? end : (uint64_t)h;
		len = e - (uint64_t)d < left ? e - (uint64_t)d : left;
		if (madvise(base + ((uint64_t)d - start), len,
			    MADV_POPULATE_WRITE))
			break; /* (before Linux 5.14: faults as they come) */
		left -= len;
		at = e;
	}
}

/* Returns the window that holds va, mapping it if needed (under lock). */
static uint8_t *wintab_get(struct urdma_wintab *t, pthread_mutex_t *lock,
			   int memfd, uint64_t va)
{
	uint64_t w = va >> URDMA_WIN_SHIFT;
	unsigned int i = w >> URDMA_WIN_L2_BITS, j = w & (URDMA_WIN_L2_COUNT - 1);
	_Atomic(uint8_t *) *l2;
	uint8_t *base;

	if (va >> URDMA_VA_BITS)
		return NULL;
	l2 = __atomic_load_n(&t->l1[i], __ATOMIC_ACQUIRE);
	if (l2) {
		base = atomic_load_explicit(&l2[j], memory_order_acquire);
		if (base)
			return base;
	}
	if (memfd < 0)
		return NULL;
	pthread_mutex_lock(lock);
	l2 = t->l1[i];
	if (!l2) {
		l2 = urdma_zalloc_array(URDMA_WIN_L2_COUNT, sizeof(*l2));
		if (!l2)
			goto out_unlock;
		__atomic_store_n(&t->l1[i], l2, __ATOMIC_RELEASE);
	}
	base = atomic_load(&l2[j]);
	if (!base) {
		base = mmap(NULL, URDMA_WIN_SIZE, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_NORESERVE, memfd, w << URDMA_WIN_SHIFT);
		if (base == MAP_FAILED) {
			urdma_warn("mapping a window of memfd %d failed: %m",
				   memfd);
			base = NULL;
			goto out_unlock;
		}
		window_prefault(base, memfd, w << URDMA_WIN_SHIFT);
		atomic_store_explicit(&l2[j], base, memory_order_release);
	}
	pthread_mutex_unlock(lock);
	return base;
out_unlock:
	pthread_mutex_unlock(lock);
	return NULL;
}

void *urdma_wintab_ptr(struct urdma_wintab *t, pthread_mutex_t *lock,
			int memfd, uint64_t va, uint64_t *avail)
{
	uint8_t *base = wintab_get(t, lock, memfd, va);

	if (!base)
		return NULL;
	*avail = URDMA_WIN_SIZE - (va & (URDMA_WIN_SIZE - 1));
	return base + (va & (URDMA_WIN_SIZE - 1));
}

static int memfd_create_locked(void)
{
	struct stat st;
	int fd;

	if (urdma_proc.memfd >= 0)
		return 0;
	fd = memfd_create("urdma", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* Peers map it (core/peer.c): sealed, nobody can shrink it under
	 * their mappings (a SIGBUS), nor seal it against our own use. */
	if (ftruncate(fd, 1ULL << URDMA_VA_BITS) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
	    fstat(fd, &st) < 0) {
		int err = errno;

		close(fd);
		return -err;
	}
	urdma_proc.memfd_ino = st.st_ino;
	urdma_proc.memfd = fd;
	return 0;
}

/* The identity memfd, created on first use; -errno if it can't be. */
int urdma_memfd(void)
{
	int ret;

	pthread_mutex_lock(&urdma_proc.lock);
	ret = memfd_create_locked();
	if (!ret)
		ret = urdma_proc.memfd;
	pthread_mutex_unlock(&urdma_proc.lock);
	return ret;
}

struct vma {
	uint64_t start, end, off, ino;
	char perms[5];
	bool huge; /* hugetlb pages */
};

static int prot_of(const char *perms)
{
	return (perms[0] == 'r' ? PROT_READ : 0) |
	       (perms[1] == 'w' ? PROT_WRITE : 0) |
	       (perms[2] == 'x' ? PROT_EXEC : 0);
}

/* /proc/self/maps and the mappings read from it, in memory mapped for
 * them and kept from call to call (under urdma_proc.lock; a forked child
 * has its own copy): no malloc, as other threads may be stopped holding
 * its lock, and no page faults on a fresh buffer each time. */
static struct {
	char *buf;
	size_t cap;
	struct vma *v;
	size_t vcap; /* bytes */
} maps;

/* Room for at least need bytes at *p (mmap, then mremap). */
static int grow_to(void **p, size_t *cap, size_t need)
{
	size_t want = *cap ? *cap : 64 * 1024;
	void *m;

	if (need <= *cap)
		return 0;
	while (want < need)
		want *= 2;
	m = *p ? raw_mremap(*p, *cap, want, MREMAP_MAYMOVE, NULL)
	       : raw_mmap(NULL, want, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	*p = m;
	*cap = want;
	return 0;
}

/* A backing job: the range, whether it must be writable, the mappings
 * over it (maps.v[0..nv)), and what went wrong, kept for the log written
 * after. */
struct back_job {
	uint64_t start, end;
	bool write;
	int nv;
	uint64_t bad_start, bad_end;
	const char *why; /* the range stays direct: why */
};

static uint64_t hex_at(const char **p)
{
	uint64_t x = 0;

	for (;; (*p)++) {
		char c = **p;

		if (c >= '0' && c <= '9')
			x = x << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			x = x << 4 | (uint64_t)(c - 'a' + 10);
		else
			return x;
	}
}

static void skip_field(const char **p)
{
	while (**p && **p != ' ' && **p != '\n')
		(*p)++;
	while (**p == ' ')
		(*p)++;
}

/* Is the mapping of path (len bytes, not NUL-terminated, on a device of
 * major 0 if anon_dev) made of hugetlb pages? */
static bool path_is_huge(const char *path, size_t len, bool anon_dev)
{
	static const char anon[] = "/anon_hugepage";
	char buf[256];
	struct statfs sf;

	if (len >= sizeof(anon) - 1 && !memcmp(path, anon, sizeof(anon) - 1))
		return true;
	/* A file of a hugetlbfs (SysV SHM_HUGETLB shows as /SYSV...). */
	if (!anon_dev || !len || path[0] != '/' || len >= sizeof(buf))
		return false;
	memcpy(buf, path, len);
	buf[len] = 0;
	return !statfs(buf, &sf) && sf.f_type == HUGETLBFS_MAGIC;
}

/* The mappings over [start, end), from /proc/self/maps, into maps.v:
 * how many, or -errno. */
static int maps_read(struct back_job *j)
{
	const char *p, *e;
	size_t len = 0;
	int fd, nv = 0;
	ssize_t n;

	fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	do {
		if (grow_to((void **)&maps.buf, &maps.cap, len + 4096)) {
			close(fd);
			return -ENOMEM;
		}
		n = read(fd, maps.buf + len, maps.cap - len);
		len += n > 0 ? (size_t)n : 0;
	} while (n > 0);
	close(fd);
	if (n < 0)
		return -errno;
	for (p = maps.buf, e = maps.buf + len; p < e;) {
		struct vma x = { 0 };
		const char *q, *path;
		bool anon_dev;

		x.start = hex_at(&p);
		p++; /* '-' */
		x.end = hex_at(&p);
		p++;
		memcpy(x.perms, p, 4);
		skip_field(&p);
		x.off = hex_at(&p);
		p++;
		anon_dev = p[0] == '0' && p[1] == '0' && p[2] == ':';
		skip_field(&p); /* device */
		for (q = p; *q >= '0' && *q <= '9'; q++)
			x.ino = x.ino * 10 + (uint64_t)(*q - '0');
		skip_field(&p); /* inode */
		path = p;
		while (p < e && *p != '\n')
			p++;
		if (x.end <= j->start || x.start >= j->end) {
			p++;
			continue;
		}
		x.huge = path_is_huge(path, (size_t)(p - path), anon_dev);
		p++;
		if (grow_to((void **)&maps.v, &maps.vcap, (nv + 1) * sizeof(x)))
			return -ENOMEM;
		maps.v[nv++] = x;
	}
	return nv;
}

static bool backed(const struct vma *v)
{
	return v->ino == urdma_proc.memfd_ino && v->off == v->start;
}

/* Read the mappings and check them: no hole, readable (and writable if
 * asked).  How many are not backed yet (j->nv mappings read), BACK_DIRECT
 * if one can't be, or -errno. */
#define BACK_DIRECT (-EXDEV)
static int back_plan(struct back_job *j)
{
	uint64_t cur = j->start;
	int todo = 0;

	j->nv = maps_read(j);
	if (j->nv < 0)
		return j->nv;
	for (int i = 0; i < j->nv; i++) {
		const struct vma *v = &maps.v[i];

		if (v->start > cur || v->perms[0] != 'r' ||
		    (j->write && v->perms[1] != 'w'))
			return -EFAULT;
		cur = v->end;
		if (backed(v))
			continue;
		if (v->perms[3] != 'p' || v->huge) {
			j->why = v->huge ? "hugetlb pages" :
					   "a shared mapping";
			todo = BACK_DIRECT;
		} else if (todo >= 0) {
			todo++;
		}
	}
	return cur < j->end ? -EFAULT : todo;
}

/*
 * Back [start, end) with the identity memfd: private mappings are copied
 * into the memfd and replaced in place; pages already backed are left
 * alone.  Runs with every other thread stopped (urdma_stop_world): nothing
 * can store into a page between its copy and its mapping, and the mappings
 * read are still the mappings.  No malloc, no log, no hookable call
 * (util/rawmm.h: ucx_perftest's server hung in UCX's mmap hook, whose
 * lock our stopped progress thread held, in ucm's munmap handler) here.
 */
static int back_job_run(void *arg)
{
	struct back_job *j = arg;
	int nv, todo = back_plan(j);

	if (todo <= 0)
		return todo;
	nv = j->nv;
	for (int i = 0; i < nv; i++) {
		uint64_t s = maps.v[i].start < j->start ? j->start : maps.v[i].start;
		uint64_t e = maps.v[i].end > j->end ? j->end : maps.v[i].end;

		if (backed(&maps.v[i]))
			continue;
		for (uint64_t done = 0; done < e - s;) {
			/* The raw syscall: whole pages are copied, including
			 * bytes a sanitizer's pwrite() would call redzones. */
			ssize_t n = syscall(SYS_pwrite64, urdma_proc.memfd,
					    (void *)(s + done), e - s - done,
					    s + done);
			if (n <= 0)
				return n < 0 ? -errno : -EIO;
			done += (uint64_t)n;
		}
		/* A thread left asleep that woke may have stored into the
		 * pages since they were copied: leave them where they are. */
		if (!urdma_stop_intact()) {
			fallocate(urdma_proc.memfd,
				  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  (off_t)s, (off_t)(e - s));
			j->why = "a thread woke while its pages were moved";
			return BACK_DIRECT;
		}
		if (raw_mmap((void *)s, e - s, prot_of(maps.v[i].perms),
			     MAP_SHARED | MAP_FIXED, urdma_proc.memfd,
			     (off_t)s) == MAP_FAILED) {
			j->bad_start = s;
			j->bad_end = e;
			return -errno;
		}
	}
	return 0;
}

/* Moved 16 MiB at a time: about 10 ms of copying here. */
#define BACK_PIECE (16ull << 20)

/* Back [start, start+len) (page aligned).  Under urdma_proc.lock. */
static int back_range_locked(uint64_t start, uint64_t len, bool write)
{
	struct back_job j = { .start = start, .end = start + len,
			      .write = write };
	int ret = memfd_create_locked(), todo;

	/* Pages already backed (an MR over the same buffer, a registration
	 * cache's hit) need no stop; the rest is planned again with the
	 * world stopped, as mappings may change. */
	todo = ret ? ret : back_plan(&j);
	ret = todo < 0 ? todo : 0;
	/* In pieces: a thread left asleep that wakes meanwhile runs
	 * unstopped (core/stop.c), so the stops are kept short. */
	for (uint64_t s = start; todo > 0 && !ret && s < start + len;
	     s += BACK_PIECE) {
		j.start = s;
		j.end = s + BACK_PIECE < start + len ? s + BACK_PIECE
						     : start + len;
		ret = urdma_stop_world(back_job_run, &j);
	}
	if (ret == -EAGAIN) {
		j.why = "a thread of the process can't be stopped (see above)";
		ret = BACK_DIRECT;
	}
	if (ret == BACK_DIRECT) {
		urdma_info("[%#" PRIx64 ", %#" PRIx64 ") stays in place (%s): "
			   "local peers reach it with a system call per "
			   "access", start, start + len, j.why);
		return 1;
	}
	if (ret && ret != -EFAULT) /* (the piece that failed, if one did) */
		urdma_err("backing [%#" PRIx64 ", %#" PRIx64 ") failed: %s",
			  j.bad_end ? j.bad_start : start,
			  j.bad_end ? j.bad_end : start + len, strerror(-ret));
	return ret;
}

int urdma_host_back_range(uint64_t start, uint64_t len, bool write)
{
	int ret;

	pthread_mutex_lock(&urdma_proc.lock);
	ret = back_range_locked(start, len, write);
	pthread_mutex_unlock(&urdma_proc.lock);
	return ret;
}

/* A private copy of the backed pages [v->start, v->end), in place: the
 * memfd's data read into fresh anonymous memory (holes stay untouched, so
 * cost nothing), which then replaces the mapping. */
static void unback(const struct vma *v)
{
	const uint64_t huge = 2ull << 20;
	uint64_t len = v->end - v->start, at = v->start, room, shift;
	char *tmp, *m;

	/* Aligned as the pages are (mod 2 MiB), so huge pages can hold the
	 * copy and stay huge where mremap puts them: a fault per 2 MiB. */
	room = len >= huge ? len + huge : len;
	m = raw_mmap(NULL, room, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return; /* left shared: nothing better to do in a child */
	shift = (v->start - (uint64_t)(uintptr_t)m) & (room > len ? huge - 1 : 0);
	tmp = m + shift;
	if (shift)
		raw_munmap(m, shift);
	if (room - shift > len)
		raw_munmap(tmp + len, room - shift - len);
	if (room > len)
		raw_madvise(tmp, len, MADV_HUGEPAGE);
	while (at < v->end) {
		off_t d = lseek(urdma_proc.memfd, (off_t)at, SEEK_DATA);
		off_t h = d < 0 ? -1 : lseek(urdma_proc.memfd, d, SEEK_HOLE);
		uint64_t e;

		if (d < 0 || (uint64_t)d >= v->end)
			break;
		e = h < 0 || (uint64_t)h > v->end ? v->end : (uint64_t)h;
		/* Populated in bulk, not a fault per page. */
		raw_madvise((char *)tmp + (d - v->start), e - (uint64_t)d,
			    MADV_POPULATE_WRITE);
		for (uint64_t got = (uint64_t)d; got < e;) {
			ssize_t r = pread(urdma_proc.memfd,
					  (char *)tmp + (got - v->start),
					  e - got, (off_t)got);

			if (r <= 0) {
				memcpy((char *)tmp + (got - v->start),
				       (void *)got, e - got);
				break;
			}
			got += (uint64_t)r;
		}
		at = e;
	}
	mprotect(tmp, len, prot_of(v->perms));
	raw_mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
		   (void *)v->start);
}

/*
 * In a forked child, backed pages would stay shared with the parent: give
 * the child private copies (what fork promises) and drop the windows and
 * the arena's chunks.  The first fork handler to run, and it does not
 * allocate: until the copies are made, a store to the heap would be the
 * parent's.  The child is single-threaded here.
 */
static void backing_atfork_child(void)
{
	struct back_job j = { .start = 0, .end = UINT64_MAX };
	int nv;

	urdma_arena_atfork_child();
	if (urdma_proc.memfd < 0)
		return;
	nv = maps_read(&j);
	for (int i = 0; i < nv; i++) {
		if (maps.v[i].ino != urdma_proc.memfd_ino)
			continue;
		if (backed(&maps.v[i]) && maps.v[i].perms[0] == 'r')
			unback(&maps.v[i]);
		else /* our own window */
			raw_munmap((void *)maps.v[i].start,
				   maps.v[i].end - maps.v[i].start);
	}
	close(urdma_proc.memfd);
	urdma_proc.memfd = -1;
	urdma_proc.memfd_ino = 0;
	memset(&self_win, 0, sizeof(self_win));
}

__attribute__((constructor(101))) static void backing_init(void)
{
	pthread_atfork(NULL, NULL, backing_atfork_child);
}

void *urdma_self_ptr(uint64_t va, uint64_t *avail)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

	return urdma_wintab_ptr(&self_win, &lock, urdma_proc.memfd, va, avail);
}
